"""The CPU calibration is timed on the deployment's own load-test prompts (tokenized by the
target's tokenizer, one group per category, held out from what the bench measures), falls back to
synthetic prompts when those cannot be used, and records which it used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.demo import resolve_builtin
from pipeline.forecast import cpu
from pipeline.forecast.calibration_prompts import config_prompt_groups, held_out_groups
from pipeline.forecast.machine_calibration import calibrate_config

ROOT = Path(__file__).resolve().parents[3]
MEDUSA = ROOT / "configs" / "tiny-cpu-medusa.yaml"
TINY_PROMPTS = ROOT / "prompts" / "tiny"
START = 30  # the bench measures each category's first prompts; calibration never sees them


def _with_loadtest(cfg, **changes):
    return cfg.model_copy(update={"loadtest": cfg.loadtest.model_copy(update=changes)})


def _expected_groups(per_category: int = 3) -> dict[str, list[list[int]]]:
    """Read independently of the code under test: the files as text, the demo tokenizer directly."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(resolve_builtin("builtin:tiny-target")) / "tokenizer.json"))
    out = {}
    for path in sorted(TINY_PROMPTS.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out[path.stem] = [tokenizer.encode(r["prompt"]).ids for r in rows[START:START + per_category]]
    return out


def test_groups_are_the_load_test_prompts_from_index_30_tokenized_by_the_target():
    groups, described = config_prompt_groups(load_config(MEDUSA))
    expected = _expected_groups()
    assert len(expected) == 5  # arithmetic, code, ood, prose, records
    assert groups == list(expected.values())
    assert "load-test prompts" in described and str(TINY_PROMPTS) in described
    assert "5 categories" in described


def test_categories_of_the_config_choose_the_groups():
    cfg = _with_loadtest(load_config(MEDUSA), categories=["code", "prose"])
    groups, _ = config_prompt_groups(cfg, per_category=2)
    expected = _expected_groups(2)
    assert groups == [expected["code"], expected["prose"]]


def test_no_prompt_files_fall_back_to_synthetic_and_say_why(tmp_path):
    cfg = _with_loadtest(load_config(MEDUSA), prompts=str(tmp_path / "nowhere"))
    groups, described = config_prompt_groups(cfg)
    assert groups is None
    assert described.startswith("synthetic token ids") and "does not exist" in described


def test_a_target_without_a_tokenizer_falls_back_to_synthetic(tmp_path):
    checkpoint = tmp_path / "target"
    checkpoint.mkdir()
    shutil.copy(Path(resolve_builtin("builtin:tiny-target")) / "config.json", checkpoint / "config.json")
    cfg = load_config(MEDUSA)
    cfg = cfg.model_copy(update={"target": cfg.target.model_copy(update={"checkpoint": str(checkpoint)})})
    groups, described = config_prompt_groups(cfg)
    assert groups is None and "synthetic" in described and "tokenizer.json" in described


def test_a_short_category_gives_its_last_prompts_unless_strict():
    prompts = {"long": [f"l{i}" for i in range(40)], "short": ["s0", "s1", "s2", "s3"], "empty": []}

    def encode(text):
        return [ord(c) for c in text]

    groups = held_out_groups(prompts, encode, per_category=2)
    assert groups == [[encode("l30"), encode("l31")], [encode("s2"), encode("s3")]]
    strict = held_out_groups(prompts, encode, per_category=2, strict=True)
    assert strict == [[encode("l30"), encode("l31")]]  # the bench check never calibrates on what it measures
    assert held_out_groups({"x": ["abcdef"] * 31}, encode, 1, max_tokens=3) == [[encode("abc")]]


@pytest.fixture
def fake_calibrate(monkeypatch, tmp_path):
    """``calibrate`` replaced by a recorder (the microbenchmarks take minutes); a temp calibration home."""
    monkeypatch.setenv("SPECDEPLOY_FORECAST_HOME", str(tmp_path / "forecast"))
    calls = []

    def calibrate(target_dir, draft_dir=None, threads=1, proposer=None, prompt_groups=None, **kw):
        calls.append({"target": target_dir, "proposer": proposer, "prompt_groups": prompt_groups})
        return {"created": "now", "prompts": "calibrate's own wording", "forward_fits": {}}

    monkeypatch.setattr(cpu, "calibrate", calibrate)
    return calls


def test_calibrate_config_times_the_load_test_prompts_and_records_them(fake_calibrate):
    cfg = load_config(MEDUSA)
    path, calibration = calibrate_config(cfg)
    assert fake_calibrate[0]["prompt_groups"] == list(_expected_groups().values())
    assert fake_calibrate[0]["proposer"]["method"] == "medusa"
    stored = json.loads(path.read_text())["entries"][cpu.calibration_key(cfg)]
    assert stored["prompts"] == calibration["prompts"] and stored["prompts"].startswith("load-test prompts")


def test_calibrate_config_without_prompt_files_records_synthetic(fake_calibrate, tmp_path):
    cfg = _with_loadtest(load_config(MEDUSA), prompts=str(tmp_path / "nowhere"))
    path, _ = calibrate_config(cfg)
    assert fake_calibrate[0]["prompt_groups"] is None
    assert json.loads(path.read_text())["entries"][cpu.calibration_key(cfg)]["prompts"].startswith("synthetic")
