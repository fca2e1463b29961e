"""ShareGPT: a JSON array (or JSONL) of ``{id, conversations: [{from, value}]}``, as vLLM and
SGLang read ``ShareGPT_V3_unfiltered_cleaned_split.json``. ``from`` is human/user, gpt/chatgpt/
bard/bing/assistant, or system. The first human turn is the prompt and the reply after it the
reference answer (vLLM's ShareGPT output length); ``multi_turn`` sends the whole conversation up
to its last human turn. ShareGPT has no categories: a row's ``category`` when present, else
``sharegpt``."""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.datasets.base import (
    DatasetError,
    DatasetOptions,
    Row,
    category_of,
    conversation_row,
    iter_json_records,
    register,
    require_object,
)

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
            "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}


@register("sharegpt", "ShareGPT JSON: [{id, conversations: [{from, value}]}]")
def load(path: Path, options: DatasetOptions) -> list[Row]:
    rows = []
    for n, value in iter_json_records(path):
        obj = require_object(path, n, value, "{id, conversations}")
        turns = obj.get("conversations")
        if not isinstance(turns, list):
            raise DatasetError(path, n, "conversations", "missing" if turns is None else
                               f"expected a list of {{from, value}}, found {type(turns).__name__}")
        if not turns:
            continue  # the public file holds empty conversations; vLLM skips them too
        messages = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise DatasetError(path, n, f"conversations[{i}]", f"expected {{from, value}}, found {type(turn).__name__}")
            role = SPEAKERS.get(str(turn.get("from", "")).lower())
            if role is None:
                raise DatasetError(path, n, f"conversations[{i}].from",
                                   f"expected human, gpt or system, found {turn.get('from')!r}")
            if not isinstance(turn.get("value"), str):
                raise DatasetError(path, n, f"conversations[{i}].value", f"expected text, found {turn.get('value')!r}")
            messages.append({"role": role, "content": turn["value"]})
        row_id = str(obj["id"]) if obj.get("id") is not None else f"sharegpt-{n}"
        rows.append(conversation_row(path, n, row_id, category_of(obj, options.default_category or "sharegpt"),
                                     messages, options.multi_turn, "conversations"))
    return rows
