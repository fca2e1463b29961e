"""Every arrival pattern against the fake streaming server (locustfiles/fake_server.py, its own
process) through the orchestrator's own Locust run (``runner.execute_run``: the settings file, the
locust command, the merged raw records): what each achieved, as ``pipeline.report.arrivals``
measures it and the gate checks it. A constant rate is sent at its rate; Poisson and gamma at their
own schedule; a concurrency cap holds and holds the rate back; a ramp steps its rates (open loop) or
users (closed loop, Locust's load shape); a trace is replayed at its recorded times. One A/B runs an
open-loop ramp on both arms, interleaved, to a report whose gate checks the ramp's steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import GateSettings, parse_config
from pipeline.loadtest import runner
from pipeline.loadtest.cells import plan_runs
from pipeline.loadtest.endpoints import ArmEndpoint
from pipeline.report.arrivals import run_arrivals
from pipeline.report.gate import PASS, UNSURE, arrival_checks
from pipeline.report.stats import load_runs
from tests.unit.fake_servers import Fake

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "tests" / "fixtures" / "prompts_small.jsonl"
GATE = GateSettings(achieved_rate_tolerance=0.1, achieved_concurrency_tolerance=0.1)  # a shared, busy 2-core host


def make_cfg(**loadtest):
    return parse_config({
        "name": "arrivals", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "duration_s": 4, "warmup_s": 0.5, "repeats": 1, "max_tokens": 4,
                     "prompts": str(PROMPTS), "stop_timeout_s": 5, **loadtest},
        "gate": {"bootstrap_resamples": 200},
    })


@pytest.fixture(scope="module")
def fast():
    server = Fake("--ttft-ms", "10", "--tpot-ms", "3", "--max-tokens-cap", "4")
    yield server
    server.close()


def measure(tmp: Path, cfg, url: str, prompts: list[dict] | None = None):
    """One baseline run of ``cfg``'s first level, as the orchestrator runs it; (run data, its arrivals)."""
    from pipeline.loadtest.inputs import load_prompt_set

    for sub in ("raw/parts", "settings", "logs", "metrics"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    spec = plan_runs(cfg, ("baseline",), cfg.loadtest.concurrency, 1, [])[0]
    result = runner.execute_run(cfg, spec, ArmEndpoint("baseline", url, "tensorrt_llm_bls", {}), tmp, "t",
                                prompts or load_prompt_set(cfg)[0], cfg.loadtest.run_seconds, cfg.loadtest.warmup_s,
                                None)
    assert result["valid"], result["invalid_reasons"]
    (tmp / "runs.json").write_text(json.dumps({"schema": "specdeploy-runs/1", "schema_version": 1,
                                               "format": "specdeploy-runs/1", "runs": [result]}))
    run = load_runs(tmp)[0]
    return run, run_arrivals(run)


def checks(arrivals: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for check in arrival_checks("c=1", "base", {**arrivals, "runs": [arrivals]}, GATE):
        out.setdefault(check.rule, []).append(check)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("arrival", "burstiness"), [("constant", 1.0), ("poisson", 1.0), ("gamma", 0.5)])
def test_open_loop_rates_are_sent_on_schedule(tmp_path, fast, arrival, burstiness):
    cfg = make_cfg(mode="open", request_rate=[12.0], arrival=arrival, burstiness=burstiness)
    run, got = measure(tmp_path, cfg, fast.url)
    assert got["pattern"] == "rate" and got["arrival"] == arrival and got["burstiness"] == burstiness
    assert got["achieved_rate"] == pytest.approx(got["offered_rate"], rel=0.1)
    if arrival == "constant":  # the schedule is the nominal rate itself
        assert got["offered_rate"] == pytest.approx(12.0, rel=0.01)
    else:  # a random schedule of ~40 arrivals: its own rate, near the nominal one
        assert 6.0 < got["offered_rate"] < 24.0
    assert [c.status for c in checks(got)["achieved_rate"]] == [PASS]
    assert all(r["t_scheduled"] is not None and r["t_sent"] >= r["t_scheduled"] for r in run.records)


@pytest.mark.slow
def test_a_concurrency_cap_holds_and_holds_the_rate_back(tmp_path):
    slow = Fake("--ttft-ms", "300", "--tpot-ms", "50", "--max-tokens-cap", "4")  # 0.45 s a request
    try:
        run, got = measure(tmp_path, make_cfg(mode="open", request_rate=[10.0], arrival="constant", max_concurrency=2),
                           slow.url)
    finally:
        slow.close()
    assert got["max_concurrency"] == 2
    assert got["achieved_concurrency"] <= 2.0 + 1e-6 and got["achieved_concurrency"] > 1.5
    assert got["achieved_rate"] < 0.7 * got["offered_rate"]  # 2 slots / 0.45 s ≈ 4.4 req/s of the 10 offered
    found = checks(got)
    assert [c.status for c in found["concurrency_cap"]] == [PASS]
    rate = found["achieved_rate"][0]
    assert rate.status == UNSURE and "max_concurrency cap held the arrivals back" in rate.detail


@pytest.mark.slow
def test_a_closed_loop_ramp_steps_its_users(tmp_path, fast):
    cfg = make_cfg(ramp=[{"duration_s": 2.5, "users": 1}, {"duration_s": 2.5, "users": 4}], warmup_s=0.2)
    run, got = measure(tmp_path, cfg, fast.url)
    assert "ramp_shape.py" in " ".join(json.loads((tmp_path / "runs.json").read_text())["runs"][0]["command"])
    steps = got["steps"]
    assert [s["users"] for s in steps] == [1, 4]
    assert steps[0]["achieved_concurrency"] == pytest.approx(1.0, rel=0.1)
    assert steps[1]["achieved_concurrency"] == pytest.approx(4.0, rel=0.1)
    assert {r["ramp_step"] for r in run.records} == {0, 1}
    assert [c.status for c in checks(got)["ramp_step_concurrency"]] == [PASS, PASS]


@pytest.mark.slow
def test_a_trace_is_replayed_at_its_recorded_times(tmp_path, fast):
    # the dataset loader's interface: each request carries arrival_s (seconds, any origin), in file order
    offsets = [0.0, 0.1, 0.15, 0.9, 1.0, 1.05, 1.1, 2.0, 2.6, 3.0]
    trace = [{"id": f"t{i}", "category": "trace", "prompt": f"traced prompt {i}", "arrival_s": 500.0 + t}
             for i, t in enumerate(offsets)]
    run, got = measure(tmp_path, make_cfg(mode="open", arrival="trace", warmup_s=0.05), fast.url, trace)
    sent = sorted(run.records, key=lambda r: r["t_scheduled"])
    assert [r["prompt_id"] for r in sent] == [p["id"] for p in trace]  # each arrival sends its own prompt
    origin = sent[0]["t_scheduled"]
    assert [(r["t_scheduled"] - origin) / 1e9 for r in sent] == pytest.approx(offsets, abs=1e-6)
    assert got["pattern"] == "trace" and got["lag_p95_ms"] < 100
    assert [c.status for c in checks(got)["achieved_rate"]] == [PASS]


@pytest.mark.slow
@pytest.mark.e2e  # a whole A/B load test to a report (the e2e tier); the patterns above stay in the full tier
def test_an_open_loop_ramp_on_both_arms_interleaved_to_a_report(tmp_path, fast):
    from pipeline.report.builder import prepare

    other = Fake("--ttft-ms", "10", "--tpot-ms", "2", "--tokens-per-chunk", "2", "--max-tokens-cap", "4")
    cfg = make_cfg(mode="open", arrival="constant", ramp=[{"duration_s": 2, "rate": 4.0}, {"duration_s": 2, "rate": 12.0}])
    try:
        run_dir = runner.run_loadtest(cfg, out_dir=tmp_path / "run", endpoint_baseline=fast.url,
                                      endpoint_speculative=other.url, progress=False, report=False)
    finally:
        other.close()
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["baseline-ramp-r0", "speculative-k3-ramp-r0"]
    data, analysis, _ = prepare(run_dir, cfg)
    comp = analysis["comparisons"][0]
    for arm in ("base", "spec"):
        steps = comp["arrivals"][arm]["runs"][0]["steps"]
        assert [s["nominal_rate"] for s in steps] == [4.0, 12.0]
        assert [s["offered_rate"] for s in steps] == pytest.approx([4.0, 12.0], rel=0.01)
        assert [s["achieved_rate"] for s in steps] == pytest.approx([4.0, 12.0], rel=0.1)
    rules = [c for c in data["gate"]["checks"] if c["rule"] == "ramp_step_rate"]
    assert len(rules) == 4  # two steps × two arms, each checked like achieved concurrency
