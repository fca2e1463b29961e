"""Arrival patterns, quick tier: the schedules themselves (constant, Poisson, gamma with vLLM's
burstiness, a ramp of rates, a trace's own times), the config's refusals, the vLLM-style flags
turned into config, and the run plan and Locust command of a ramp or a trace. The served runs (a
real Locust against the fake server, every pattern's achieved rate) are in test_arrivals_served.py."""

from __future__ import annotations

import statistics

import pytest

from lt_common import RunSettings, arrival_offsets, arrival_schedule, ramp_step_at
from pipeline.config import LoadTestSettings, parse_config
from pipeline.errors import ConfigError, UsageError
from pipeline.loadtest.overrides import apply_overrides, parse_goodput, parse_headers


def make_cfg(**loadtest):
    return parse_config({
        "name": "arrivals", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "concurrency": [1, 2], "duration_s": 6, "warmup_s": 0.5, **loadtest},
    })


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times)]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_the_burstiness_of_vllm(burstiness):
    # vLLM (benchmarks/serve.py): gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate, CV 1/sqrt(b)
    g = gaps(arrival_offsets(4.0, 20000, seed=3, kind="gamma", burstiness=burstiness))
    mean = statistics.fmean(g)
    assert mean == pytest.approx(0.25, rel=0.05)
    assert statistics.pstdev(g) / mean == pytest.approx(burstiness ** -0.5, rel=0.06)


def test_poisson_and_constant_gaps():
    g = gaps(arrival_offsets(5.0, 20000, seed=1, kind="poisson"))
    assert statistics.fmean(g) == pytest.approx(0.2, rel=0.03)
    assert statistics.pstdev(g) / statistics.fmean(g) == pytest.approx(1.0, rel=0.05)
    assert gaps(arrival_offsets(5.0, 4, seed=1, kind="constant")) == pytest.approx([0.2] * 4)
    assert arrival_offsets(5.0, 4, seed=1, kind="fixed") == arrival_offsets(5.0, 4, seed=9, kind="constant")
    with pytest.raises(ValueError, match="unknown kind"):
        arrival_offsets(5.0, 4, seed=1, kind="bursty")


def settings(**kw) -> RunSettings:
    base = {"run_id": "t", "arm": "baseline", "repeat": 0, "endpoint": "http://x", "model_name": "m", "mode": "open",
            "target_rate": 10.0, "arrival": "constant", "prompts": [{"id": "a", "prompt": "x"}], "seed": 5}
    return RunSettings(**{**base, **kw})


def test_a_ramp_is_a_schedule_of_rates_within_one_run():
    ramp = [{"duration_s": 2.0, "rate": 5.0}, {"duration_s": 3.0, "rate": 20.0}]
    plan = arrival_schedule(settings(ramp=ramp), horizon_s=5.0)
    per_step = [sum(a.step == n for a in plan) for n in (0, 1)]
    assert per_step == [10, 60]  # constant: rate × seconds per step
    assert all(a.offset_s <= 2.0 for a in plan if a.step == 0) and all(a.offset_s > 2.0 for a in plan if a.step == 1)
    assert [ramp_step_at(settings(ramp=ramp), t) for t in (0.1, 1.99, 2.0, 4.9, 9.0)] == [0, 0, 1, 1, 1]
    # Poisson ramps: the same seeded schedule in both arms (it depends on the settings only)
    again = arrival_schedule(settings(ramp=ramp, arrival="poisson"), 5.0)
    assert again == arrival_schedule(settings(ramp=ramp, arrival="poisson", arm="speculative"), 5.0)


def test_a_trace_replays_each_prompts_own_arrival_time():
    prompts = [{"id": "late", "prompt": "b", "arrival_s": 1002.5}, {"id": "first", "prompt": "a", "arrival_s": 1000.0},
               {"id": "mid", "prompt": "c", "arrival_s": 1001.0}, {"id": "untimed", "prompt": "d"}]
    plan = arrival_schedule(settings(arrival="trace", target_rate=None, prompts=prompts), horizon_s=2.0)
    assert [(a.offset_s, a.prompt_index) for a in plan] == [(0.0, 1), (1.0, 2)]  # 2.5 s is past the run's end
    with pytest.raises(ValueError, match="no prompt carries an arrival_s"):
        arrival_schedule(settings(arrival="trace", prompts=[{"id": "a", "prompt": "x"}]), 2.0)


