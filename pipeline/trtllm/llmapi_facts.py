"""The recorded TensorRT-LLM LLM-API facts (``llmapi_facts.yaml``) and the checks built on them.

Reads ``pipeline/trtllm/llmapi_facts.yaml`` (once per process): per release line (``"1.2"``,
``"1.3"``, ``"1.4"``) the ``speculative_config`` fields of each ``decoding_type``, the LLM arguments
specdeploy emits, and the Triton ``llmapi`` model's tensors. :func:`field_problems` checks a mapping
(the LLM arguments, a ``speculative_config``, a user's pass-through section) against one schema and
returns ``path: message`` lines — unknown field, wrong type, a value outside upstream's bounds —
so a config is refused before any GPU time rather than by the LLM constructor on the GPU host.
Writes nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FACTS_PATH = Path(__file__).with_name("llmapi_facts.yaml")


@functools.lru_cache(maxsize=1)
def load_facts() -> dict[str, Any]:
    return yaml.safe_load(FACTS_PATH.read_text(encoding="utf-8"))


def known_versions() -> list[str]:
    return sorted(load_facts()["versions"], key=lambda v: tuple(int(p) for p in v.split(".")))


def release_line(version: str) -> str:
    """``1.2.1`` → ``1.2``; ``1.3.0rc27`` → ``1.3``."""
    parts = version.split(".")
    return f"{parts[0]}.{''.join(c for c in parts[1] if c.isdigit())}"


@dataclass(frozen=True)
class VersionFacts:
    line: str
    data: dict[str, Any]

    @property
    def source(self) -> dict[str, str]:
        return self.data["source"]

    def citation(self) -> str:
        s = self.source
        return f"{s['repo']} {s['path']} ({s['ref']})"

    def decoding_type(self, name: str) -> dict[str, Any] | None:
        return self.data["decoding_types"].get(name)

    @property
    def llm_args(self) -> dict[str, Any]:
        return self.data["llm_args"]

    @property
    def eagle3_modes(self) -> list[str]:
        return list(self.data["eagle3_model_modes"])

    def engine_only_reason(self, decoding_type: str) -> str:
        return self.data["engine_only"][decoding_type]


def facts_for(version: str) -> VersionFacts | None:
    """The facts of ``version``'s release line, or None when none were recorded."""
    line = release_line(version)
    data = load_facts()["versions"].get(line)
    return VersionFacts(line, data) if data is not None else None


def triton_llmapi() -> dict[str, Any]:
    return load_facts()["triton_llmapi"]


# ----------------------------------------------------------------------------------------------
# Type checks (the small type language of the facts file)


def _scalar_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    return False


def type_ok(type_name: str, value: Any) -> bool:
    """Whether ``value`` (as YAML would carry it) fits ``type_name`` of the facts file."""
    optional = type_name.endswith("?")
    kind = type_name.rstrip("?")
    if value is None:
        return optional
    if kind.startswith("literal["):
        return value in kind[len("literal["):-1].split("|")
    if kind in ("list[int]", "set[int]"):
        return isinstance(value, list) and all(_scalar_ok("int", v) for v in value)
    if kind == "list[list[int]]":
        return isinstance(value, list) and all(type_ok("list[int]", v) for v in value)
    if kind == "dict[int,int]":
        return isinstance(value, dict) and all(_scalar_ok("int", k) and _scalar_ok("int", v) for k, v in value.items())
    return _scalar_ok(kind, value)


def _bound_problem(spec: dict[str, Any], value: Any) -> str | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    for key, ok, word in (("ge", lambda v, b: v >= b, "≥"), ("gt", lambda v, b: v > b, ">"),
                          ("le", lambda v, b: v <= b, "≤")):
        if key in spec and not ok(value, spec[key]):
            return f"must be {word} {spec[key]}, got {value}"
    return None


def field_problems(mapping: dict[str, Any], schema: dict[str, Any], path: str, where: str) -> list[str]:
    """``path.field: message`` lines for ``mapping`` against ``schema`` (``where`` names the upstream
    class and version in each message)."""
    problems = []
    for key, value in mapping.items():
        spec = schema.get(key)
        field_path = f"{path}.{key}" if path else str(key)
        if spec is None:
            problems.append(f"{field_path}: unknown field for {where} (known: {', '.join(sorted(schema))})")
            continue
        if not type_ok(spec["type"], value):
            problems.append(f"{field_path}: {where} expects {spec['type']}, got {type(value).__name__} {value!r}")
            continue
        bound = _bound_problem(spec, value)
        if bound:
            problems.append(f"{field_path}: {bound} ({where})")
        if isinstance(value, dict) and "fields" in spec:
            problems.extend(field_problems(value, spec["fields"], field_path, where))
    return problems
