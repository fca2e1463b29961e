"""End to end on the tiny CPU deployment (configs/tiny-cpu-draft-target.yaml, with upstream's
BLS orchestration — the speculative arm sends ``num_draft_tokens`` to ``tensorrt_llm_bls``):
build → render → ``run_loadtest`` (both arms' real tritonservers, Locust gRPC streaming
subprocesses, concurrency 1 and 2, one repeat of a few seconds) → raw records, Prometheus deltas,
report files, a verdict. (The config's own ``orchestration: engine`` is what ``specdeploy run``
exercises; the ensemble path is the same as Medusa's and EAGLE's.)"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The Python backend (python_backend@r24.10 src/stub_launcher.cc ReceiveMessageFromStub, src/pb_stub.cc
# main): while an execute() runs, tritonserver clears the stub's health flag every second and fails
# the request if the stub's heartbeat thread (every 300 ms) has not set it again; the window is fixed
# (`stub-timeout-seconds` does not change it). The BLS serves a whole request inside one execute(),
# so on a saturated host a stalled stub can lose one in-flight request this way; the server and the
# model stay up (server_alive below is still required).
STUB_HEARTBEAT_MISS = re.compile(r"Stub process '\w+' is not healthy")


def is_stub_heartbeat_miss(record: dict) -> bool:
    return record["status"] == "error" and bool(STUB_HEARTBEAT_MISS.search(record["error"] or ""))


def assert_verdict_follows_checks(report: dict) -> None:
    """One repeat is below ``gate.min_runs``: the ``runs`` check is inconclusive, so the verdict
    is NO-GO if any check failed and INCONCLUSIVE otherwise — never GO — and the exit code is
    the verdict's."""
    statuses = [c["status"] for c in report["gate"]["checks"]]
    runs = [c for c in report["gate"]["checks"] if c["rule"] == "runs"]
    assert runs and all(c["status"] == "inconclusive" and c["value"] == 1 for c in runs), runs
    expected = "NO-GO" if "fail" in statuses else "INCONCLUSIVE"
    assert report["verdict"] == expected, report["reasons"]
    assert report["exit_code"] == {"NO-GO": 1, "INCONCLUSIVE": 3}[expected]


def _report(verdict: str, statuses: list[str], runs: int = 1) -> dict:
    checks = [{"rule": "runs", "status": "inconclusive" if runs < 3 else "pass", "value": runs}]
    checks += [{"rule": f"r{i}", "status": status, "value": None} for i, status in enumerate(statuses)]
    return {"verdict": verdict, "exit_code": {"GO": 0, "NO-GO": 1, "INCONCLUSIVE": 3}[verdict], "reasons": [],
            "gate": {"checks": checks}}


@pytest.mark.parametrize("report,holds", [
    (_report("INCONCLUSIVE", ["pass"]), True),
    (_report("NO-GO", ["pass", "fail"]), True),
    (_report("GO", ["pass"]), False),  # a GO on one repeat
    (_report("INCONCLUSIVE", ["fail"]), False),  # a failed check that did not make it NO-GO
    (_report("NO-GO", ["pass"]), False),  # NO-GO without a failed check
    (_report("INCONCLUSIVE", ["pass"], runs=3), False),  # the runs check passed: not one repeat
], ids=["inconclusive", "no-go", "go", "fail-ignored", "no-go-unfounded", "three-runs"])
def test_the_verdict_check_can_fail(report, holds):
    """The check below, on hand-made reports: it rejects every verdict the checks do not imply."""
    if holds:
        assert_verdict_follows_checks(report)
    else:
        with pytest.raises(AssertionError):
            assert_verdict_follows_checks(report)


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.e2e  # the end-to-end tier: test_run_cli keeps one `specdeploy run` in the full tier
def test_loadtest_end_to_end_on_tiny_cpu_deployment(tmp_path):
    import yaml

    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.loadtest.runner import run_loadtest
    from pipeline.render.renderer import render

    data = yaml.safe_load((ROOT / "configs" / "tiny-cpu-draft-target.yaml").read_text())
    data["speculation"]["orchestration"] = "bls"
    (tmp_path / "tiny-cpu-draft-target-bls.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "tiny-cpu-draft-target-bls.yaml", workdir=tmp_path)  # engines/, reports/
    build(cfg, progress=False)
    render(cfg)
    run_dir = run_loadtest(cfg, out_dir=tmp_path / "run", concurrency=[1, 2], duration="5s", repeats=1,
                           progress=False)

    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    k = cfg.speculation.num_draft_tokens  # the speculative arm's key carries the config's draft length
    assert [r["key"] for r in runs] == ["baseline-c1-r0", f"speculative-k{k}-c1-r0", "baseline-c2-r0", f"speculative-k{k}-c2-r0"]
    two_cpus = len(os.sched_getaffinity(0)) == 2
    for run in runs:
        assert run["valid"] and run["server_alive"], (run["invalid_reasons"], run.get("server_log_tail"))
        if two_cpus:  # BLS: two engine models and no spare CPU, so neither arm is pinned (like for like)
            assert run["client_cpus"] is None
        records = [json.loads(line) for line in (run_dir / run["raw"]).read_text().splitlines()]
        assert len(records) == run["sent"] > 0
        ok = [r for r in records if r["status"] == "ok"]
        assert ok, [r["error"] for r in records][:3]
        errors = [r for r in records if r["status"] not in ("ok", "incomplete_at_stop")]
        assert len(errors) <= max(1, len(records) // 10) and all(is_stub_heartbeat_miss(r) for r in errors), \
            [(r["status"], r["error"]) for r in errors]
        assert all(r["osl_source"] == "server" and 0 < r["osl"] <= cfg.loadtest.max_tokens for r in ok)
        assert all(not r["prompt_echoed"] for r in ok)
        if run["arm"] == "speculative":
            assert run["metrics_delta"] and run["metrics_delta"]["draft_tokens"] > 0
            assert any((r["draft_tokens"] or 0) > 0 for r in ok)

    report = json.loads((run_dir / "report.json").read_text())
    assert report["schema"] == "specdeploy-report/1"
    assert_verdict_follows_checks(report)
    for comp in report["comparisons"]:
        assert comp["equivalence"]["equivalent"], comp["equivalence"]["mismatched_ids"]  # exact on the CPU engine
    kv_check = next(c for c in report["gate"]["checks"] if c["rule"] == "kv_capacity")  # planned = engine-reported
    assert kv_check["status"] == "pass" and {r["arm"] for r in kv_check["value"]} == {"baseline", "speculative"}, kv_check
    assert (run_dir / "report.html").is_file() and (run_dir / "report.md").is_file()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config_hash"] and meta["dataset"]["sha256"] and meta["endpoints"]["speculative"]["model"] == "tensorrt_llm_bls"
