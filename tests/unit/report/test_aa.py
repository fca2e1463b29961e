"""The A/A check of the rig (`loadtest --aa`, pipeline/report/aa.py): a report-level A/A built from
the committed fixture's real baseline runs says NO DIFFERENCE with exit 0 and writes the noise
record an A/B report of the config then quotes; a real difference between the arms says DIFFERENCE
(exit 1); and the CLI's endpoint form runs one served baseline as both arms."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.report.builder import make_report
from pipeline.report.gate import EXIT_CODES
from tests.unit.cli_inproc import specdeploy
from tests.unit.loadtest.test_loadtest_fake_server import FakeServer
from tests.unit.report_fixtures import copy_fixture, slow_down_speculative

ROOT = Path(__file__).resolve().parents[3]


def aa_from_fixture(target: Path) -> Path:
    """An A/A run directory from run_small's baseline runs: arm A = baseline repeat r, arm B = the
    baseline's repeat r + 1 (mod 3) — real, independent measurements of one server, as --aa records
    them (the second arm under the speculative arm's name, no draft length)."""
    run_dir = copy_fixture(target)
    listing = json.loads((run_dir / "runs.json").read_text())
    base = [r for r in listing["runs"] if r["arm"] == "baseline"]
    repeats = sorted({r["repeat"] for r in base})
    runs = []
    for r in base:
        partner = next(b for b in base if b["concurrency"] == r["concurrency"]
                       and b["repeat"] == repeats[(repeats.index(r["repeat"]) + 1) % len(repeats)])
        key = f"speculative-c{r['concurrency']}-r{r['repeat']}"
        for suffix in (".jsonl", ".workers.json"):
            shutil.copy(run_dir / "raw" / f"{partner['key']}{suffix}", run_dir / "raw" / f"{key}{suffix}")
        runs += [r, {**partner, "key": key, "arm": "speculative", "repeat": r["repeat"], "draft_len": None,
                     "raw": f"raw/{key}.jsonl", "workers": f"raw/{key}.workers.json"}]
    for path in (run_dir / "raw").glob("speculative-k3-*"):
        path.unlink()
    (run_dir / "runs.json").write_text(json.dumps({**listing, "runs": runs}))
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update({"aa": {"design": "test", "served": "baseline"}, "primary_draft_len": None})
    (run_dir / "run.json").write_text(json.dumps(meta))
    return run_dir


@pytest.mark.slow  # two whole reports
def test_aa_report_says_no_difference_and_the_ab_report_quotes_its_noise(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fixture's config has no workdir: reports/<name>/ lands here
    report = make_report(aa_from_fixture(tmp_path / "aa"))
    assert report.verdict == "NO DIFFERENCE" and report.exit_code == 0
    checks = report.data["gate"]["checks"]
    assert {c["rule"] for c in checks} >= {"aa_tpot_ratio", "aa_e2e_ratio", "aa_throughput_ratio",
                                          "aa_ttft_p95_delta_ms", "aa_output_equivalence"}
    assert all(c["status"] == "pass" for c in checks if c["rule"].startswith("aa_"))
    # 2 levels x 4 intervals: each at 1 - 0.05/8, so a sound rig says DIFFERENCE at most 5 % of the time
    assert [c["value"]["confidence_level"] for c in checks if c["rule"] == "aa_tpot_ratio"] == \
        [pytest.approx(1 - 0.05 / 8)] * 2
    record = json.loads((tmp_path / "aa" / "aa.json").read_text())
    assert record == json.loads((tmp_path / "reports" / "run-small" / "aa.json").read_text())
    assert record["verdict"] == "NO DIFFERENCE" and [lv["concurrency"] for lv in record["levels"]] == [1, 2]
    level = record["levels"][0]
    assert 0 < level["run_to_run_cv"]["median_tpot_ms"] < 0.2 and 0 < level["request_cv"]["tpot_ms"] < 1
    assert level["paired_log_ratio_sd"]["tpot_ratio"] > 0 and level["n_pairs"] == 3
    assert 0 < level["detectable_tpot_ratio"]["10"] < 1
    assert record["summary"]["run_to_run_cv_tpot"] == max(lv["run_to_run_cv"]["median_tpot_ms"] for lv in record["levels"])
    ab = make_report(copy_fixture(tmp_path / "ab"))  # an A/B of the same config quotes the rig's noise
    quoted = ab.data["rig_noise"]
    assert quoted["source"].endswith("reports/run-small/aa.json") and quoted["same_host"] is True
    assert quoted["run_to_run_cv_tpot"] == record["summary"]["run_to_run_cv_tpot"]
    assert ab.data["aa"] is None and ab.verdict == "GO"


@pytest.mark.slow
def test_aa_with_a_real_difference_says_difference_with_exit_1(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = slow_down_speculative(aa_from_fixture(tmp_path / "aa"), 1.3, runs="speculative-c1-*")
    report = make_report(run_dir)
    assert report.verdict == "DIFFERENCE" and report.exit_code == EXIT_CODES["DIFFERENCE"] == 1
    failed = [c for c in report.data["gate"]["checks"] if c["status"] == "fail"]
    assert any(c["rule"] == "aa_tpot_ratio" and c["scope"] == "c=1" for c in failed)


def test_aa_refuses_a_speculative_endpoint():
    proc = specdeploy("loadtest", "--loadtest-file", str(ROOT / "nonexistent.yaml"), "--endpoint-baseline",
                      "http://127.0.0.1:9", "--endpoint-speculative", "http://127.0.0.1:9", "--model", "m", "--aa")
    assert proc.returncode != 0 and "--aa measures the baseline against itself" in proc.stderr + proc.stdout


@pytest.mark.slow  # four real Locust runs against one fake server
def test_cli_aa_runs_one_served_baseline_as_both_arms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n"
                                                    for i in range(6)))
    (tmp_path / "lt.yaml").write_text(yaml.safe_dump({
        "name": "fake-aa", "loadtest": {"prompts": "prompts.jsonl", "concurrency": [1], "duration_s": 2,
                                        "warmup_s": 0.3, "repeats": 2, "max_tokens": 8},
        "gate": {"min_requests_per_cell": 5}}))
    server = FakeServer("--ttft-ms", "20", "--tpot-ms", "5", "--max-tokens-cap", "8")
    try:
        proc = specdeploy("loadtest", "--loadtest-file", "lt.yaml", "--endpoint-baseline",
                          f"http://127.0.0.1:{server.port}/v1", "--model", "fake", "--aa", "--out", "run",
                          "--no-progress")
    finally:
        server.close()
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    # the verdict is the rig's (NO DIFFERENCE unless this machine drifted between the runs); its code follows it
    assert report["verdict"] in ("NO DIFFERENCE", "DIFFERENCE")
    assert proc.returncode == EXIT_CODES[report["verdict"]], proc.stdout + proc.stderr
    assert "rig noise (this A/A)" in proc.stdout
    runs = json.loads((tmp_path / "run" / "runs.json").read_text())["runs"]
    # counterbalanced A B, B A; both arms the one server
    assert [r["key"] for r in runs] == ["baseline-c1-r0", "speculative-c1-r0", "speculative-c1-r1", "baseline-c1-r1"]
    settings = [json.loads((tmp_path / "run" / r["settings"]).read_text()) for r in runs]
    assert len({s["endpoint"] for s in settings}) == 1
    assert (tmp_path / "run" / "aa.json").is_file() and (tmp_path / "reports" / "fake-aa" / "aa.json").is_file()
