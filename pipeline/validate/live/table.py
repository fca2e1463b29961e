"""Print the live preflight as one rich table (or JSON), then one line per failure with its fix.
Reads the checks; writes to the console only."""

from __future__ import annotations

import json

from pipeline.validate.live.result import FAIL, PASS, LiveCheck

VERDICT_STYLE = {PASS: "green", FAIL: "bold red"}


def print_checks(cfg, checks: list[LiveCheck], console=None, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps({"config": cfg.name, "ok": not any(c.failed for c in checks),
                          "checks": [c.to_dict() for c in checks]}, indent=2, ensure_ascii=False))
        return
    from rich.console import Console  # noqa: PLC0415 - start-up: rich (the table is printed only by `specdeploy validate --live`)
    from rich.table import Table  # noqa: PLC0415 - start-up: rich (the table is printed only by `specdeploy validate --live`)

    console = console or Console(width=160)
    table = Table(title=f"Live preflight — {cfg.name} (TensorRT-LLM {cfg.trtllm_version}, {cfg.runtime} runtime)")
    for column in ("check", "expected", "from", "found", "verdict"):
        table.add_column(column, overflow="fold")
    for c in checks:
        style = VERDICT_STYLE.get(c.verdict, "dim")
        table.add_row(c.check, c.expected, c.source, c.found, f"[{style}]{c.verdict}[/]")
    console.print(table)
    failed = [c for c in checks if c.failed]
    for c in failed:
        console.print(f"[bold red]FAIL[/] {c.check}: {c.found}" + (f"\n  [yellow]{c.wrong_fact}[/]" if c.wrong_fact
                                                                    else "") + f"\n  fix: {c.fix}", soft_wrap=True)
    verdict = "[bold red]FAILED[/]" if failed else "[bold green]OK[/]"
    console.print(f"{verdict}: {len(failed)} of {len(checks)} check(s) failed")


def markdown_table(checks: list[LiveCheck], replace: dict[str, str] | None = None) -> str:
    """The rows as a Markdown table (check · expected · from · found · verdict), each ``replace``
    key substituted in the text (docs/gpu-runbook.md's passing table is generated with this from
    the simulated honest host: tests/gpu_sim/test_runbook_table.py)."""
    def cell(text: str) -> str:
        for old, new in (replace or {}).items():
            text = text.replace(old, new)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| check | expected | from | found | verdict |", "|---|---|---|---|---|"]
    lines += [f"| {cell(c.check)} | {cell(c.expected)} | {cell(c.source)} | {cell(c.found)} | {c.verdict} |" for c in checks]
    return "\n".join(lines) + "\n"
