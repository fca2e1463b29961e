"""Golden argv of every build plan: the exact steps per example config and mode.

Goldens live in tests/unit/golden/plan/<name>.json; any difference fails. Regenerate only on
purpose: ``UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/plan/test_plan_golden.py``. Paths are
normalised (``<cwd>`` for the working directory, ``<python>`` for the interpreter)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_plan_configs import ALL

from pipeline.config import load_config, parse_config
from pipeline.paths import PROJECT_ROOT
from pipeline.plan.llmapi import MODELOPT_ENV
from pipeline.plan.planner import make_plan
from pipeline.trtllm.layout import ENV_VAR

GOLDEN_DIR = Path(__file__).parents[1] / "golden" / "plan"
CONFIGS_DIR = PROJECT_ROOT / "configs"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def normalised(plan, cwd: Path) -> str:
    text = json.dumps({"engines": plan.engines, "tokenizer_dir": plan.tokenizer_dir, "steps": plan.to_json()}, indent=2)
    text = text.replace(json.dumps(sys.executable)[1:-1], "<python>")
    return text.replace(json.dumps(str(cwd))[1:-1], "<cwd>").replace(json.dumps(str(PROJECT_ROOT))[1:-1], "<project>") + "\n"


def check_golden(name: str, text: str) -> None:
    golden = GOLDEN_DIR / f"{name}.json"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
        return
    if not golden.is_file():
        pytest.fail(f"golden {golden} is missing; generate it with UPDATE_GOLDEN=1 and review the diff")
    assert text == golden.read_text(), f"plan for {name} differs from {golden} (review; UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("name", sorted(ALL))
def test_plan_matches_golden(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(MODELOPT_ENV, raising=False)
    plan = make_plan(parse_config(ALL[name], workdir=tmp_path))
    check_golden(name, normalised(plan, tmp_path))


EXAMPLE_FILES = sorted(CONFIGS_DIR.glob("*.yaml")) if CONFIGS_DIR.is_dir() else []


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_config_plan_matches_golden(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(MODELOPT_ENV, raising=False)
    plan = make_plan(load_config(path, workdir=PROJECT_ROOT))
    check_golden(f"configs--{path.stem}", normalised(plan, PROJECT_ROOT))
