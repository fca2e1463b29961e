"""The registry, the row every format yields, and the readers the formats share.

A format is a function ``(path, options) -> list[Row]`` registered with :func:`register`. Readers
here keep the line each record starts on, so a malformed record is reported as
``file:line: field 'x': what is wrong`` (:class:`DatasetError`, exit 2) — for JSON arrays
(ShareGPT) too, where ``json.load`` would lose it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")


class DatasetError(UsageError):
    """A dataset record that cannot be used: names the file, the line (or row) and the field (exit 2)."""

    def __init__(self, path: Path | str, line: int | None, field_name: str | None, detail: str, *,
                 where: str = "line"):
        self.path, self.line, self.field, self.detail = str(path), line, field_name, detail
        place = f"{path}:{line}" if line is not None and where == "line" else (
            f"{path} ({where} {line})" if line is not None else str(path))
        super().__init__(f"{place}: " + (f"field '{field_name}': " if field_name else "") + detail)


@dataclass
class Row:
    """One request's data, the same for every format."""

    id: str
    category: str
    prompt: str  # the text sent (a chat history as a role-labelled transcript)
    messages: list[dict[str, str]] | None = None  # a whole conversation up to its last user turn (the chat API's)
    reference_output: str | None = None  # the recorded answer: its tokens are the dataset's own output length
    input_len: int | None = None  # a trace's input length (the prompt is cut from text to it)
    output_len: int | None = None  # a trace's (or the file's own) output length
    arrival_s: float | None = None  # a trace's arrival time, seconds from its first request
    source_line: int | None = None

    def as_prompt(self) -> dict[str, Any]:
        """The dict the load test carries (``lt_common`` reads ``id``, ``category``, ``prompt``)."""
        out: dict[str, Any] = {"id": self.id, "category": self.category, "prompt": self.prompt}
        for key in ("messages", "input_len", "output_len", "arrival_s"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class DatasetOptions:
    """What a format may need beside the path."""

    multi_turn: bool = False  # whole conversations instead of the first user turn
    prompt_column: str = "prompt"  # hf: the prompt's column
    category_column: str | None = None  # hf: the category's column (None: 'category' when present)
    default_category: str | None = None  # rows without a category get this (default: the format's name)


Loader = Callable[[Path, DatasetOptions], list[Row]]


@dataclass(frozen=True)
class Format:
    name: str
    loader: Loader
    summary: str
    aliases: tuple[str, ...] = field(default_factory=tuple)
    directory: bool = False  # the path may be a directory


FORMATS: dict[str, Format] = {}


def register(name: str, summary: str, *, aliases: tuple[str, ...] = (), directory: bool = False):
    """Register a loader under ``name`` (and the other tools' names for the same format)."""

    def wrap(loader: Loader) -> Loader:
        fmt = Format(name, loader, summary, aliases, directory)
        for key in (name, *aliases):
            FORMATS[key] = fmt
        return loader

    return wrap


def dataset_format(name: str) -> Format:
    fmt = FORMATS.get(name)
    if fmt is None:
        names = sorted({f.name for f in FORMATS.values()})
        raise UsageError(f"--dataset-name: unknown dataset format '{name}' (one of {', '.join(names)})")
    return fmt


def load_rows(name: str, path: Path, options: DatasetOptions | None = None) -> list[Row]:
    """The rows of ``path`` read as format ``name``; a usage error when the path is missing or empty."""
    fmt = dataset_format(name)
    options = options or DatasetOptions()
    if not path.exists():
        raise UsageError(f"--dataset-path: {path} does not exist")
    if path.is_dir() and not fmt.directory:
        raise UsageError(f"--dataset-path: {path} is a directory; format '{fmt.name}' reads one file")
    rows = fmt.loader(path, options)
    if not rows:
        raise DatasetError(path, None, None, f"no prompts in it (no usable record of format '{fmt.name}')")
    seen: dict[str, int | None] = {}
    for row in rows:
        if row.id in seen:
            raise DatasetError(path, row.source_line, "id", f"'{row.id}' repeats (first at line {seen[row.id]})")
        seen[row.id] = row.source_line
    return rows


# ------------------------------------------------------------------------------------------------
# Readers


def read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DatasetError(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(path, None, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def iter_jsonl(path: Path, text: str | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line."""
    text = read_text(path) if text is None else text
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, n, None, f"not JSON ({exc.msg} at column {exc.colno})") from None


def iter_json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """A JSON array's elements with the line each starts on, or a JSONL file's lines."""
    text = read_text(path)
    start = len(text) - len(text.lstrip())
    if not text[start:start + 1] == "[":
        yield from iter_jsonl(path, text)
        return
    decoder = json.JSONDecoder()
    i = _skip_space(text, start + 1)
    if text[i:i + 1] == "]":
        return
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise DatasetError(path, exc.lineno, None, f"not JSON ({exc.msg} at column {exc.colno})") from None
        yield line, value
        i = _skip_space(text, i)
        if text[i:i + 1] == ",":
            i = _skip_space(text, i + 1)
            continue
        if text[i:i + 1] == "]":
            return
        raise DatasetError(path, text.count("\n", 0, i) + 1, None, "not JSON (expected ',' or ']' between records)")


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def require_object(path: Path, line: int, value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise DatasetError(path, line, None, f"expected a JSON object ({what}), found {type(value).__name__}")
    return value


def require_text(path: Path, line: int, obj: dict, name: str, *, shown: str | None = None) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value.strip():
        problem = "missing" if name not in obj else f"expected non-empty text, found {_kind(value)}"
        raise DatasetError(path, line, shown or name, problem)
    return value


def optional_int(path: Path, line: int, obj: dict, name: str, *, minimum: int = 0) -> int | None:
    if obj.get(name) is None:
        return None
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DatasetError(path, line, name, f"expected an integer >= {minimum}, found {value!r}")
    return value


def category_of(obj: dict, fallback: str) -> str:
    value = obj.get("category")
    return str(value) if value not in (None, "") else fallback


def content_text(value: Any) -> str | None:
    """A message's text: a string, or the text parts of an OpenAI content list."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def parse_messages(path: Path, line: int, messages: Any, field_name: str = "messages") -> list[dict[str, str]]:
    """OpenAI-style ``[{role, content}]`` checked message by message."""
    if not isinstance(messages, list) or not messages:
        raise DatasetError(path, line, field_name, f"expected a non-empty list of messages, found {_kind(messages)}")
    out = []
    for i, message in enumerate(messages):
        where = f"{field_name}[{i}]"
        if not isinstance(message, dict):
            raise DatasetError(path, line, where, f"expected an object with role and content, found {_kind(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise DatasetError(path, line, f"{where}.role", f"expected one of {', '.join(ROLES)}, found {role!r}")
        text = content_text(message.get("content"))
        if text is None:
            raise DatasetError(path, line, f"{where}.content",
                               f"expected text (or a list of text parts), found {_kind(message.get('content'))}")
        out.append({"role": role, "content": text})
    return out


def conversation_row(path: Path, line: int, row_id: str, category: str, messages: list[dict[str, str]],
                     multi_turn: bool, field_name: str = "messages") -> Row:
    """A row from a conversation: its first user turn (and the answer after it), or for
    ``multi_turn`` the history up to its last user turn (and the answer after that)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].strip()]
    if not users:
        raise DatasetError(path, line, field_name, "no user turn with text")
    turn = users[-1] if multi_turn else users[0]
    answer = next((m["content"] for m in messages[turn + 1:] if m["role"] == "assistant"), None)
    history = messages[:turn + 1] if multi_turn else None
    if history is not None and len(history) == 1:
        history = None  # one turn: the prompt alone says it
    # transports without a chat API send the history as one role-labelled transcript
    prompt = messages[turn]["content"] if history is None else "\n\n".join(
        f"{m['role']}: {m['content']}" for m in history)
    return Row(id=row_id, category=category, prompt=prompt, messages=history,
               reference_output=answer or None, source_line=line)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__ if not isinstance(value, str) else "empty text"
