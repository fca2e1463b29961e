"""``run_loadtest`` end to end against two fake streaming servers (real Locust subprocesses), plus
its input checks: interleaved arms, identical request settings, provenance, a killed server makes
the run invalid and the verdict NO-GO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import parse_config
from pipeline.errors import EXIT_FAILURE, SpecdeployError
from pipeline.loadtest import runner
from pipeline.loadtest.cells import RunSpec, plan_runs
from pipeline.loadtest.endpoints import ArmEndpoint
from pipeline.loadtest.inputs import LoadTestError, check_sweep
from pipeline.loadtest.runner import _parse_duration, run_loadtest, run_settings
from pipeline.loadtest.server_metrics import parse_counters
from tests.unit.fake_servers import Fake

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "tests" / "fixtures" / "prompts_small.jsonl"


def make_cfg(orchestration: str = "bls", **loadtest):
    return parse_config({
        "name": "orch", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": orchestration,
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "concurrency": [1, 2], "duration_s": 2, "warmup_s": 0.2, "repeats": 1,
                     "max_tokens": 7, "prompts": str(PROMPTS), "stop_timeout_s": 5, **loadtest},
        "gate": {"bootstrap_resamples": 200},
    })


def start_spec() -> Fake:
    return Fake("--ttft-ms", "35", "--tpot-ms", "3", "--tokens-per-chunk", "3", "--max-tokens-cap", "7")


@pytest.fixture(scope="module")
def shared_fakes():
    """One pair for the tests that only send to the servers (each start is a Python process)."""
    base, spec = Fake("--ttft-ms", "30", "--tpot-ms", "6", "--max-tokens-cap", "7"), start_spec()
    yield base, spec
    base.close()
    spec.close()


@pytest.fixture()
def fakes(shared_fakes):
    """The shared baseline server and a speculative server of its own, for a test that kills it."""
    spec = start_spec()
    yield shared_fakes[0], spec
    spec.close()


@pytest.mark.slow
def test_run_loadtest_against_fake_servers(tmp_path, shared_fakes):
    base, spec = shared_fakes
    run_dir = run_loadtest(make_cfg(), out_dir=tmp_path / "run", endpoint_baseline=base.url,
                           endpoint_speculative=spec.url, progress=False)
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["baseline-c1-r0", "speculative-k3-c1-r0", "baseline-c2-r0", "speculative-k3-c2-r0"]
    assert all(r["valid"] and r["server_alive"] and r["n_records"] == r["sent"] > 0 for r in runs)
    assert all(r["client_cpu_fraction"] is not None for r in runs)
    settings = {r["key"]: json.loads((run_dir / r["settings"]).read_text()) for r in runs}
    b, s = settings["baseline-c1-r0"], settings["speculative-k3-c1-r0"]
    for key in ("prompts", "max_tokens", "sampling", "seed", "transport", "mode"):
        assert b[key] == s[key], key  # same prompts, order seed, max_tokens, sampling, transport in both arms
    assert b["model_name"] == s["model_name"] == "tensorrt_llm_bls"
    assert b["extra_inputs"] == {} and s["extra_inputs"] == {"num_draft_tokens": 3}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config_hash"] and meta["dataset"]["n_prompts"] == 5 and meta["versions"]["locust"]
    assert len(meta["commands"]) == 5  # the CLI line + one locust command per run
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "INCONCLUSIVE"  # one repeat < gate.min_runs
    assert any("runs per arm" in r for r in report["reasons"])


@pytest.mark.slow
def test_dead_server_marks_run_invalid_and_never_go(tmp_path, fakes, monkeypatch):
    base, spec = fakes
    real = runner.execute_run

    def then_kill_speculative(cfg, run_spec, *args, **kwargs):
        result = real(cfg, run_spec, *args, **kwargs)
        if run_spec.key == "baseline-c1-r0":
            spec.close()  # the speculative server dies after the first cell, before its own
        return result

    monkeypatch.setattr(runner, "execute_run", then_kill_speculative)
    run_dir = run_loadtest(make_cfg(concurrency=[1]), out_dir=tmp_path / "run", endpoint_baseline=base.url,
                           endpoint_speculative=spec.url, progress=False)
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    dead = [r for r in runs if r["arm"] == "speculative"]
    assert dead and not dead[0]["server_alive"] and not dead[0]["valid"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "NO-GO" and report["exit_code"] == 1


def test_a_server_gone_before_the_first_cell_is_a_failure_not_a_verdict(tmp_path, fakes):
    base, spec = fakes
    spec.close()
    with pytest.raises(LoadTestError, match="--endpoint-speculative") as err:
        run_loadtest(make_cfg(concurrency=[1]), out_dir=tmp_path / "run", endpoint_baseline=base.url,
                     endpoint_speculative=spec.url, progress=False)
    assert err.value.exit_code == EXIT_FAILURE  # not NO-GO's 1: nothing was measured
    assert not (tmp_path / "run" / "runs.json").exists()


def test_input_errors_are_clear(tmp_path):
    cfg = make_cfg()
    with pytest.raises(SpecdeployError, match="no endpoint for arm"):
        run_loadtest(cfg, out_dir=tmp_path / "a", endpoint_baseline="http://127.0.0.1:1", progress=False)
    with pytest.raises(SpecdeployError, match="loadtest.prompts"):
        run_loadtest(make_cfg(prompts=str(tmp_path / "missing")), out_dir=tmp_path / "b",
                     endpoint_baseline="x", endpoint_speculative="y", progress=False)
    with pytest.raises(SpecdeployError, match="max_draft_len"):
        run_loadtest(cfg, out_dir=tmp_path / "c", sweep_draft_len=[2, 8], endpoint_baseline="x",
                     endpoint_speculative="y", progress=False)
    medusa = parse_config({**cfg.model_dump(mode="json"), "speculation": {"method": "medusa", "heads_dir": "h"}})
    with pytest.raises(SpecdeployError, match="fixes its draft length"):
        run_loadtest(medusa, out_dir=tmp_path / "d", sweep_draft_len=[2], endpoint_baseline="x",
                     endpoint_speculative="y", progress=False)
    with pytest.raises(SpecdeployError, match="--duration"):
        _parse_duration("soon")
    assert _parse_duration("2m") == 120 and _parse_duration("1.5s") == 1.5


def test_plan_interleaves_arms_and_sweeps_draft_lengths():
    cfg = make_cfg()
    keys = [s.key for s in plan_runs(cfg, ("baseline", "speculative"), [1, 4], 2, [2, 3])]
    assert keys[:6] == ["baseline-c1-r0", "speculative-k2-c1-r0", "speculative-k3-c1-r0",
                        "baseline-c4-r0", "speculative-k2-c4-r0", "speculative-k3-c4-r0"]
    # counterbalanced: the odd repeat measures the speculative arm first (A B, B A), so drift cancels
    assert len(keys) == 12 and keys[6:9] == ["speculative-k2-c1-r1", "speculative-k3-c1-r1", "baseline-c1-r1"]


def test_prometheus_counters_summed_over_labels():
    text = """# HELP specdeploy_spec_decode_draft_tokens_total drafts
