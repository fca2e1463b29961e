"""A Mooncake-style trace (``kvcache-ai/Mooncake`` ``FAST25-release/*/…trace.jsonl``; AIPerf's
``mooncake_trace``, SGLang's ``mooncake``): one request per line,
``{timestamp, input_length, output_length, hash_ids}``, ``timestamp`` in milliseconds.

Each row exposes its arrival (``arrival_s``, seconds after the trace's first request: the
arrivals' trace replay schedules from it), its input and output lengths. A trace carries no text:
the prompt is cut from real text to ``input_length`` tokens in the target's tokenizer
(:mod:`pipeline.loadtest.lengths`) — never random token ids; a row's ``text_input`` is used
instead when it has one. ``hash_ids`` (prefix-cache block ids) are not reproduced: prompts built
from text share no planned prefixes (docs/workload.md). ``category`` when present, else ``trace``."""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.datasets.base import (
    DatasetError,
    DatasetOptions,
    Row,
    category_of,
    iter_jsonl,
    optional_int,
    register,
    require_object,
)


@register("mooncake_trace", "Mooncake-style trace JSONL: {timestamp (ms), input_length, output_length}",
          aliases=("mooncake", "trace"))
def load(path: Path, options: DatasetOptions) -> list[Row]:
    rows = []
    for n, value in iter_jsonl(path):
        obj = require_object(path, n, value, "{timestamp, input_length, output_length}")
        timestamp = obj.get("timestamp")
        if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or timestamp < 0:
            raise DatasetError(path, n, "timestamp", "missing" if timestamp is None else
                               f"expected milliseconds >= 0, found {timestamp!r}")
        text = obj.get("text_input")
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise DatasetError(path, n, "text_input", f"expected non-empty text, found {text!r}")
        input_len = optional_int(path, n, obj, "input_length", minimum=1)
        if input_len is None and text is None:
            raise DatasetError(path, n, "input_length", "missing (a trace row needs input_length or text_input)")
        output_len = optional_int(path, n, obj, "output_length", minimum=1)
        if output_len is None:
            raise DatasetError(path, n, "output_length", "missing")
        if rows and timestamp < rows[-1].arrival_s * 1000:
            raise DatasetError(path, n, "timestamp", f"{timestamp} ms is earlier than the line before "
                               f"({rows[-1].arrival_s * 1000:g} ms): a trace is in arrival order")
        rows.append(Row(id=str(obj.get("id", f"trace-{n}")), category=category_of(obj, options.default_category or "trace"),
                        prompt=text or "", input_len=None if text is not None else input_len, output_len=output_len,
                        arrival_s=timestamp / 1000.0, source_line=n))
    first = rows[0].arrival_s if rows else 0.0
    for row in rows:
        row.arrival_s = round(row.arrival_s - first, 6)
    return rows
