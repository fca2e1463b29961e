"""What the load test reads and refuses before it starts anything: the prompt set and the draft-length sweep.

Reads the prompt set (``loadtest.prompts``: a directory of ``<category>.jsonl`` files of
``{id, category, prompt}`` objects), the config's speculation section and the speculative arm's
deployment descriptor (as ``render`` wrote it: does it take a draft length per request); writes nothing.
:class:`LoadTestError` is the stage's error; :class:`PromptSetError` names the config field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pipeline.artefacts.deployment import ArmDeployment
from pipeline.config import DeploymentConfig
from pipeline.errors import EXIT_USAGE, SpecdeployError
from pipeline.paths import PROJECT_ROOT

ARMS = ("baseline", "speculative")


class LoadTestError(SpecdeployError):
    """The load test could not be set up or run: the load harness failed (exit 5)."""


class LoadTestUsageError(LoadTestError):
    """A load-test option or input that cannot work as given (exit 2): nothing was measured."""

    exit_code = EXIT_USAGE


# ------------------------------------------------------------------------------------------------
# Inputs


class PromptSetError(LoadTestError):
    """The prompt set cannot be used: ``field`` is the config field, ``detail`` what is wrong (exit 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, field: str, detail: str):
        self.field, self.detail = field, detail
        super().__init__(f"{field}: {detail}")


def prompt_set_candidates(cfg: DeploymentConfig) -> list[Path]:
    """Where ``loadtest.prompts`` may be, in lookup order: as written when absolute; else under the
    working directory, the project root and the config file's directory."""
    base = Path(cfg.loadtest.prompts)
    candidates = [base] if base.is_absolute() else [Path.cwd() / base, PROJECT_ROOT / base]
    if cfg.source_path is not None and not base.is_absolute():
        candidates.append(cfg.source_path.parent / base)
    return list(dict.fromkeys(candidates))


def load_prompt_set(cfg: DeploymentConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Prompts from ``loadtest.prompts`` (a directory of <category>.jsonl, or one file)."""
    candidates = prompt_set_candidates(cfg)
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        looked = "" if Path(cfg.loadtest.prompts).is_absolute() else (
            " (a relative path is looked up under the working directory, the project root and the config's "
            "directory: " + ", ".join(str(p) for p in candidates) + ")")
        raise PromptSetError("loadtest.prompts", f"{cfg.loadtest.prompts} does not exist{looked}")
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise PromptSetError("loadtest.prompts", f"{path} holds no <category>.jsonl prompt files")
    prompts: list[dict[str, Any]] = []
    digest = hashlib.sha256()
    for file in files:
        content = _read_prompt_file(file)
        digest.update(file.name.encode() + b"\0" + content)
        for n, line in enumerate(content.decode("utf-8").splitlines(), 1):
            if line.strip():
                prompts.append(_prompt_row(file, n, line))
    if cfg.loadtest.categories:
        unknown = sorted(set(cfg.loadtest.categories) - {p["category"] for p in prompts})
        if unknown:
            raise PromptSetError("loadtest.categories", f"{unknown} not found in {path}")
        prompts = [p for p in prompts if p["category"] in cfg.loadtest.categories]
    if not prompts:
        raise PromptSetError("loadtest.prompts", f"no prompts in {path}")
    dataset = {"path": str(path), "files": [f.name for f in files], "n_prompts": len(prompts),
               "categories": sorted({p["category"] for p in prompts}), "sha256": digest.hexdigest(),
               "synthetic": any("synthetic" in f.name for f in files)}
    return prompts, dataset


def _read_prompt_file(file: Path) -> bytes:
    try:
        content = file.read_bytes()
        content.decode("utf-8")
    except OSError as exc:
        raise PromptSetError("loadtest.prompts", f"cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PromptSetError("loadtest.prompts", f"{file} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return content


def _prompt_row(file: Path, n: int, line: str) -> dict[str, str]:
    """One JSONL line: an object with ``id`` and a text ``prompt`` (``category`` defaults to the file's stem)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptSetError("loadtest.prompts", f"{file}:{n}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("prompt"), str):
        raise PromptSetError("loadtest.prompts", f"{file}:{n}: not an {{id, category, prompt}} object "
                             "(needs 'id' and a text 'prompt')")
    return {"id": str(row["id"]), "category": str(row.get("category", file.stem)), "prompt": row["prompt"]}


def primary_draft_len(cfg: DeploymentConfig) -> int | None:
    return cfg.method_info.primary_draft_len(cfg.speculation)


def check_sweep(cfg: DeploymentConfig, sweep: list[int], speculative: ArmDeployment | None) -> None:
    """``--sweep-draft-len`` can be sent: the method takes K per request and the speculative arm, as
    rendered (``speculative``: its descriptor; None when that arm is not measured), is the BLS that
    reads it, within the engine's draft limit."""
    if not sweep:
        return
    if not cfg.method_info.per_request_draft_len:
        raise LoadTestUsageError(
            f"--sweep-draft-len: method '{cfg.method}' fixes its draft length when the engine is built "
            "(Medusa heads / EAGLE tree, max_draft_len); build one deployment per length and load-test "
            "each. Per-request draft lengths exist only for draft_target (num_draft_tokens)."
        )
    if speculative is None:
        return  # the speculative arm is not measured: no draft length is sent
    if speculative.drafts == "engine":
        raise LoadTestUsageError(
            "--sweep-draft-len: speculation.orchestration 'engine' fixes num_draft_tokens in the engine; "
            "per-request draft lengths need orchestration 'bls'"
        )
    limit = speculative.max_draft_len
    too_long = [k for k in sweep if limit is not None and k > limit]
    if too_long:
        raise LoadTestUsageError(f"--sweep-draft-len: {too_long} exceed the engine's max_draft_len {limit}")
