"""The report's forecast reads the context the run's requests decoded at — mean prompt tokens
(``isl``, which the load test's records now carry) + half the mean generated tokens — and names
its source; a run whose records carry no prompt token counts keeps the config's default and says so."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.artefacts.records import RawRecord
from pipeline.report.builder import prepare
from pipeline.report.forecast_check import run_context
from tests.unit.report_fixtures import copy_fixture


def _record(**kw) -> dict:
    return {"stage": "measure", "status": "ok", "isl": 10, "osl": 20, **kw}


def test_run_context_is_mean_prompt_plus_half_mean_generated_over_measured_requests():
    records = [_record(isl=10, osl=20), _record(isl=30, osl=40),
               _record(stage="warmup", isl=1000, osl=1000),  # warm-up is not measured
               _record(status="error", isl=1000, osl=0),  # nor a failed request
               _record(isl=None, osl=1000)]  # a record without a prompt count says nothing of the context
    got = run_context(records)
    assert got["tokens"] == 20 + 15 and got["requests"] == 2
    assert got["prompt_tokens_mean"] == 20 and got["generated_tokens_mean"] == 30
    assert run_context([_record(isl=None)]) is None


def test_the_load_test_record_carries_the_prompt_tokens_its_tokenizer_counts():
    from locustfiles.lt_common import RequestState, RunSettings, build_record

    settings = RunSettings(run_id="r", arm="baseline", repeat=0, endpoint="127.0.0.1:1", model_name="ensemble",
                           prompts=[{"id": "p", "text": "one two three"}])
    state = RequestState(request_id="q", prompt_id="p", category="c", prompt_index=0,
                         prompt_text="one two three", t_scheduled=None)
    state.t_sent, state.status = 1, "ok"
    record = build_record(settings, state, worker_pid=1, retokenize=lambda text: len(text.split()))
    assert record["isl"] == 3
    RawRecord.model_validate(record)
    assert build_record(settings, state, worker_pid=1)["isl"] is None  # no tokenizer, no count


def _add_prompt_tokens(run_dir: Path, isl: int) -> None:
    for path in (run_dir / "raw").glob("*.jsonl"):
        rows = [{**json.loads(line), "isl": isl} for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _mean_osl(run_dir: Path) -> float:
    osl = [r["osl"] for path in (run_dir / "raw").glob("*.jsonl") for r in map(json.loads, path.read_text().splitlines())
           if r["stage"] == "measure" and r["status"] == "ok"]
    return sum(osl) / len(osl)


def test_report_forecast_takes_its_context_from_the_run_records(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    _add_prompt_tokens(run_dir, 100)
    data, _, _ = prepare(run_dir)
    fc = data["forecast"]
    assert fc["available"], fc.get("reason")
    assert fc["context_tokens"] == round(100 + _mean_osl(run_dir) / 2)
    assert fc["context_source"].startswith("this run's records")
    assert fc["context_measured"]["prompt_tokens_mean"] == 100
    # the closed loop's admissions are charged for the same requests
    assert fc["requests"]["prompt_tokens"] == 100 and fc["requests"]["output_tokens"] == round(_mean_osl(run_dir))
    assert fc["requests"]["source"].startswith("this run's records")
    assert all(len(lv["decoding_sequences"]) == 2 for lv in fc["levels"])


def test_report_forecast_without_prompt_counts_keeps_the_config_default_and_says_so(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")  # recorded before records carried `isl`
    data, _, _ = prepare(run_dir)
    fc = data["forecast"]
    cfg = json.loads((run_dir / "run.json").read_text())["config"]
    assert fc["context_tokens"] == cfg["build"]["max_input_len"] // 2 + cfg["loadtest"]["max_tokens"] // 2
    assert fc["context_source"].startswith("the config's default") and "no prompt token counts" in fc["context_source"]
    assert fc["context_measured"] is None
    assert fc["requests"]["prompt_tokens"] == cfg["build"]["max_input_len"] // 2
    assert fc["requests"]["output_tokens"] == cfg["loadtest"]["max_tokens"]


def test_the_forecast_is_checked_against_the_primary_draft_length_only():
    from pipeline.report.forecast_check import primary_cells, primary_rows

    rows = [{"arm": "baseline", "concurrency": 1},
            {"arm": "speculative", "concurrency": 1, "speculation_length": 3},
            {"arm": "speculative", "concurrency": 1, "speculation_length": 5}]
    cells = [{"arm": "speculative", "concurrency": 1, "draft_len": k} for k in (3, 5)]
    data = {"primary_draft_len": 5, "rows": rows, "cells": cells}
    assert [r.get("speculation_length") for r in primary_rows(data, "speculative")] == [5]
    assert [c["draft_len"] for c in primary_cells(data, "speculative")] == [5]
    assert primary_rows(data, "baseline") == rows[:1]
    # a report whose primary length matches nothing keeps every row rather than none
    assert len(primary_rows({**data, "primary_draft_len": 7}, "speculative")) == 2
