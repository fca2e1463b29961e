"""`specdeploy report --compare RUN_A RUN_B`: both runs' ratios side by side, and "moved" exactly as
docs/report.md defines it (disjoint 95% CIs; drifted: B's point outside A's CI)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.cli import run as cli_run
from pipeline.report.builder import make_comparison
from pipeline.report.view.compare import movement
from tests.unit.cli_inproc import specdeploy
from tests.unit.report_fixtures import copy_fixture, slow_down_speculative


def ci(point, low, high):
    return {"point": point, "low": low, "high": high}


@pytest.mark.parametrize("a, b, lower_better, expected", [
    (ci(0.5, 0.45, 0.55), ci(0.7, 0.65, 0.75), True, {"status": "moved", "direction": "worse"}),
    (ci(0.5, 0.45, 0.55), ci(0.3, 0.25, 0.35), True, {"status": "moved", "direction": "better"}),
    (ci(1.2, 1.1, 1.3), ci(1.5, 1.4, 1.6), False, {"status": "moved", "direction": "better"}),
    (ci(0.5, 0.45, 0.55), ci(0.58, 0.50, 0.66), True, {"status": "drifted", "direction": "worse"}),
    (ci(0.5, 0.45, 0.55), ci(0.52, 0.40, 0.64), True, {"status": "steady", "direction": None}),
    (ci(0.5, 0.45, 0.55), ci(0.55, 0.55, 0.60), True, {"status": "steady", "direction": None}),  # touching: overlap
    (ci(0.5, None, None), ci(0.9, 0.85, 0.95), True, {"status": "no CI", "direction": None}),
])
def test_movement_definition(a, b, lower_better, expected):
    assert movement(a, b, lower_better) == expected


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    return copy_fixture(root / "a"), slow_down_speculative(copy_fixture(root / "b"), 1.5)


def test_a_slower_build_moves_tpot_for_the_worse(runs, tmp_path: Path):
    a, b = runs
    result = make_comparison(a, b, tmp_path / "out")
    moved = {(r["concurrency"], r["ratio"]): r for r in result.data["moved"]}
    assert moved[(1, "tpot_ratio")]["direction"] == "worse" and moved[(2, "tpot_ratio")]["direction"] == "worse"
    assert all(r["ratio"] not in ("ttft_p50_ratio", "ttft_p95_ratio") for r in result.data["moved"])  # TTFT untouched
    assert result.moved_worse and result.data["schema"] == "specdeploy-compare/1"
    html = result.html_path.read_text()
    assert "WORSE" in html[:html.index('id="per-concurrency"')]
    assert re.search(r"TPOT p50 at c=1: 0\.500× \[0\.495, 0\.505\] → 0\.\d+× \[[^]]+\], worse \(CIs disjoint\)", html)
    assert "<script" not in html and not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert html.count('src="data:image/png;base64,') == 1
    md = result.md_path.read_text()
    assert "| TPOT p50 | 0.500 \\[0.495, 0.505] |" in md and "moved, worse" in md  # a "[" of a value is escaped in Markdown
    assert not (a / "compare.html").exists() and not (b / "report.json").exists()  # inputs only read


def test_a_run_against_itself_moves_nothing(runs, tmp_path: Path):
    a, _ = runs
    result = make_comparison(a, a, tmp_path)
    assert result.data["moved"] == [] and {r["status"] for r in result.data["ratios"]} == {"steady"}
    assert "No ratio moved beyond its CI" in result.html_path.read_text()
    assert (tmp_path / "compare.json").is_file()


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_cli_compare_writes_into_run_b_and_can_fail_on_worse(runs, tmp_path: Path):
    a, b = runs
    assert cli_run(["report", "--compare", str(a), str(b)]) == 0
    assert json.loads((b / "compare.json").read_text())["moved_worse"]
    assert cli_run(["report", "--compare", str(a), str(b), "--out", str(tmp_path), "--fail-on-worse"]) == 1
    assert cli_run(["report", "--compare", str(b), str(a), "--out", str(tmp_path), "--fail-on-worse"]) == 0  # better


def test_cli_compare_usage_errors(runs):
    a, _ = runs
    for argv in (["report", "--compare", str(a)], ["report", str(a), str(a)], ["report", str(a), "--fail-on-worse"]):
        proc = specdeploy(*argv)  # the console script's main, in this process
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "RUN_DIR" in proc.stderr and "Traceback" not in proc.stderr
