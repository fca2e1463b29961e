"""The build manifest, ``engines/NAME/manifest.json``: what ``specdeploy build`` produced for one
config (engine dirs per role, tokenizer, draft limits, the steps it ran, provenance). Written by
``build``; read by ``render`` (refused when the config hash differs), ``serve`` (the TensorRT-LLM
version check) and ``loadtest`` (the tokenizer for the re-tokenized cross-check); :func:`read_manifest`
is the one reader ``build`` and ``render`` share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from pipeline.artefacts.base import Artefact
from pipeline.errors import StaleInputError

MANIFEST_FORMAT = "specdeploy-manifest/1"


class BuildManifest(Artefact):
    """What one build produced, for the config whose hash it records."""

    SCHEMA = MANIFEST_FORMAT
    VERSION = 1
    FILE = "engines/NAME/manifest.json"
    WRITER = "specdeploy build"
    LEGACY_FORMAT = True

    format: str = Field("", description="The schema tag again, as manifests carried it before `schema`.")
    name: str = ""
    config_hash: str = Field(description="Hash of the config the engines were built from.")
    backend: str = "reference"
    method: str = "none"
    trtllm_version: str | None = None
    trtllm_runtime: str | None = Field(None, description="engine or llm_api (TensorRT-LLM backend only).")
    created: str | None = Field(None, description="ISO time the build finished (UTC).")
    tool_version: str | None = None
    git_sha: str | None = None
    engines: dict[str, str] = Field(description="Role (baseline, speculative, target, draft) → engine dir.")
    tokenizer_dir: str
    max_draft_len: int | None = None
    num_draft_tokens: int | None = None
    trtllm_root: str | None = None
    steps: list[dict[str, Any]] = Field(default_factory=list, description="One record per build step run.")
    versions: dict[str, str | None] = Field(default_factory=dict)


def read_manifest(path: Path, current_hash: str, *, check_engine_dirs: bool = True) -> dict[str, Any]:
    """The manifest at ``path``; :class:`StaleInputError` when it is missing, was built from a config
    whose hash is not ``current_hash``, or (``check_engine_dirs``) names engine dirs that are gone."""
    if not path.is_file():
        raise StaleInputError(f"{path} does not exist: run `specdeploy build` for '{path.parent.name}' first")
    manifest = BuildManifest.load(path).dump()
    if manifest.get("config_hash") != current_hash:
        raise StaleInputError(
            f"{path} was built from another config (config_hash {manifest.get('config_hash')} ≠ {current_hash}): "
            "re-run `specdeploy build`"
        )
    missing = [f"{role}={d}" for role, d in manifest.get("engines", {}).items() if not Path(d).is_dir()]
    if missing and check_engine_dirs:
        raise StaleInputError(f"{path} names engine dirs that are gone ({', '.join(missing)}): re-run `specdeploy build`")
    return manifest
