"""OpenAI chat JSONL: one ``{"messages": [{role, content}], ...}`` per line (the fine-tuning and
batch format; AIPerf's ``single_turn``/``multi_turn`` carry the same messages). The first user turn
is the prompt, or with ``multi_turn`` the history up to the last user turn; an assistant turn after
it is the reference answer. ``id`` and ``category`` are read when present; ``max_tokens`` (or
``output_len``) is the row's own output length."""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.datasets.base import (
    DatasetOptions,
    Row,
    category_of,
    conversation_row,
    iter_jsonl,
    optional_int,
    parse_messages,
    register,
    require_object,
)


@register("openai_chat", "OpenAI chat JSONL: {messages: [{role, content}]} per line", aliases=("chat",))
def load(path: Path, options: DatasetOptions) -> list[Row]:
    rows = []
    for n, value in iter_jsonl(path):
        obj = require_object(path, n, value, "{messages}")
        messages = parse_messages(path, n, obj.get("messages"))
        row = conversation_row(path, n, str(obj["id"]) if obj.get("id") is not None else f"chat-{n}",
                               category_of(obj, options.default_category or "chat"), messages, options.multi_turn)
        row.output_len = optional_int(path, n, obj, "max_tokens", minimum=1) or optional_int(
            path, n, obj, "output_len", minimum=1)
        rows.append(row)
    return rows
