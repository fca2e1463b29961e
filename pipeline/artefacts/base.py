"""The base of every file one stage writes and a later stage reads (:class:`Artefact`): a pydantic
model that carries its ``schema`` (the family and major version, e.g. ``specdeploy-manifest/1``) and
``schema_version`` (that major version as an integer), refuses unknown keys, and loads with one
clear line when the file is missing, not JSON, of another schema or version, or malformed.
Reads and writes only the paths it is given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import StaleInputError
from pipeline.infra.atomic import write_text_atomic


class ArtefactError(StaleInputError):
    """An artefact file is missing, of another schema or version, or does not validate; the
    message names the file, what was expected and what was found, and the stage to re-run."""


def _json_schema_extra(schema: dict[str, Any], model: type) -> None:
    props = schema.get("properties", {})
    if getattr(model, "SCHEMA", None):
        props.get("schema", {}).update(const=model.SCHEMA, default=model.SCHEMA)
        props.get("schema_version", {}).update(const=model.VERSION, default=model.VERSION)
        if getattr(model, "LEGACY_FORMAT", False):
            props.get("format", {}).update(const=model.SCHEMA, default=model.SCHEMA)
    schema.setdefault("description", (model.__doc__ or "").strip().split("\n\n")[0])


def problem_lines(exc: ValidationError) -> list[str]:
    """``field.path: message`` per problem of a pydantic validation error."""
    return [f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()]


class Strict(BaseModel):
    """A nested section of an artefact: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class Artefact(BaseModel):
    """One file. Subclasses set ``SCHEMA`` (``specdeploy-<family>/<major>``), ``VERSION`` (the
    major), ``FILE`` (where it lives, for messages and docs) and ``WRITER`` (the command that
    writes it, named when a file must be regenerated). ``LEGACY_FORMAT``: the file also carries
    ``format`` (the same tag), as files written before ``schema`` existed did."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, json_schema_extra=_json_schema_extra)

    SCHEMA: ClassVar[str] = ""
    VERSION: ClassVar[int] = 0
    FILE: ClassVar[str] = ""
    WRITER: ClassVar[str] = ""
    LEGACY_FORMAT: ClassVar[bool] = False

    schema_name: str = Field("", alias="schema", description="Schema family and major version of this file.")
    schema_version: int = Field(0, description="Major version of the schema (an integer, for programs).")

    @model_validator(mode="before")
    @classmethod
    def _stamp(cls, data: Any) -> Any:
        """Fill in this model's schema tag on construction; a file of another tag is refused."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        problem = cls.schema_problem(data)
        if problem:
            raise ValueError(problem)
        data["schema"] = cls.SCHEMA
        data.pop("schema_name", None)
        data["schema_version"] = cls.VERSION
        if cls.LEGACY_FORMAT:
            data["format"] = cls.SCHEMA
        return data

    @classmethod
    def schema_problem(cls, data: dict) -> str | None:
        """What is wrong with the schema tag of ``data`` (None: right family and version, or a
        tag not given yet — a model being built in code)."""
        found_key, found = next(((k, data[k]) for k in ("schema", "schema_name", "format") if k in data), (None, None))
        if found_key is None:
            return None
        version = data.get("schema_version", cls.VERSION)
        if found == cls.SCHEMA and version == cls.VERSION and data.get("format", cls.SCHEMA) == cls.SCHEMA:
            return None
        shown = f"{found_key} {found!r}" + (f", schema_version {version!r}" if "schema_version" in data else "")
        return f"{shown}, expected schema {cls.SCHEMA!r} version {cls.VERSION}"

    @classmethod
    def load(cls, path: Path | str, data: dict | None = None):
        """The artefact in ``path`` (or ``data`` read from it); :class:`ArtefactError` otherwise."""
        path = Path(path)
        advice = f": re-run `{cls.WRITER}`" if cls.WRITER else ""
        if data is None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise ArtefactError(f"{path} does not exist{advice}") from None
            except (OSError, ValueError) as exc:
                raise ArtefactError(f"{path} is not readable JSON ({exc}){advice}") from None
        if not isinstance(data, dict):
            raise ArtefactError(f"{path}: expected a JSON object ({cls.SCHEMA}), found {type(data).__name__}{advice}")
        if not any(k in data for k in ("schema", "format")):
            raise ArtefactError(f"{path} carries no schema tag, expected schema {cls.SCHEMA!r} version {cls.VERSION} "
                                f"(written by an older specdeploy?){advice}")
        problem = cls.schema_problem(data)
        if problem:
            raise ArtefactError(f"{path}: {problem}{advice}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ArtefactError(f"{path} ({cls.SCHEMA}): " + "; ".join(problem_lines(exc)) + advice) from None

    @classmethod
    def checked(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with this schema's tag, after it validated (ValueError naming each bad field
        otherwise). The values are kept as given, so a file written through this keeps the
        numbers exactly as the stage computed them."""
        try:
            model = cls.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"{cls.SCHEMA}: " + "; ".join(problem_lines(exc))) from None
        tags = {"schema": model.schema_name, "schema_version": model.schema_version}
        if cls.LEGACY_FORMAT:
            tags["format"] = cls.SCHEMA
        rest = {k: v for k, v in data.items() if k not in tags}
        return {**tags, **rest}

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(by_alias=True, indent=indent) + "\n"

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def write(self, path: Path | str) -> Path:
        write_text_atomic(Path(path), self.to_json())
        return Path(path)
