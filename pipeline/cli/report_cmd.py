"""`specdeploy report RUN_DIR`: statistics and the GO / NO-GO / INCONCLUSIVE verdict of a load test.

Reads RUN_DIR (run.json, runs.json, raw/*.jsonl; ``--config`` overrides the config snapshot in
run.json, e.g. to re-gate with other thresholds) and writes report.json / report.md / report.html
into it. Exit code = verdict: 0 GO, 1 NO-GO, 3 INCONCLUSIVE (2 stays Click's usage error).
"""

from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("report", help="Compute statistics and the GO / NO-GO / INCONCLUSIVE verdict for a load-test "
                                "run directory (exit code 0 GO, 1 NO-GO, 3 INCONCLUSIVE).")
    def report_command(
        run_dir: str = typer.Argument(..., help="Load-test run directory (reports/NAME/<timestamp>/)."),
        config: Optional[str] = typer.Option(None, "--config", help="Gate with this config instead of run.json's snapshot."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
    ) -> int:
        import json  # noqa: PLC0415

        from pipeline.cli.loadtest_cmd import _print_summary  # noqa: PLC0415
        from pipeline.config import load_config  # noqa: PLC0415
        from pipeline.report import make_report  # noqa: PLC0415

        cfg = load_config(config) if config else None
        report = make_report(run_dir, cfg)
        if as_json:
            print(json.dumps({"verdict": report.verdict, "exit_code": report.exit_code, "reasons": report.gate.reasons,
                              "report_json": str(report.json_path), "report_html": str(report.html_path)}, indent=2))
        else:
            _print_summary(report)
        return report.exit_code
