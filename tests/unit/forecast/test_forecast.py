"""The forecast's cost model, acceptance sources, bad inputs, CLI and the report's forecast section."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.cli import run
from pipeline.config import load_config
from pipeline.facts.model_shapes import KNOWN_MODELS
from pipeline.forecast import acceptance as acc
from pipeline.forecast.cpu import CALIBRATION_SCHEMA, CpuDevice, calibration_key, store, stored_device
from pipeline.forecast.figures import ForecastInputError, engine_figures, gpu_figures
from pipeline.forecast.model import checkpoint_shape, config_inputs, crossover, forecast, speedup_at, step_times
from pipeline.forecast.proposers import PLANS, PROPOSER_COSTS
from pipeline.forecast.roofline import GpuDevice, model_cost
from pipeline.report.forecast_check import forecast_section

ROOT = Path(__file__).resolve().parents[3]
DRAFT_CFG = ROOT / "configs" / "llama31-8b-draft1b-fp8-h100.yaml"
EAGLE3_CFG = ROOT / "configs" / "llama31-8b-eagle3-llmapi-h100.yaml"


def test_tau_iid_and_its_inverse():
    assert acc.tau_iid(0.7, 3) == pytest.approx((1 - 0.7**4) / 0.3)
    assert acc.tau_iid(1.0, 4) == 5.0
    assert acc.tau_iid(0.0, 4) == 1.0
    assert acc.alpha_for_tau(acc.tau_iid(0.62, 5), 5) == pytest.approx(0.62, abs=1e-6)
    assert acc.tau_positions([0.8, 0.6, 0.3]) == pytest.approx(2.7)


def test_roofline_regime_moves_from_memory_to_compute_with_rows():
    device = GpuDevice(gpu_figures("h100-sxm-80gb"), engine_figures("trtllm"))
    cost = model_cost("t", KNOWN_MODELS["llama-3.1-8b"], 2.0, 2.0, 2.0)
    assert device.forward(cost, 1, 1, 512).regime == "memory"
    assert device.forward(cost, 256, 8, 512).regime == "compute"
    # a forward over 4 tokens costs about what one does while bandwidth-bound: that is the whole gain
    one, four = device.forward(cost, 1, 1, 512).seconds, device.forward(cost, 1, 4, 512).seconds
    assert four < 1.05 * one


def test_tensor_parallel_divides_weights_and_adds_all_reduce():
    device = GpuDevice(gpu_figures("a100-80gb"), engine_figures("trtllm"))
    shape = KNOWN_MODELS["llama-3.1-70b"]
    tp1, tp4 = model_cost("t", shape, 2.0, 2.0, 2.0, tp=1), model_cost("t", shape, 2.0, 2.0, 2.0, tp=4)
    assert tp4.weight_bytes == pytest.approx(tp1.weight_bytes / 4)
    assert device.forward(tp1, 1, 1, 512).allreduce_s == 0.0
    assert device.forward(tp4, 1, 1, 512).allreduce_s > 0.0


def test_speedup_falls_with_concurrency_and_crosses_one():
    cfg = load_config(DRAFT_CFG)
    inp = config_inputs(cfg, acc.from_alpha(0.6), context=256)
    assert speedup_at(inp, 1) > speedup_at(inp, 512)
    cross = crossover(inp)
    assert cross is not None and speedup_at(inp, cross) < 1.0
    fc = forecast(inp, [1, 8, 64])
    for row in fc["levels"]:
        assert row["band"][0] <= row["speedup"] <= row["band"][1]
        assert row["best"]["swept"]
    assert fc["acceptance"]["source"] == "user-given --acceptance"


def test_best_draft_length_follows_acceptance():
    cfg = load_config(EAGLE3_CFG)
    low = config_inputs(cfg, acc.from_alpha(0.3))
    high = config_inputs(cfg, acc.from_alpha(0.9))
    assert forecast(low, [1])["levels"][0]["best"]["draft_len"] < forecast(high, [1])["levels"][0]["best"]["draft_len"]


def test_every_method_with_a_plan_has_a_cost_and_no_method_equality_branches():
    assert set(PLANS) <= set(PROPOSER_COSTS)
    for path in (ROOT / "pipeline" / "forecast").glob("*.py"):
        assert not re.search(r"method\s*==", path.read_text(encoding="utf-8")), path


def test_missing_hardware_figure_names_profile_and_file():
    with pytest.raises(ForecastInputError, match=r"l40s-48gb.*gpus\.yaml"):
        gpu_figures("l40s-48gb")
    with pytest.raises(ForecastInputError, match=r"a100-80gb.*fp8"):
        gpu_figures("a100-80gb").peak_flops("fp8")


def test_hardware_file_lacking_a_figure_is_refused(tmp_path):
    broken = tmp_path / "gpus.yaml"
    broken.write_text("h100-sxm-80gb: {peak_dense_tflops: {bfloat16: 989.4}, interconnect_gb_s: 900, source: x}\n")
    with pytest.raises(ForecastInputError, match="hbm_bandwidth_gb_s"):
        gpu_figures("h100-sxm-80gb", broken)


def test_unreadable_shapes_say_what_to_provide(tmp_path):
    with pytest.raises(ForecastInputError, match="config.json"):
        checkpoint_shape(str(tmp_path / "my-private-model"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ForecastInputError, match="num_hidden_layers"):
        checkpoint_shape(str(tmp_path / "m"))


def test_cli_without_acceptance_source_is_a_clear_error():
    with pytest.raises(ForecastInputError, match=r"--acceptance 0\.7.*--from-report"):
        run(["forecast", str(DRAFT_CFG)])


def test_cli_json_and_plot(tmp_path, capsys):
    assert run(["forecast", str(DRAFT_CFG), "--acceptance", "0.7", "--json", "--plot", str(tmp_path / "f.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["concurrency"] for r in out["levels"]] == load_config(DRAFT_CFG).loadtest.concurrency
    assert (tmp_path / "f.png").stat().st_size > 0


def test_acceptance_from_an_earlier_report(tmp_path):
    report = {"primary_draft_len": 4, "acceptance_source": "per-request outputs",
              "rows": [{"arm": "speculative", "concurrency": c, "speculation_length": 4, "mean_acceptance_length": t}
                       for c, t in ((1, 3.2), (8, 3.0))]}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    got = acc.from_report(path)
    assert got.per_level == {1: 3.2, 8: 3.0}
    assert got.tau_at(4, level=8) == 3.0
    assert str(path) in got.source
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ForecastInputError, match="no measured acceptance"):
        acc.from_report(path)


def _report_rows(base_tpot: dict, spec_tpot: dict, tau: float) -> dict:
    rows = []
    for c in base_tpot:
        rows.append({"arm": "baseline", "concurrency": c, "tpot_ms": base_tpot[c], "output_tokens_per_s": 1000 * c / base_tpot[c]})
        rows.append({"arm": "speculative", "concurrency": c, "speculation_length": 4, "mean_acceptance_length": tau,
                     "tpot_ms": spec_tpot[c], "output_tokens_per_s": 1000 * c / spec_tpot[c]})
    return {"primary_draft_len": 4, "rows": rows}


def _engine_steps(cfg, tau: float, levels) -> dict:
    inp = config_inputs(cfg, acc.Acceptance("x", tau=tau, tau_low=tau, tau_high=tau, at_depth=4))
    return {c: step_times(inp, c, inp.plan, tau) for c in levels}


def test_report_section_flags_a_run_far_outside_the_band():
    cfg = load_config(DRAFT_CFG)
    steps = _engine_steps(cfg, 3.0, (1, 8))
    base = {c: b * 1e3 for c, (b, _) in steps.items()}  # the model's own baseline: nothing outside it
    good = forecast_section(_report_rows(base, {c: s * 1e3 for c, (_, s) in steps.items()}, 3.0), cfg)
    assert good["available"] and good["worth_a_look"] == []
    assert all(abs(lv["tpot_error"]) < 0.01 and abs(lv["baseline_beyond_model_ms"]) < 1e-6 for lv in good["levels"])
    slow = forecast_section(_report_rows(base, {1: 3e3 * steps[1][1], 8: 1e3 * steps[8][1]}, 3.0), cfg)
    assert slow["worth_a_look"] == [1]


def test_report_section_shows_what_the_baseline_spends_beyond_the_model_as_a_per_step_diagnostic():
    """A served baseline slower than the engine model by s per step: the checked forecast stays the
    model's own; the diagnostic charges s to the speculative step too (one response per sequence
    per step: s/τ per token) and matches a run that pays it so, which the model alone does not."""
    cfg = load_config(DRAFT_CFG)
    tau, serving = 3.0, 4e-3
    steps = _engine_steps(cfg, tau, (1, 8))
    base = {c: (b + serving) * 1e3 for c, (b, _) in steps.items()}
    per_step = {c: (s * tau + serving) / tau * 1e3 for c, (_, s) in steps.items()}
    section = forecast_section(_report_rows(base, per_step, tau), cfg)
    for c, lv in zip((1, 8), section["levels"]):
        assert lv["baseline_beyond_model_ms"] == pytest.approx(serving * 1e3, rel=1e-3)
        assert lv["forecast_tpot_ratio"] == pytest.approx(steps[c][0] / steps[c][1], rel=1e-3)  # the model's own
        assert abs(lv["serving_fed_back_error"]) < 0.005
        assert lv["tpot_error"] > 0.05  # the model alone misses what a per-step serving cost adds
    per_token = {c: s * 1e3 + serving * 1e3 for c, (_, s) in steps.items()}
    charged_per_token = forecast_section(_report_rows(base, per_token, tau), cfg)
    assert all(lv["serving_fed_back_error"] < -0.05 for lv in charged_per_token["levels"])


def test_report_section_compares_means_and_forecasts_throughput_from_ttft_and_length():
    cfg = load_config(DRAFT_CFG)
    tau = 3.0
    steps = _engine_steps(cfg, tau, (1,))
    base_ms, spec_ms = steps[1][0] * 1e3, steps[1][1] * 1e3
    data = _report_rows({1: base_ms * 0.8}, {1: spec_ms * 0.5}, tau)  # medians: not what is compared

    def cell(arm, tpot, ttft, osl, draft_len=None):
        return {"arm": arm, "concurrency": 1, "draft_len": draft_len, "tpot_ms": {"mean": tpot, "p50": tpot / 2},
                "ttft_ms": {"mean": ttft}, "osl": {"mean": osl}}

    data["cells"] = [cell("baseline", base_ms, 20.0, 40.0), cell("speculative", spec_ms, 30.0, 40.0, 4),
                     cell("speculative", 99.0, 30.0, 40.0, 2)]  # another draft length: not the primary
    lv = forecast_section(data, cfg)["levels"][0]
    assert lv["tpot_statistic"] == "mean"
    assert lv["measured_tpot_ratio"] == pytest.approx(base_ms / spec_ms, rel=1e-3)
    assert abs(lv["tpot_error"]) < 0.005
    expected = (40 / (30.0 + 39 * base_ms / lv["forecast_tpot_ratio"])) / (40 / (20.0 + 39 * base_ms))
    assert lv["forecast_throughput_ratio"] == pytest.approx(expected, rel=1e-3)
    assert lv["forecast_throughput_ratio"] < lv["forecast_tpot_ratio"]  # the slower first token costs throughput


def test_report_section_without_calibration_is_not_available(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEPLOY_FORECAST_HOME", str(tmp_path))
    cfg = load_config(ROOT / "configs" / "tiny-cpu-draft-target.yaml")
    section = forecast_section(_report_rows({1: 10.0}, {1: 5.0}, 3.0), cfg)
    assert section["available"] is False and "--calibrate" in section["reason"]
    with pytest.raises(ForecastInputError, match="calibrat"):
        stored_device()
    cal = {"schema": CALIBRATION_SCHEMA, "machine": {}, "forward_fits": {"target": {"a": 0.004, "b": 0.0002, "c": 0.0}},
           "engine_overhead_s": {"1": 0.0}, "proposer_s": {"draft_target": {"1": 0.002}}}
    store({**cal, "schema": "specdeploy-cpu-calibration/1"}, calibration_key(cfg))  # an older method's: not used
    older = forecast_section(_report_rows({1: 10.0}, {1: 5.0}, 3.0), cfg)
    assert older["available"] is False and "another calibration method" in older["reason"]
    store(cal, calibration_key(cfg))
    section = forecast_section(_report_rows({1: 10.0}, {1: 5.0}, 3.0), cfg)
    assert section["available"] and section["device"]["kind"] == "cpu"
    other = load_config(ROOT / "configs" / "tiny-cpu-medusa.yaml")  # another proposer: not calibrated
    assert forecast_section(_report_rows({1: 10.0}, {1: 5.0}, 3.0), other)["available"] is False


def test_cpu_device_uses_calibrated_forward_step_and_proposer():
    cal = {"machine": {}, "forward_fits": {"target": {"a": 0.004, "b": 0.0002, "c": 0.0}},
           "engine_overhead_s": {"1": 0.001, "8": 0.002}, "proposer_s": {"ngram": {"1": 0.0005, "8": 0.001}}}
    device = CpuDevice(cal)
    cost = model_cost("target", KNOWN_MODELS["llama-3.2-1b"], 4.0, 4.0, 4.0)
    assert device.forward(cost, 2, 3, 100).seconds == pytest.approx(0.004 + 0.0002 * 6)
    assert device.step_overhead(4) == pytest.approx(0.001 + 0.001 * 3 / 7)
    assert device.proposer_seconds("ngram", 8) == pytest.approx(0.001)
    assert device.proposer_seconds("medusa", 1) is None
    assert replace(device, factor=2.0).forward(cost, 1, 1, 0).seconds == pytest.approx((0.004 + 0.0002) / 2)


def test_acceptance_from_a_bench_file_and_a_published_case(tmp_path, capsys):
    bench = {"summary": [{"method": "draft_target", "batch": b, "scope": "all", "mean_acceptance_length": t}
                         for b, t in ((1, 3.4), (8, 3.3))]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    got = acc.from_bench(path, "draft_target", 4)
    assert got.tau == 3.4 and got.at_depth == 4 and str(path) in got.source
    with pytest.raises(ForecastInputError, match="medusa"):
        acc.from_bench(path, "medusa", 4)
    assert run(["forecast", str(ROOT / "configs" / "vicuna7b-medusa-fp8-h100.yaml"), "--published",
                "medusa2-vicuna7b-a100", "--json"]) == 0
    assert "published" in json.loads(capsys.readouterr().out)["acceptance"]["source"]


def test_report_section_measures_the_draft_coverage_of_a_run_whose_passes_do_not_all_draft():
    """n-gram finds no match on some passes: those verify one token and gain one. The coverage is
    accepted tokens per decode pass (the requests' chunks) over accepted per verify step (τ − 1);
    a forecast that assumed every pass drafts would promise more than the run can give."""
    cfg = load_config(DRAFT_CFG)
    tau = 3.0
    inp = config_inputs(cfg, acc.Acceptance("x", tau=tau, tau_low=tau, tau_high=tau, at_depth=4, coverage=0.5))
    base_s, spec_s = step_times(inp, 1, inp.plan, tau)
    data = _report_rows({1: base_s * 1e3}, {1: spec_s * 1e3}, tau)

    def cell(arm, tpot_ms, acceptance=None):
        return {"arm": arm, "concurrency": 1, "draft_len": 4 if arm == "speculative" else None,
                "tpot_ms": {"mean": tpot_ms}, "ttft_ms": {"mean": 10.0}, "osl": {"mean": 40.0},
                "acceptance": acceptance or {}}

    # 100 decode passes, 50 of them verified drafts accepting 2 each: 100 accepted, τ per verify step 3
    half = {"accepted_tokens": 100, "decode_steps": 100, "mean_acceptance_length": tau}
    data["cells"] = [cell("baseline", base_s * 1e3), cell("speculative", spec_s * 1e3, half)]
    lv = forecast_section(data, cfg)["levels"][0]
    assert lv["draft_coverage"] == pytest.approx(0.5)
    assert abs(lv["tpot_error"]) < 0.005
    data["cells"][1]["acceptance"] = {**half, "accepted_tokens": 200}  # every pass drafted
    every = forecast_section(data, cfg)["levels"][0]
    assert every["draft_coverage"] == 1.0 and every["tpot_error"] < -0.05


def test_a_forecast_from_a_stale_calibration_says_so():
    from pipeline.forecast.render import summary_lines

    cal = {"machine": {"torch": "1.0.0", "processor": "x"}, "forward_fits": {"target": {"a": 0.004, "b": 0.0002, "c": 0.0}},
           "engine_overhead_s": {"1": 0.001}}
    described = CpuDevice(cal).describe()
    assert described["stale"].startswith("made under torch 1.0.0")
    fc = {"acceptance": {"source": "given"}, "device": described, "method": "ngram", "draft_len": 4, "verify_width": 5,
          "context_tokens": 64, "levels": [], "crossover_concurrency": None}
    assert any("calibration stale (made under torch 1.0.0" in line for line in summary_lines(fc))
    fresh = CpuDevice({**cal, "machine": {}}).describe()
    assert fresh["stale"] is None
    assert not any("stale" in line for line in summary_lines({**fc, "device": fresh}))


def _cells_with_engine_times(base: tuple[float, float], spec: tuple[float, float]) -> list[dict]:
    """Cells at concurrency 8 whose (client, engine) mean TPOTs are given, as stats.cell_summary
    writes them from the records."""
    from pipeline.report.stats import delivery_lag, engine_tpot_ms, tpot_ms

    def cell(arm, client_ms, engine_ms, draft_len=None):
        rec = {"osl": 11, "t_first_token": 0, "t_last": int(10 * client_ms * 1e6),
               "server_times_ns": {"first_token_time_ns": 5, "last_token_time_ns": 5 + int(10 * engine_ms * 1e6)}}
        assert tpot_ms(rec) == pytest.approx(client_ms) and engine_tpot_ms(rec) == pytest.approx(engine_ms)
        return {"arm": arm, "concurrency": 8, "draft_len": draft_len, "tpot_ms": {"mean": client_ms, "p50": client_ms},
                "engine_tpot_ms": {"mean": engine_ms}, "delivery_lag": delivery_lag([rec]),
                "ttft_ms": {"mean": 20.0}, "osl": {"mean": 11.0}}

    return [cell("baseline", *base), cell("speculative", *spec, 4)]


def test_a_baseline_whose_tokens_reach_the_client_late_is_marked_delivery_bound():
    """The engines' own token times say the speculative engine was no faster (ratio 0.95), but the
    baseline's 8 streams reached the client 14 % behind its engine: the measured 1.09× is delivery."""
    cfg = load_config(DRAFT_CFG)
    data = _report_rows({8: 8.5}, {8: 7.8}, 3.0)
    data["cells"] = _cells_with_engine_times((8.5, 7.45), (7.8, 7.85))
    section = forecast_section(data, cfg)
    lv = section["levels"][0]
    assert lv["delivery_lag"] == {"baseline": pytest.approx(0.141, abs=1e-3), "speculative": pytest.approx(-0.006, abs=1e-3)}
    assert lv["measured_engine_tpot_ratio"] == pytest.approx(0.949, abs=1e-3)
    assert lv["engine_tpot_error"] == pytest.approx(0.949 / lv["forecast_tpot_ratio"] - 1, abs=2e-3)
    assert lv["delivery_bound"] and section["delivery_bound"] == [8]
    from pipeline.report.forecast_check import forecast_note, forecast_table

    data["forecast"] = section
    assert "Delivery-bound at concurrency 8" in forecast_note(data)
    assert "delivery-bound" in json.dumps(forecast_table(data))


@pytest.mark.parametrize("base, spec", [
    ((8.5, 7.45), (7.8, 6.9)),  # both arms behind by the same: delivery slows both, the ratio holds
    ((8.5, 8.4), (7.8, 7.85)),  # both on time
])
def test_a_level_is_delivery_bound_only_when_the_baseline_lags_beyond_the_speculative_arm(base, spec):
    data = _report_rows({8: base[0]}, {8: spec[0]}, 3.0)
    data["cells"] = _cells_with_engine_times(base, spec)
    section = forecast_section(data, load_config(DRAFT_CFG))
    assert not section["levels"][0]["delivery_bound"] and section["delivery_bound"] == []


def test_without_the_servers_token_times_there_is_no_delivery_lag():
    from pipeline.report.stats import delivery_lag, engine_tpot_ms

    openai = {"osl": 11, "t_first_token": 0, "t_last": 10_000_000, "server_times_ns": {}}
    assert engine_tpot_ms(openai) is None and delivery_lag([openai]) is None
    one_token = {"osl": 1, "t_first_token": 0, "t_last": 0, "server_times_ns": {"first_token_time_ns": 1, "last_token_time_ns": 1}}
    assert engine_tpot_ms(one_token) is None
    data = _report_rows({1: 10.0}, {1: 5.0}, 3.0)  # rows only: no cells
    lv = forecast_section(data, load_config(DRAFT_CFG))["levels"][0]
    assert lv["delivery_lag"] == {"baseline": None, "speculative": None} and not lv["delivery_bound"]
    assert lv["measured_engine_tpot_ratio"] is None


def _gpu_inputs(requests):
    cfg = load_config(EAGLE3_CFG)
    return config_inputs(cfg, acc.Acceptance("x", tau=2.5, tau_low=2.5, tau_high=2.5, at_depth=3), requests=requests,
                         context=1024)


def test_a_closed_loops_admissions_add_the_others_prefills_to_every_output_token():
    """Over one request's N output tokens the c − 1 other slots each admit a request, and each
    admission's prefill holds up every decoding sequence: (c − 1)·t_prefill/(N − 1) per token,
    for both arms; nothing at one request, for a static batch, or before the first admission."""
    from pipeline.forecast.model import Requests, prefill_per_token

    inp = _gpu_inputs(Requests(2000, 257, "test"))
    per = [prefill_per_token(inp, c, 1) for c in (1, 2, 5, 9)]
    assert per[0] == 0.0 and per[1] > 0
    assert per[2] / per[1] == pytest.approx(4, rel=0.05) and per[3] / per[1] == pytest.approx(8, rel=0.1)
    longer = prefill_per_token(replace(inp, requests=Requests(2000, 513, "test")), 5, 1)
    assert longer == pytest.approx(per[2] / 2, rel=1e-6)  # over twice the tokens
    static = replace(inp, requests=None)
    assert prefill_per_token(static, 9, 1) == 0.0
    base, spec = step_times(inp, 16, inp.plan, 2.5)
    base0, spec0 = step_times(static, 16, inp.plan, 2.5)
    assert base - base0 == pytest.approx(spec - spec0, rel=0.05)  # the same per token in both arms
    assert base / spec < base0 / spec0  # so the gain shrinks


def test_in_flight_batching_charges_a_prefill_its_rows_not_the_weights_again():
    """On a GPU an admission's prefill rides in a step of the others: its cost is the step with the
    prompt's rows minus the step without — a short prompt adds little to a memory-bound step, a
    long one turns the step compute-bound."""
    inp = _gpu_inputs(None)
    device, target = inp.device, inp.target
    short = device.prefill_seconds(target, 16, 8, 1, 1024)
    long = device.prefill_seconds(target, 4000, 8, 1, 1024)
    alone = device.forward(target, 1, 16, 8).seconds
    assert 0 <= short < 0.2 * alone  # the weights are read once for the step and the prefill
    assert long > 20 * short
    assert device.forward(target, 1, 4000, 2000).regime == "compute"


def test_the_reference_engine_prefills_an_admission_in_a_forward_of_its_own():
    cal = {"forward_fits": {"target": {"a": 4e-3, "b": 1.4e-4, "c": 5e-7}}, "engine_overhead_s": {"1": 0.0}}
    dev = CpuDevice(cal)
    target = _gpu_inputs(None).target
    assert dev.prefill_seconds(target, 64, 8, 1, 65) == pytest.approx(4e-3 + (1.4e-4 + 5e-7 * 32) * 64)


def test_the_forecast_charges_longer_prompts_more_and_says_which_requests_it_assumed(capsys):
    cfg = str(EAGLE3_CFG)
    run(["forecast", cfg, "--acceptance", "0.7", "--json", "--prompt-tokens", "100"])
    short = json.loads(capsys.readouterr().out)
    run(["forecast", cfg, "--acceptance", "0.7", "--json", "--prompt-tokens", "3000", "--output-tokens", "128"])
    long = json.loads(capsys.readouterr().out)
    assert short["requests"]["prompt_tokens"] == 100 and short["requests"]["source"].startswith("--prompt-tokens 100;")
    assert long["requests"] == {**long["requests"], "prompt_tokens": 3000, "output_tokens": 128}
    assert short["context_tokens"] == 100 + 128 and long["context_tokens"] == 3000 + 64  # prompt + half the output
    top = -1
    assert long["levels"][top]["speedup"] < short["levels"][top]["speedup"]
    assert long["levels"][0]["prefill_per_token_ms"] == [0.0, 0.0]  # one request: nobody else's prefill
    assert all(b > 0 for b, _ in (lv["prefill_per_token_ms"] for lv in long["levels"][1:]))


@pytest.mark.parametrize("ttft, e2e, concurrency, expected", [
    (25.0, 100.0, 4, 1 + 3 * 0.75),  # each other request decodes three quarters of the time
    (25.0, 100.0, 1, 1.0),  # alone: always a batch of one when it decodes
    (None, 100.0, 4, 4.0),  # no means: all of them
    (100.0, 100.0, 4, 4.0),  # an impossible cell: all of them
])
def test_the_decode_batch_a_sequence_sees_follows_the_time_requests_spend_before_their_first_token(
        ttft, e2e, concurrency, expected):
    from pipeline.report.forecast_check import _decoding

    assert _decoding({"ttft_ms": ttft, "e2e_ms": e2e}, concurrency) == pytest.approx(expected)


def test_a_forecast_from_an_earlier_report_takes_that_runs_requests(tmp_path, capsys):
    report = {"primary_draft_len": 3, "rows": [{"arm": "speculative", "concurrency": 4, "speculation_length": 3,
                                                "mean_acceptance_length": 2.6}],
              "forecast": {"context_measured": {"prompt_tokens_mean": 812.4, "generated_tokens_mean": 190.6}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    run(["forecast", str(EAGLE3_CFG), "--from-report", str(path), "--json"])
    got = json.loads(capsys.readouterr().out)["requests"]
    assert (got["prompt_tokens"], got["output_tokens"]) == (812, 191) and got["source"].startswith(str(path))
    run(["forecast", str(EAGLE3_CFG), "--from-report", str(path), "--json", "--output-tokens", "64"])
    got = json.loads(capsys.readouterr().out)["requests"]
    assert (got["prompt_tokens"], got["output_tokens"]) == (812, 64)
    report.pop("forecast")
    path.write_text(json.dumps(report))  # a report without measured means: the config's defaults
    run(["forecast", str(EAGLE3_CFG), "--from-report", str(path), "--json"])
    assert json.loads(capsys.readouterr().out)["requests"]["source"].startswith("the config's default")
