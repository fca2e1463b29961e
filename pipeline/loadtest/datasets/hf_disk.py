"""A Hugging Face dataset already on disk, with its prompt (and category) columns named.

Accepted: a JSON / JSON Lines export (``Dataset.to_json``, or the ``*.json``/``*.jsonl`` files of a
downloaded dataset repository), read here with the standard library; and Arrow (``save_to_disk``)
or Parquet, read through ``pyarrow`` (a dependency of the ``loadtest`` extra; an install without it
gets a usage error that says how to export JSON instead). A directory is read file by file (sorted), a ``DatasetDict`` directory split
by split. ``prompt_column`` names the text, ``category_column`` the category (default: a
``category`` column when there is one, else ``hf``). A chat column (a list of ``{role, content}``)
works as the prompt column: its first user turn, or with ``multi_turn`` the history.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from pipeline.loadtest.datasets.base import (
    DatasetError,
    DatasetOptions,
    Row,
    conversation_row,
    iter_json_records,
    parse_messages,
    register,
    require_object,
)

JSON_SUFFIXES = (".json", ".jsonl")
TABLE_SUFFIXES = (".arrow", ".parquet")
META_FILES = {"dataset_info.json", "state.json", "dataset_dict.json"}


@register("hf", "a Hugging Face dataset on disk (JSON/JSONL export; Arrow/Parquet with pyarrow) with named columns",
          aliases=("huggingface",), directory=True)
def load(path: Path, options: DatasetOptions) -> list[Row]:
    files = _data_files(path)
    if not files:
        raise DatasetError(path, None, None, "holds no .json, .jsonl, .arrow or .parquet data files")
    rows: list[Row] = []
    for file in files:
        records = _table_records(file) if file.suffix in TABLE_SUFFIXES else iter_json_records(file)
        where = "row" if file.suffix in TABLE_SUFFIXES else "line"
        for n, value in records:
            rows.append(_row(file, n, value, options, where, len(rows)))
    return rows


def _data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in JSON_SUFFIXES + TABLE_SUFFIXES
                   and p.name not in META_FILES)
    return found


def _row(file: Path, n: int, value: Any, options: DatasetOptions, where: str, index: int) -> Row:
    obj = require_object(file, n, value, "a dataset row")
    column = options.prompt_column
    if column not in obj:
        raise DatasetError(file, n, column, f"no such column (columns: {', '.join(sorted(obj))}); "
                           "name the prompt column with loadtest.prompt_column", where=where)
    category_column = options.category_column or ("category" if "category" in obj else None)
    if options.category_column and options.category_column not in obj:
        raise DatasetError(file, n, options.category_column, f"no such column (columns: {', '.join(sorted(obj))})",
                           where=where)
    category = obj.get(category_column) if category_column else None
    category = str(category) if category not in (None, "") else (options.default_category or "hf")
    row_id = str(obj.get("id", obj.get("question_id", f"hf-{index}")))
    value = obj[column]
    if isinstance(value, list):  # a chat column
        messages = parse_messages(file, n, value, column)
        row = conversation_row(file, n, row_id, category, messages, options.multi_turn, column)
    elif isinstance(value, str) and value.strip():
        row = Row(id=row_id, category=category, prompt=value, source_line=n)
    else:
        raise DatasetError(file, n, column, f"expected non-empty text or a list of messages, found {value!r}",
                           where=where)
    return row


def _table_records(file: Path) -> Iterator[tuple[int, Any]]:
    """Rows of an Arrow or Parquet file, numbered from 1, through pyarrow (a soft dependency)."""
    try:
        import pyarrow  # noqa: PLC0415, F401 - optional: pyarrow (the loadtest extra; only Arrow/Parquet datasets need it)
    except ImportError:
        raise DatasetError(file, None, None, "Arrow/Parquet needs pyarrow (the loadtest extra installs it): "
                           "`pip install 'pyarrow<18'`, or export the dataset as JSON Lines "
                           "(`Dataset.to_json('prompts.jsonl')`) and pass that file") from None
    import pyarrow.ipc as ipc  # noqa: PLC0415 - optional: pyarrow (the loadtest extra; only Arrow/Parquet datasets need it)
    import pyarrow.parquet as pq  # noqa: PLC0415 - optional: pyarrow (the loadtest extra; only Arrow/Parquet datasets need it)

    try:
        if file.suffix == ".parquet":
            table = pq.read_table(file)
        else:  # save_to_disk writes the Arrow IPC stream format
            with open(file, "rb") as fh:
                table = ipc.open_stream(fh).read_all()
    except Exception as exc:  # noqa: BLE001 - any unreadable table is this file's error
        raise DatasetError(file, None, None, f"not a readable {file.suffix[1:]} table ({exc})") from None
    for i, record in enumerate(table.to_pylist(), 1):
        yield i, json.loads(json.dumps(record, default=str))
