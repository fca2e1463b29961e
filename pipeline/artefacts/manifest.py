"""The build manifest, ``engines/NAME/manifest.json``: what ``specdeploy build`` produced for one
config (engine dirs per role, tokenizer, draft limits, the steps it ran, provenance). Written by
``build``; read by ``render`` (refused when the config hash differs), ``serve`` (the TensorRT-LLM
version check) and ``loadtest`` (the tokenizer for the re-tokenized cross-check)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipeline.artefacts.base import Artefact

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
