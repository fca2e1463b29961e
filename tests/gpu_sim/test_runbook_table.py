"""docs/gpu-runbook.md's passing tables are what the live preflight prints on the simulated honest
host (NGC 26.04, the shipped configs' checkpoints, idle H100s), generated, not written by hand: this
test fails when the doc and a real run differ. ``UPDATE_RUNBOOK=1`` rewrites the tables."""

from __future__ import annotations

import os
import re

import pytest

from pipeline.paths import PROJECT_ROOT
from pipeline.validate.live import run_host_preflight
from pipeline.validate.live.table import markdown_table
from tests.gpu_sim import hosts

RUNBOOK = PROJECT_ROOT / "docs" / "gpu-runbook.md"
TABLES = {"engine": hosts.ENGINE, "llmapi": hosts.EAGLE3}

pytestmark = pytest.mark.slow  # two full preflights (child interpreters, --help of each script)


def generated(tmp_path, monkeypatch, config: str) -> str:
    host = hosts.enter(tmp_path, monkeypatch)
    checks = run_host_preflight(host.config(config)).checks
    return markdown_table(checks, {str(host.box.root): "", str(tmp_path / "models"): "/models"})


def test_the_runbook_tables_are_a_run_of_the_honest_host(tmp_path, monkeypatch):
    text = RUNBOOK.read_text(encoding="utf-8")
    for key, config in TABLES.items():
        table = generated(tmp_path / key, monkeypatch, config)
        pattern = re.compile(rf"(<!-- live-table:{key} begin[^>]*-->\n)(.*?)(<!-- live-table:{key} end -->)", re.S)
        assert pattern.search(text), f"docs/gpu-runbook.md lacks the live-table:{key} markers"
        if os.environ.get("UPDATE_RUNBOOK") == "1":
            text = pattern.sub(lambda m, new=table: m.group(1) + new + m.group(3), text)
            RUNBOOK.write_text(text, encoding="utf-8")
        assert pattern.search(text).group(2) == table, f"the {key} table differs from a run (UPDATE_RUNBOOK=1 to accept)"
