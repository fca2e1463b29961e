"""Every dataset format loads its sample file (tests/fixtures/datasets/), categories come from the
data, a trace exposes arrivals and lengths, and each malformed record is a usage error (exit 2)
naming the file, the line and the field (issue 46.1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import EXIT_USAGE
from pipeline.loadtest.datasets import FORMATS, DatasetError, DatasetOptions, load_rows

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "tests" / "fixtures" / "datasets"


def rows(name: str, path: str, **options):
    return load_rows(name, SAMPLES / path, DatasetOptions(**options))


def test_every_registered_format_has_a_sample_file():
    assert {f.name for f in FORMATS.values()} == {"specdeploy", "sharegpt", "openai_chat", "hf", "spec_bench",
                                                  "speed_bench", "mooncake_trace"}
    assert FORMATS["custom"].name == "specdeploy"  # vLLM's {"prompt": ...} JSONL reads as ours


def test_our_jsonl_directory_takes_categories_from_rows_or_file_names():
    got = rows("specdeploy", "specdeploy")
    assert [(r.id, r.category) for r in got] == [("code-1", "code"), ("code-2", "code"), ("qa-1", "qa"), ("qa-2", "qa")]
    assert got[2].output_len == 40 and got[3].prompt == "What is the difference between weather and climate?"


def test_sharegpt_first_human_turn_and_its_answer_or_the_whole_conversation():
    first = rows("sharegpt", "sharegpt.json")
    assert [r.id for r in first] == ["sg-1", "sg-2", "sg-3"]  # the empty conversation is skipped, as vLLM does
    assert first[1].prompt == "How long should I rest a steak after cooking it?"
    assert first[1].reference_output.startswith("About five minutes") and first[1].messages is None
    assert {r.category for r in first} == {"sharegpt"}
    whole = rows("sharegpt", "sharegpt.json", multi_turn=True)[1]
    assert [m["role"] for m in whole.messages] == ["system", "user", "assistant", "user"]
    assert whole.messages[-1]["content"] == "And should I salt it before or after?"
    assert whole.reference_output.startswith("Salt it at least forty minutes")
    assert whole.prompt.startswith("system: You are a patient cooking teacher.") and "user: And should I" in whole.prompt


def test_openai_chat_messages_with_text_parts_categories_and_own_lengths():
    got = rows("openai_chat", "openai_chat.jsonl")
    assert [(r.id, r.category) for r in got] == [("oc-1", "support"), ("oc-2", "writing"), ("oc-3", "support")]
    assert got[0].prompt.startswith("My parcel says delivered") and got[0].reference_output.startswith("Check with")
    assert got[1].prompt.startswith("Draft a two-line thank-you note") and got[1].output_len == 48
    multi = rows("openai_chat", "openai_chat.jsonl", multi_turn=True)[2]
    assert [m["content"] for m in multi.messages][-1] == "Will that delete my Wi-Fi password?"


def test_hf_export_with_named_prompt_and_category_columns():
    got = rows("hf", "hf_export", prompt_column="question", category_column="topic")
    assert [(r.category, r.prompt[:20]) for r in got] == [
        ("household", "Name three uses of b"), ("work", "What does a sommelie"), ("finance", "Give a one-sentence ")]


def test_spec_bench_and_speed_bench_carry_their_categories():
    spec = rows("spec_bench", "spec_bench.jsonl")
    assert [r.category for r in spec] == ["writing", "translation", "summarization", "math_reasoning"]
    assert spec[0].prompt.startswith("Compose a short travel blog post") and spec[0].id == "81"
    speed = rows("speed_bench", "speed_bench.jsonl")
    assert [r.category for r in speed] == ["coding", "humanities", "math"]
    assert speed[1].prompt == "Why did medieval towns often grow around river crossings?"
    assert rows("speed_bench", "speed_bench.jsonl", multi_turn=True)[1].messages[-1]["content"] == \
        "Name one such town in England."


def test_mooncake_trace_exposes_arrival_seconds_and_lengths():
    got = rows("mooncake_trace", "mooncake_trace.jsonl")
    assert [r.arrival_s for r in got] == [0.0, 0.25, 0.25, 1.375, 2.0]
    assert [(r.input_len, r.output_len) for r in got] == [(24, 12), (40, 20), (16, 8), (32, 30), (None, 16)]
    assert got[0].prompt == "" and got[4].prompt == "Tell me a fact about octopuses."
    assert got[1].as_prompt() == {"id": "trace-2", "category": "trace", "prompt": "", "input_len": 40,
                                  "output_len": 20, "arrival_s": 0.25}


MALFORMED = [
    ("sharegpt", "x.json", '[\n {"id": "a", "conversations": [{"from": "human", "value": "hi"}]},\n'
     ' {"id": "b", "conversations": [{"from": "robot", "value": "hi"}]}\n]', 3, "conversations[0].from"),
    ("sharegpt", "x.json", '[\n {"id": "a", "conversations": "hi"}\n]', 2, "conversations"),
    ("sharegpt", "x.json", '[\n {"id": "a",\n  "conversations": [{"from": "human", "value": 5}]}\n]', 2,
     "conversations[0].value"),
    ("openai_chat", "x.jsonl", '{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": []}\n', 2, "messages"),
    ("openai_chat", "x.jsonl", '{"messages": [{"role": "human", "content": "hi"}]}\n', 1, "messages[0].role"),
    ("openai_chat", "x.jsonl", '{"messages": [{"role": "user", "content": 3}]}\n', 1, "messages[0].content"),
    ("openai_chat", "x.jsonl", '{"messages": [{"role": "system", "content": "be brief"}]}\n', 1, "messages"),
    ("specdeploy", "x.jsonl", '{"id": "1", "prompt": "hi"}\n\n{"id": "2", "prompt": ""}\n', 3, "prompt"),
    ("specdeploy", "x.jsonl", '{"id": "1", "prompt": "hi", "output_tokens": -4}\n', 1, "output_tokens"),
    ("specdeploy", "x.jsonl", '{"id": "1", "prompt": "hi"}\n{"id": "1", "prompt": "again"}\n', 2, "id"),
    ("hf", "x.jsonl", '{"question": "hi"}\n{"text": "no question"}\n', 2, "question"),
    ("spec_bench", "x.jsonl", '{"question_id": 1, "category": "qa", "turns": []}\n', 1, "turns"),
    ("spec_bench", "x.jsonl", '{"question_id": 1, "turns": ["hi"]}\n', 1, "category"),
    ("speed_bench", "x.jsonl", '{"question_id": "q", "category": "qa", "messages": [{"role": "user", "content": '
     '"FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"}]}\n', 1, "messages[0].content"),
    ("mooncake_trace", "x.jsonl", '{"timestamp": 0, "input_length": 4, "output_length": 2}\n'
     '{"timestamp": 10, "input_length": 4}\n', 2, "output_length"),
    ("mooncake_trace", "x.jsonl", '{"timestamp": 50, "input_length": 4, "output_length": 2}\n'
     '{"timestamp": 10, "input_length": 4, "output_length": 2}\n', 2, "timestamp"),
    ("mooncake_trace", "x.jsonl", '{"timestamp": 0, "input_length": "4", "output_length": 2}\n', 1, "input_length"),
]


@pytest.mark.parametrize("name, file, text, line, field", MALFORMED, ids=[f"{m[0]}-{m[4]}-{i}" for i, m in enumerate(MALFORMED)])
def test_a_malformed_record_names_file_line_and_field(tmp_path, name, file, text, line, field):
    path = tmp_path / file
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_rows(name, path, DatasetOptions(prompt_column="question" if name == "hf" else "prompt"))
    error = info.value
    assert (error.path, error.line, error.field) == (str(path), line, field), str(error)
    assert str(error).startswith(f"{path}:{line}: field '{field}': ")
    assert error.exit_code == EXIT_USAGE


def test_json_that_does_not_parse_names_its_line(tmp_path):
    path = tmp_path / "share.json"
    path.write_text('[\n {"id": "a", "conversations": []},\n {"id": "b", "conversations": [}\n]', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"share\.json:3: not JSON"):
        load_rows("sharegpt", path)


@pytest.mark.parametrize("path", ["hf_arrow", "hf_sample.parquet"])
def test_a_dataset_saved_as_arrow_or_parquet_reads_like_its_json_export(path):
    """Dataset.save_to_disk's Arrow directory and a Parquet file (pyarrow, a dependency of the loadtest
    extra) give the rows of the same three-row sample as its JSON export."""
    got = rows("hf", path, prompt_column="question", category_column="topic")
    assert [(r.category, r.prompt) for r in got] == [
        (r.category, r.prompt) for r in rows("hf", "hf_export", prompt_column="question", category_column="topic")]


def test_an_unreadable_arrow_file_is_named(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "data-00000-of-00001.arrow").write_bytes(b"\xff\xff\xff\xff")
    (tmp_path / "ds" / "state.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"data-00000-of-00001.arrow.*not a readable arrow table"):
        load_rows("hf", tmp_path / "ds")


def test_the_loadtest_command_stops_on_a_malformed_dataset_before_any_server(tmp_path):
    from tests.unit.cli_inproc import specdeploy

    bad = tmp_path / "share.json"
    bad.write_text('[\n {"id": "a",\n  "conversations": [{"from": "human", "value": "hi"}, {"from": "robot", '
                   '"value": "x"}]}\n]', encoding="utf-8")
    proc = specdeploy("loadtest", ROOT / "configs" / "tiny-cpu-medusa.yaml", "--dataset-name", "sharegpt",
                      "--dataset-path", bad, "--out", tmp_path / "run", "--no-progress")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert f"{bad}:2: field 'conversations[1].from': expected human, gpt or system, found 'robot'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
    proc = specdeploy("loadtest", ROOT / "configs" / "tiny-cpu-medusa.yaml", "--input-len", "normal:5",
                      "--out", tmp_path / "run", "--no-progress")
    assert proc.returncode == EXIT_USAGE and "--input-len: 'normal:5' is not a length" in proc.stderr, proc.stderr
