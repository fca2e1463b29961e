"""The committed config reference is what `specdeploy schema --format markdown` prints today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_is_current():
    proc = subprocess.run([sys.executable, "-m", "pipeline", "schema", "--format", "markdown"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert proc.stdout == committed, (
        "docs/config-reference.md is stale: regenerate it with "
        "`specdeploy schema --format markdown > docs/config-reference.md`"
    )
