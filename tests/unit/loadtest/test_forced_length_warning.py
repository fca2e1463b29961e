"""The report says when the data makes acceptance unrepresentative (issue 46.2): forced output
lengths (ignore_eos / min_tokens) and prompts cut to drawn lengths are warned about on the first
screen and in the data-quality list, from the data itself — a file named "synthetic" no longer
decides it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.loadtest.inputs import load_prompt_set, with_loadtest_overrides
from pipeline.report.builder import make_report
from tests.unit.report_fixtures import copy_fixture

ROOT = Path(__file__).resolve().parents[3]
MEDUSA = ROOT / "configs" / "tiny-cpu-medusa.yaml"


def dataset_of(**changes) -> dict:
    return load_prompt_set(with_loadtest_overrides(load_config(MEDUSA), changes))[1]


def test_a_file_named_synthetic_is_not_what_makes_data_synthetic(tmp_path):
    (tmp_path / "synthetic_chat.jsonl").write_text('{"id": "1", "prompt": "How do tides work?"}\n', encoding="utf-8")
    dataset = dataset_of(dataset_path=str(tmp_path))
    assert dataset["warnings"] == [] and dataset["synthetic"] is False
    assert dataset_of()["warnings"] == []


def test_forced_and_cut_lengths_are_named_by_the_data():
    forced = dataset_of(ignore_eos=True, output_len="32")
    assert forced["synthetic"] is True
    assert [w.split(" (")[0] for w in forced["warnings"]] == ["forced output lengths"]
    cut = dataset_of(input_len="48")
    assert len(cut["warnings"]) == 1 and cut["warnings"][0].startswith("300 prompts were cut from the dataset's text")


@pytest.mark.slow  # one real report (its seven figures, about 2.5 CPU s): full tier; the quick tier keeps the rule's other checks
def test_the_report_warns_that_forced_lengths_make_acceptance_unrepresentative(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    meta = json.loads((run_dir / "run.json").read_text())
    meta["dataset"] = dataset_of(ignore_eos=True, output_len="lognormal:24,8,8,48")
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    make_report(run_dir)
    data = json.loads((run_dir / "report.json").read_text())
    (warning,) = data["data_warnings"]
    assert warning.startswith("forced output lengths (ignore_eos / min_tokens)") and "acceptance" in warning
    markdown = (run_dir / "report.md").read_text().replace("\\", "")  # unescape the Markdown
    first_screen = markdown.split("\n## ")[0]
    assert f"- Data: {warning}." in first_screen
    html = (run_dir / "report.html").read_text()
    assert "forced output lengths" in html
