"""`specdeploy schema [ARTEFACT] [--format json|markdown]`: the config reference, or an artefact's
JSON schema, generated from the models.

Without ARTEFACT: reads the pydantic models in ``pipeline.config`` (never a config file); prints the
JSON schema or a Markdown table of every field path with its type, default and description. With
ARTEFACT (engine, manifest, deployment, run, runs, run-settings, record, report, compare): prints
the JSON schema of that file (:mod:`pipeline.artefacts`). Writes nothing.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipeline.errors import UsageError


def register(app: typer.Typer) -> None:
    @app.command("schema", help="Print the config reference (JSON schema or Markdown) generated from the pydantic "
                                "model, or the JSON schema of one artefact file (engine, manifest, deployment, "
                                "run, runs, run-settings, record, report, compare).")
    def schema_command(
        artefact: str = typer.Argument(None, help="An artefact (engine, manifest, deployment, run, runs, "
                                                  "run-settings, record, report, compare); omit for the config."),
        fmt: str = typer.Option("markdown", "--format", help="json or markdown (the config only)."),
    ) -> int:

        if artefact is not None:
            print(json.dumps(artefact_schema(artefact), indent=2, ensure_ascii=False))
        elif fmt == "json":
            print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
        elif fmt == "markdown":
            print(markdown_reference())
        else:
            raise UsageError(f"--format: '{fmt}' is not one of json, markdown")
        return 0


def artefact_schema(name: str) -> dict:
    from pipeline.artefacts import ARTEFACTS, artefact_model

    if name not in ARTEFACTS:
        raise UsageError(f"schema: '{name}' is not an artefact (choose from: {', '.join(ARTEFACTS)})")
    return artefact_model(name).model_json_schema(by_alias=True)


def json_schema() -> dict:
    from pipeline.config import DeploymentConfig

    return DeploymentConfig.model_json_schema()


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _default(info) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.default_factory() if info.default_factory is not None else info.default
    if isinstance(value, BaseModel):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def field_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(path, type, default, description) for every field, recursing into sections."""
    rows = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models_in(info.annotation)
        rows.append((path, _type_name(info.annotation), _default(info), (info.description or "").replace("|", "\\|")))
        if len(nested) == 1:
            rows.extend(field_rows(nested[0], path + "."))
        elif len(nested) > 1:  # discriminated union: a method row, then one block per method
            methods = [typing.get_args(v.model_fields["method"].annotation)[0] for v in nested]
            rows.append((f"{path}.method", " \\| ".join(repr(m) for m in methods), f"`{json.dumps(methods[0])}`",
                         "Selects the method; the rows marked (method=…) below apply to that method."))
            for variant, method in zip(nested, methods):
                rows.extend(
                    (f"{p} (method={method})", t, d, desc)
                    for p, t, d, desc in field_rows(variant, path + ".")
                    if p != f"{path}.method"
                )
    return rows


def markdown_reference() -> str:
    from pipeline.config import DeploymentConfig

    lines = [
        "# specdeploy config reference",
        "",
        "Generated from `pipeline/config.py` by `specdeploy schema --format markdown`. Unknown fields are errors.",
        "`speculation.method` selects one of: none, draft_target, medusa, eagle (engine runtime), eagle3, ngram, mtp",
        "(LLM-API runtime; ngram also on the CPU reference engine); the rows marked `(method=…)` apply to that",
        "method only.",
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{p}` | {t} | {d} | {desc} |" for p, t, d, desc in field_rows(DeploymentConfig)]
    from pipeline.config import LOADING_RULES_MARKDOWN

    lines += ["", LOADING_RULES_MARKDOWN.rstrip("\n")]
    return "\n".join(lines)
