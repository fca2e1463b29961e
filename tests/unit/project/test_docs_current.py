"""Generated docs are current: the config reference (`specdeploy schema --format markdown`) and the
performance page (`benchmarks/performance_doc.py` from benchmarks/results/*.json)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]


def test_config_reference_is_current():
    proc = specdeploy("schema", "--format", "markdown")  # the CLI's main, in this process
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert proc.stdout == committed, (
        "docs/config-reference.md is stale: regenerate it with "
        "`specdeploy schema --format markdown > docs/config-reference.md`"
    )


def test_performance_page_is_current():
    proc = subprocess.run([sys.executable, "benchmarks/performance_doc.py", "--out", "/dev/stdout"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert proc.stdout == committed, (
        "docs/performance.md is stale: regenerate it with `python benchmarks/performance_doc.py`"
    )
