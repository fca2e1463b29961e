"""Speculative-decoding category sets.

- Spec-Bench (``hemingkx/Spec-Bench`` ``data/spec_bench/question.jsonl``; vLLM's ``spec_bench``):
  ``{question_id, category, turns: [text, ...]}`` per line. The first turn is sent: a second turn
  needs the model's own first answer in its history, which a fixed request set cannot carry.
- SPEED-Bench (``nvidia/SPEED-Bench`` as prepared by its ``specdec_bench`` script; AIPerf's
  ``speed_bench``): ``{question_id, category, messages: [{role, content}]}`` per line; the first
  user turn, or with ``multi_turn`` the history up to the last one. The Hugging Face copy holds a
  placeholder instead of the text until that script fills it in: such a row is an error that says so.

Both carry the categories the report's per-category table then shows.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.datasets.base import (
    DatasetError,
    DatasetOptions,
    Row,
    conversation_row,
    iter_jsonl,
    parse_messages,
    register,
    require_object,
    require_text,
)

SPEED_BENCH_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"


def _id(obj: dict, prefix: str, line: int) -> str:
    value = obj.get("question_id")
    return str(value) if value is not None else f"{prefix}-{line}"


@register("spec_bench", "Spec-Bench question.jsonl: {question_id, category, turns}")
def load_spec_bench(path: Path, options: DatasetOptions) -> list[Row]:
    rows = []
    for n, value in iter_jsonl(path):
        obj = require_object(path, n, value, "{question_id, category, turns}")
        category = require_text(path, n, obj, "category")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns:
            raise DatasetError(path, n, "turns", "missing" if turns is None else "expected a non-empty list of text")
        if not isinstance(turns[0], str) or not turns[0].strip():
            raise DatasetError(path, n, "turns[0]", f"expected non-empty text, found {turns[0]!r}")
        rows.append(Row(id=_id(obj, "spec_bench", n), category=category, prompt=turns[0], source_line=n))
    return rows


@register("speed_bench", "SPEED-Bench JSONL: {question_id, category, messages}")
def load_speed_bench(path: Path, options: DatasetOptions) -> list[Row]:
    rows = []
    for n, value in iter_jsonl(path):
        obj = require_object(path, n, value, "{question_id, category, messages}")
        category = require_text(path, n, obj, "category")
        messages = parse_messages(path, n, obj.get("messages"))
        for i, message in enumerate(messages):
            if message["content"].strip() == SPEED_BENCH_PLACEHOLDER:
                raise DatasetError(path, n, f"messages[{i}].content",
                                   "is SPEED-Bench's placeholder: fill the text in with its specdec_bench script "
                                   "first (docs/workload.md)")
        rows.append(conversation_row(path, n, _id(obj, "speed_bench", n), category, messages, options.multi_turn))
    return rows
