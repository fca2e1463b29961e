"""`specdeploy report RUN_DIR`: statistics and the GO / NO-GO / INCONCLUSIVE verdict of a load test;
`specdeploy report --compare RUN_A RUN_B`: run B's spec/base ratios against run A's.

Reads RUN_DIR (run.json, runs.json, raw/*.jsonl; ``--config`` overrides the config snapshot in
run.json, e.g. to re-gate with other thresholds) and writes report.json / report.md / report.html
into it. Exit code = verdict: 0 GO, 1 NO-GO, 3 INCONCLUSIVE (2: a wrong path or flag; 5: a run
directory with no usable data, or one another live process is still measuring, named: its owner
writes the report when it ends, pipeline/loadtest/ownership.py; docs/ci.md).
With ``--compare`` it reads both run directories and writes compare.json / compare.md /
compare.html into ``--out`` (default RUN_B); exit 0, or 1 with ``--fail-on-worse`` when a ratio
moved beyond its CI for the worse (docs/report.md defines "moved").
"""

from __future__ import annotations

from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("report", help="Compute statistics and the GO / NO-GO / INCONCLUSIVE verdict for a load-test "
                                "run directory (exit code 0 GO, 1 NO-GO, 3 INCONCLUSIVE); with --compare RUN_A "
                                "RUN_B, show both runs' ratios side by side and what moved beyond its CI.")
    def report_command(
        run_dirs: List[str] = typer.Argument(..., metavar="RUN_DIR",
                                             help="Load-test run directory (reports/NAME/<timestamp>/); two with --compare."),
        config: Optional[str] = typer.Option(None, "--config", help="Gate with this config instead of run.json's snapshot."),
        compare: bool = typer.Option(False, "--compare", help="Compare two run directories: RUN_A (reference) RUN_B."),
        out: Optional[str] = typer.Option(None, "--out", help="With --compare: where to write compare.* (default RUN_B)."),
        fail_on_worse: bool = typer.Option(False, "--fail-on-worse",
                                           help="With --compare: exit 1 when a ratio moved beyond its CI for the worse."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdict (or the comparison summary) as JSON."),
    ) -> int:
        if compare:
            if len(run_dirs) != 2 or config:
                raise typer.BadParameter("--compare takes exactly two run directories (RUN_A RUN_B) and no --config",
                                         param_hint="RUN_DIR")
            return _compare(run_dirs[0], run_dirs[1], out, fail_on_worse, as_json)
        if len(run_dirs) != 1 or out or fail_on_worse:
            raise typer.BadParameter("one run directory (two, and --out / --fail-on-worse, only with --compare)",
                                     param_hint="RUN_DIR")
        return _report(run_dirs[0], config, as_json)


def _report(run_dir: str, config: Optional[str], as_json: bool) -> int:
    import contextlib
    import json
    from pathlib import Path

    from pipeline.cli.loadtest_cmd import _print_summary
    from pipeline.config import load_config
    from pipeline.infra.owner_lock import owned
    from pipeline.report.builder import make_report

    cfg = load_config(config) if config else None
    # a run being measured gets its report from its owner when it ends: report.* has one writer
    own = (owned(run_dir, "writing the report", advice="its load test writes the report when it ends")
           if Path(run_dir).is_dir() else contextlib.nullcontext())  # not a directory: make_report says so
    with own:
        report = make_report(run_dir, cfg)
    if as_json:
        print(json.dumps({"verdict": report.verdict, "exit_code": report.exit_code, "reasons": report.gate.reasons,
                          "report_json": str(report.json_path), "report_html": str(report.html_path)}, indent=2))
    else:
        _print_summary(report)
    return report.exit_code


def _compare(run_a: str, run_b: str, out: Optional[str], fail_on_worse: bool, as_json: bool) -> int:
    import json

    from pipeline.report.builder import make_comparison
    from pipeline.report.view.compare import ratio_line

    result = make_comparison(run_a, run_b, out)
    moved = result.data["moved"]
    code = 1 if fail_on_worse and result.moved_worse else 0
    if as_json:
        print(json.dumps({"moved": [ratio_line(r) for r in moved], "moved_worse": len(result.moved_worse),
                          "exit_code": code, "compare_json": str(result.json_path),
                          "compare_html": str(result.html_path)}, indent=2))
        return code
    print(f"{len(moved)} ratio(s) moved beyond their CIs ({len(result.moved_worse)} worse)")
    for r in moved:
        print(f"  {ratio_line(r)}")
    print(f"comparison: {result.html_path}  {result.md_path}  {result.json_path}")
    return code