@pytest.mark.parametrize(("fields", "where"), [
    ({"mode": "closed", "arrival": "gamma"}, "loadtest.arrival"),
    ({"mode": "open", "request_rate": [2], "burstiness": 0.5}, "loadtest.burstiness"),
    ({"mode": "closed", "max_concurrency": 4}, "loadtest.max_concurrency"),
    ({"mode": "open", "ramp": [{"duration_s": 2, "users": 3}]}, "loadtest.ramp.0"),
    ({"mode": "open", "arrival": "trace", "request_rate": [2]}, "loadtest.arrival"),
    ({"mode": "open"}, "loadtest.request_rate"),
])
def test_contradicting_arrival_settings_name_their_field(fields, where):
    with pytest.raises(ValueError, match=where.replace(".", r"\.")):
        LoadTestSettings(**fields)


def test_a_ramp_lasts_its_steps():
    lt = LoadTestSettings(mode="open", ramp=[{"duration_s": 4, "rate": 1}, {"duration_s": 6, "rate": 2}], warmup_s=1)
    assert lt.run_seconds == 10


def test_vllm_goodput_and_header_syntax():
    assert parse_goodput("ttft:500 tpot:50 e2el:3000") == {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2e_ms": 3000.0}
    assert parse_goodput("tpot:20") == {"ttft_ms": None, "tpot_ms": 20.0, "e2e_ms": None}  # the rest: no SLO
    for bad in ("ttft=5", "itl:5", "ttft:x", "ttft:-1", ""):
        with pytest.raises(UsageError, match="--goodput"):
            parse_goodput(bad)
    assert parse_goodput(["ttft:500", "request_latency:900"]) == {"ttft_ms": 500.0, "tpot_ms": None, "e2e_ms": 900.0}
    assert parse_headers(["X-Route: a:b", "x-tenant:7"]) == {"X-Route": "a:b", "x-tenant": "7"}  # AIPerf's form
    assert parse_headers(["x-additional-info=0.3.3", "Authorization: Bearer a=b"]) == {  # vLLM's form too
        "x-additional-info": "0.3.3", "Authorization": "Bearer a=b"}
    with pytest.raises(UsageError, match="KEY:VALUE"):
        parse_headers(["no-colon"])


def test_flags_become_the_yaml_fields_of_the_same_meaning():
    tiny_config = make_cfg()
    cfg = apply_overrides(tiny_config, {"request_rate": "2,4.5", "burstiness": 0.5, "max_concurrency": 3,
                                        "goodput": "ttft:400 e2el:2000", "slo_percentile": 90.0,
                                        "headers": ["X-A: 1"], "extra_body": '{"ignore_eos": true}',
                                        "api_key_env": "MY_KEY"})
    lt, slo = cfg.loadtest, cfg.gate.slo
    assert (lt.mode, lt.request_rate, lt.arrival, lt.burstiness, lt.max_concurrency) == ("open", [2.0, 4.5], "gamma", 0.5, 3)
    assert (lt.headers, lt.extra_body, lt.api_key_env) == ({"X-A": "1"}, {"ignore_eos": True}, "MY_KEY")
    assert (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms, slo.percentile, slo.declared) == (400.0, None, 2000.0, 90.0, True)
    assert apply_overrides(tiny_config, {}) is tiny_config
    # vLLM's --max-concurrency without a rate sends at rate inf under the cap: a closed loop at that concurrency
    assert apply_overrides(tiny_config, {"max_concurrency": 3}).loadtest.concurrency == [3]
    with pytest.raises(ConfigError, match="loadtest.burstiness"):  # a burstiness needs a gamma schedule
        apply_overrides(tiny_config, {"arrival": "constant", "burstiness": 0.5, "request_rate": "2"})
    with pytest.raises(UsageError, match="--extra-body"):
        apply_overrides(tiny_config, {"extra_body": "[1]"})


def test_a_ramp_or_a_trace_is_one_level_of_its_own():
    from pipeline.loadtest.cells import plan_runs
    from pipeline.loadtest.runner import RAMP_SHAPE, locust_command

    closed = make_cfg(ramp=[{"duration_s": 3, "users": 2}, {"duration_s": 3, "users": 5}])
    specs = plan_runs(closed, ("baseline", "speculative"), [1], 2, [])
    assert [s.key for s in specs] == ["baseline-ramp-r0", "speculative-k3-ramp-r0", "speculative-k3-ramp-r1",
                                      "baseline-ramp-r1"]
    argv = locust_command(closed, specs[0], 6.0)
    assert argv[argv.index("-f") + 1].endswith(f"locustfile.py,{RAMP_SHAPE}")  # Locust's own load shape
    assert argv[argv.index("-u") + 1] == "5"
    trace = apply_overrides(make_cfg(), {"arrival": "trace"})
    assert [s.key for s in plan_runs(trace, ("baseline",), [1], 1, [])] == ["baseline-trace-r0"]
    assert locust_command(trace, plan_runs(trace, ("baseline",), [1], 1, [])[0], 6.0)[-1].endswith("OpenLoopUser")