# TYPE specdeploy_spec_decode_draft_tokens_total counter
specdeploy_spec_decode_draft_tokens_total{model="tensorrt_llm",version="1"} 40
specdeploy_spec_decode_draft_tokens_total{model="tensorrt_llm_bls",version="1"} 2
specdeploy_spec_decode_accepted_tokens_total{model="tensorrt_llm",version="1"} 30
specdeploy_spec_decode_verify_steps_total{model="tensorrt_llm",version="1"} 10
nv_inference_count{model="ensemble",version="1"} 99
"""
    assert parse_counters(text) == {"draft_tokens": 42.0, "accepted_tokens": 30.0, "verify_steps": 10.0}


def test_cli_rejects_bad_options(tmp_path):
    from pipeline.cli import run as cli_run

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(make_cfg().model_dump(mode="json")))
    with pytest.raises(SpecdeployError, match="--concurrency"):
        cli_run(["loadtest", str(cfg), "--concurrency", "1,x"])
    with pytest.raises(SpecdeployError, match="--endpoint needs --arm"):
        cli_run(["loadtest", str(cfg), "--endpoint", "127.0.0.1:1"])


def test_endpoint_liveness_checks_the_model(shared_fakes):
    from pipeline.loadtest.endpoints import endpoint_alive

    base, _ = shared_fakes
    assert endpoint_alive(base.url, "http", "ensemble")
    assert not endpoint_alive("http://127.0.0.1:9", "http", "ensemble", timeout_s=1)
    assert not endpoint_alive("127.0.0.1:9", "grpc", "ensemble", timeout_s=1)


def test_generate_probe(shared_fakes):
    from pipeline.loadtest.endpoints import probe_generate

    base, _ = shared_fakes
    assert probe_generate(base.url, "ensemble", {"num_draft_tokens": 3})
    assert not probe_generate("http://127.0.0.1:9", "ensemble", {}, timeout_s=1)


@pytest.mark.parametrize("orchestration,model,extra", [
    ("bls", "tensorrt_llm_bls", {"num_draft_tokens": 3}),
    ("engine", "ensemble", {}),  # K lives in the engine; the ensemble has no num_draft_tokens input
])
def test_speculative_arm_request_shape_follows_orchestration(tmp_path, orchestration, model, extra):
    from pipeline.render.renderer import client_target

    cfg = make_cfg(orchestration)
    target = client_target(cfg, "speculative")
    endpoint = ArmEndpoint("speculative", "127.0.0.1:1", target.model_name, target.extra_inputs)
    settings = run_settings(cfg, RunSpec("speculative", 1, 0, 3), endpoint, tmp_path, "r", [], 2.0, 0.2, None)
    assert (settings["model_name"], settings["extra_inputs"]) == (model, extra)


def test_sweep_needs_bls_orchestration():
    from pipeline.render.arms import decide_arm

    cfg = make_cfg("engine")
    with pytest.raises(SpecdeployError, match="orchestration 'engine' fixes num_draft_tokens"):
        check_sweep(cfg, [2, 3], decide_arm(cfg, "speculative"))  # the speculative arm as render wrote it


def test_kv_capacity_is_read_per_model_from_the_backend_metrics():
    from pipeline.loadtest.endpoints import kv_capacity_from_text

    text = """# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 3532
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm_draft",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm_draft",version="1"} 3532
nv_inference_count{model="ensemble",version="1"} 99
"""
    assert kv_capacity_from_text(text) == {"tensorrt_llm": 3532 * 64, "tensorrt_llm_draft": 3532 * 64}
    assert kv_capacity_from_text('nv_inference_count{model="ensemble",version="1"} 99\n') is None
