"""`loadtest.repeats: auto` (pipeline/loadtest/auto_repeats.py): the stopping rule on a scripted
look (decided, max_repeats, max_minutes, a resume replaying its looks), the per-look confidence
level the report uses, and a real run against two fake servers (real Locust) that stops when the
gate is decided, says why in run.json and the report, and resumes after an interruption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import parse_config
from pipeline.loadtest import auto_repeats
from pipeline.loadtest.cells import RunSpec, plan_runs
from pipeline.loadtest.resume import is_finished
from pipeline.loadtest.runner import run_loadtest
from tests.unit.fake_servers import Fake

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "tests" / "fixtures" / "prompts_small.jsonl"


def make_cfg(**loadtest):
    return parse_config({
        "name": "auto", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "concurrency": [1], "duration_s": 2, "warmup_s": 0.2, "repeats": "auto",
                     "min_repeats": 2, "max_repeats": 4, "max_tokens": 7, "prompts": str(PROMPTS),
                     "stop_timeout_s": 5, **loadtest},
        "gate": {"bootstrap_resamples": 200, "min_requests_per_cell": 5},
    })


def drive(cfg, decided_at: int | None, kept: set[str] = frozenset(), seconds: float = 1.0,
          results: list | None = None) -> tuple[list[RunSpec], dict, list[int]]:
    """Run the stopping rule as the runner does: each yielded spec 'measured' (a result appended)."""
    meta = {"repeats": 0, "repeats_auto": auto_repeats.plan(cfg)}
    every = plan_runs(cfg, ("baseline", "speculative"), [1], cfg.loadtest.max_repeats, [])
    results = [] if results is None else results
    looked: list[int] = []

    def look(_run_dir, _cfg):
        n = len({r["repeat"] for r in results})
        looked.append(n)
        return {"verdict": "GO" if n == decided_at else "INCONCLUSIVE", "decided": n == decided_at,
                "undecided": [] if n == decided_at else ["benefit_tpot_ratio (c=1)"], "repeats_to_decide": None}

    measured = []
    for spec in auto_repeats.auto_specs(lambda r: [s for s in every if s.repeat == r], set(kept), results, meta,
                                        Path("."), cfg, lambda: None, look_fn=look):
        measured.append(spec)
        results.append({"key": spec.key, "repeat": spec.repeat, "seconds": seconds})
    return measured, meta, looked


def test_plan_splits_alpha_over_the_looks():
    plan = auto_repeats.plan(make_cfg(min_repeats=3, max_repeats=8))
    assert plan["looks_planned"] == 6 and plan["alpha_per_look"] == pytest.approx(0.05 / 6)
    assert "Bonferroni" in plan["spending"]
    assert auto_repeats.confidence_level({"repeats_auto": plan}, 0.05) == pytest.approx(1 - 0.05 / 6)
    assert auto_repeats.confidence_level({}, 0.05) == pytest.approx(0.95)


def test_stops_when_decided():
    measured, meta, looked = drive(make_cfg(), decided_at=3)
    assert [s.key for s in measured][:2] == ["baseline-c1-r0", "speculative-k3-c1-r0"]
    assert {s.repeat for s in measured} == {0, 1, 2} and looked == [2, 3]
    assert meta["repeats"] == 3
    assert meta["repeats_auto"]["stopped"] == {"reason": "decided", "repeats": 3,
                                               "detail": "every gated check is decided"}
    assert auto_repeats.summary(meta)["stopped"] == "decided" and auto_repeats.summary(meta)["repeats"] == 3


def test_stops_at_max_repeats_when_never_decided():
    measured, meta, looked = drive(make_cfg(), decided_at=None)
    assert {s.repeat for s in measured} == {0, 1, 2, 3} and looked == [2, 3, 4]
    assert meta["repeats_auto"]["stopped"]["reason"] == "max_repeats"


def test_stops_before_a_repeat_that_would_break_the_minutes_cap():
    # 2 cells per repeat of 40 s: after 2 repeats 160 s are used, a third would end at 240 s > 3 min
    measured, meta, _ = drive(make_cfg(max_minutes=3), decided_at=None, seconds=40.0)
    assert {s.repeat for s in measured} == {0, 1}
    stopped = meta["repeats_auto"]["stopped"]
    assert stopped["reason"] == "max_minutes" and stopped["repeats"] == 2 and "max_minutes (3)" in stopped["detail"]


def test_resume_replays_the_looks_on_kept_cells():
    cfg = make_cfg()
    kept = {"baseline-c1-r0", "speculative-k3-c1-r0", "baseline-c1-r1"}  # cut short in repeat 1
    results = [{"key": k, "repeat": int(k[-1]), "seconds": 1.0} for k in sorted(kept)]
    measured, meta, looked = drive(cfg, decided_at=2, kept=kept, results=results)
    assert [s.key for s in measured] == ["speculative-k3-c1-r1"]  # only the missing cell
    assert looked == [2] and meta["repeats_auto"]["stopped"]["reason"] == "decided"


def test_an_auto_run_that_has_not_stopped_is_unfinished(tmp_path):
    meta = {"repeats": 2, "repeats_auto": auto_repeats.plan(make_cfg()), "config": make_cfg().model_dump(mode="json"),
            "concurrency": [1], "arms": ["baseline", "speculative"]}
    assert auto_repeats.pending(meta) and not is_finished(tmp_path, meta)


@pytest.mark.slow  # real Locust runs against two fake servers
def test_auto_run_stops_when_the_gate_is_decided(tmp_path):
    base = Fake("--ttft-ms", "30", "--tpot-ms", "8", "--max-tokens-cap", "7")
    spec = Fake("--ttft-ms", "32", "--tpot-ms", "3", "--tokens-per-chunk", "3", "--max-tokens-cap", "7")
    try:
        run_dir = run_loadtest(make_cfg(), out_dir=tmp_path / "run", endpoint_baseline=base.url,
                               endpoint_speculative=spec.url, progress=False)
        listing = json.loads((run_dir / "runs.json").read_text())
        before = listing["runs"]
        # an interruption in the last repeat (its last cell lost, no stop recorded): resume finishes it
        (run_dir / "runs.json").write_text(json.dumps({**listing, "runs": before[:-1]}))
        meta = json.loads((run_dir / "run.json").read_text())
        meta["repeats_auto"]["stopped"] = None
        (run_dir / "run.json").write_text(json.dumps(meta))
        run_loadtest(make_cfg(), resume=run_dir, endpoint_baseline=base.url, endpoint_speculative=spec.url,
                     progress=False)
    finally:
        base.close()
        spec.close()
    after = json.loads((run_dir / "runs.json").read_text())["runs"]
    # the kept cells stay, the lost cell is measured again; the look after it may then ask for another repeat
    # (its data changed), whose cells follow in the resumed session
    assert [r["key"] for r in after][:len(before)] == [r["key"] for r in before]
    assert all(r["session"] == 1 for r in after[:len(before) - 1])
    assert all(r["session"] == 2 for r in after[len(before) - 1:])
    meta = json.loads((run_dir / "run.json").read_text())
    auto = meta["repeats_auto"]
    assert auto["stopped"]["reason"] in ("decided", "max_repeats")
    assert [look["repeats"] for look in auto["looks"]] == list(range(2, auto["stopped"]["repeats"] + 1))
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert len(runs) == 2 * meta["repeats"] == 2 * auto["stopped"]["repeats"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["repeats"]["mode"] == "auto" and report["repeats"]["repeats"] == meta["repeats"]
    assert report["intervals"]["confidence_level"] == pytest.approx(1 - 0.05 / 3)  # 3 looks: 2, 3, 4
    # the stop follows the last look: decided there, or the cap; the fake speculative server decodes
    # 8/3 times faster, so a decided run is a GO (how many repeats that takes depends on this machine's load)
    last = auto["looks"][-1]
    assert last["decided"] == (auto["stopped"]["reason"] == "decided"), auto["looks"]
    if last["decided"]:
        assert report["verdict"] == "GO" and last["undecided"] == []
    else:
        assert auto["stopped"]["repeats"] == 4 and last["undecided"]


def test_min_repeats_above_max_repeats_names_the_field():
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="loadtest.min_repeats"):
        make_cfg(min_repeats=5, max_repeats=3)
    with pytest.raises(ConfigError, match="loadtest.repeats"):
        make_cfg(repeats="sometimes")


def test_cli_repeats_takes_auto_or_a_positive_integer():
    from pipeline.cli.loadtest_cmd import _repeats
    from tests.unit.cli_inproc import specdeploy

    assert _repeats("auto") == "auto" and _repeats("4") == 4 and _repeats(None) is None
    proc = specdeploy("loadtest", str(ROOT / "configs" / "tiny-cpu-medusa.yaml"), "--repeats", "often")
    assert proc.returncode == 2 and "--repeats: expected a positive integer or auto, got 'often'" in proc.stderr
