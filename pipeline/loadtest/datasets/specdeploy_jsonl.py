"""Our prompt set: a directory of ``<category>.jsonl`` files (or one file) of ``{id, category,
prompt}`` objects. ``category`` defaults to the file's stem, ``id`` to ``<stem>-<line>`` — so
vLLM's ``custom`` JSONL (``{"prompt": ...}`` per line) reads as well; an ``output_tokens`` (or
``output_len``) integer is the row's own output length."""

from __future__ import annotations

from pathlib import Path

from pipeline.loadtest.datasets.base import (
    DatasetError,
    DatasetOptions,
    Row,
    iter_jsonl,
    optional_int,
    register,
    require_object,
    require_text,
)


def files_of(path: Path) -> list[Path]:
    return sorted(path.glob("*.jsonl")) if path.is_dir() else [path]


@register("specdeploy", "our {id, category, prompt} JSONL: a directory of <category>.jsonl or one file",
          aliases=("jsonl", "custom"), directory=True)
def load(path: Path, options: DatasetOptions) -> list[Row]:
    files = files_of(path)
    if not files:
        raise DatasetError(path, None, None, "holds no <category>.jsonl prompt files")
    rows = []
    for file in files:
        for n, value in iter_jsonl(file):
            obj = require_object(file, n, value, "{id, category, prompt}")
            prompt = require_text(file, n, obj, "prompt")
            output_len = optional_int(file, n, obj, "output_tokens", minimum=1)
            if output_len is None:
                output_len = optional_int(file, n, obj, "output_len", minimum=1)
            category = obj.get("category")
            rows.append(Row(id=str(obj["id"]) if obj.get("id") is not None else f"{file.stem}-{n}",
                            category=str(category) if category not in (None, "") else
                            (options.default_category or file.stem),
                            prompt=prompt, output_len=output_len, source_line=n))
    return rows
