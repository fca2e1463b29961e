"""Preflight checks on the checkpoint directories: resolution, files, shapes, tokenizers, heads.

Reads (unless ``offline``) each checkpoint directory the config names — ``config.json``, weight-file
headers and tensor lists (:mod:`pipeline.validate.weight_files`), whether each weight file is whole
and of the architecture the deployment loads (:mod:`pipeline.validate.weight_integrity`), ``tokenizer.json`` or SentencePiece
``tokenizer.model``, ``tokenizer_config.json`` — in the formats each build route reads; ``builtin:``
checkpoints resolve through ``pipeline.demo.resolve_builtin``. Writes nothing: findings go to the
:class:`~pipeline.validate.findings.CheckContext`.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.errors import SpecdeployError
from pipeline.facts.model_shapes import known_shape, read_config_json, shape_from_config
from pipeline.validate.findings import ERROR, INFO, CheckContext, spec_checkpoints, spec_roles
from pipeline.validate.tokenizer_compat import compare_tokenizers
from pipeline.validate.weight_files import UnreadableWeights, index_problems, tensor_shapes
from pipeline.validate.weight_integrity import checkpoint_problems

# ----------------------------------------------------------------------------------------------
# Checkpoints: resolution, files, shapes


def checkpoint_dir_problem(directory: Path) -> str | None:
    """Why ``directory`` — a path the config names, as the build resolves it (``~`` expanded, a
    relative path against the working directory, as ``plan`` makes it absolute) — is not a usable
    directory, naming both forms of a relative path; None when it is one. For every build-host
    check that needs a directory to exist."""
    shown = str(directory) if directory.is_absolute() else (
        f"{directory} (relative to the working directory: {directory.absolute()})")
    if not directory.exists():
        return f"{shown} does not exist"
    if not directory.is_dir():
        return f"{shown} is not a directory"
    if not os.access(directory, os.R_OK | os.X_OK):
        return f"{shown} is not readable (permissions)"
    return None


def _resolve(ctx: CheckContext, role: str, path: str, checkpoint: str) -> Path | None:
    """Directory of ``checkpoint`` or None when it is not checked (offline / builtin not available)."""
    if checkpoint.startswith("builtin:"):
        if ctx.offline:
            ctx.add(INFO, "offline", f"{role}: builtin demo model not resolved offline", "", path)
            return None
        try:
            from pipeline.demo import resolve_builtin  # noqa: PLC0415 - optional: pipeline.demo (the demo models may be left out of an install; checked by the ImportError below)
        except ImportError:
            ctx.add(INFO, "files", f"{role}: builtin demo models are not available in this install; skipped",
                    "", path)
            return None
        try:
            return Path(resolve_builtin(checkpoint[len("builtin:"):]))
        except SpecdeployError as exc:
            ctx.add(ERROR, "files", f"{role}: {exc}", "use builtin:tiny-target, tiny-draft, tiny-medusa or tiny-eagle",
                    path)
            return None
    if ctx.offline:
        return None
    return Path(checkpoint).expanduser()


# (what, glob patterns: any one match satisfies it, why) for the files a model's route reads (a
# head's are its method's: Method.head_files). TensorRT-LLM's HF loaders read safetensors or .bin.
_MODEL_FILES = {
    "reference": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors",), ""),
                  ("tokenizer", ("tokenizer.json",), "")],
    "trtllm": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors", "pytorch_model*.bin"), ""),
               ("tokenizer", ("tokenizer.json", "tokenizer.model"), "")],
}


def _required_files(cfg: DeploymentConfig, role: str) -> list[tuple[str, tuple[str, ...], str]]:
    method = cfg.method_info
    if role == method.head_role:
        return [("config.json", ("config.json",), ""), method.head_weights(cfg)]
    return _MODEL_FILES[cfg.backend]


def check_files(ctx: CheckContext) -> None:
    skipped = []
    for role, path, checkpoint in spec_checkpoints(ctx.cfg):
        directory = _resolve(ctx, role, path, checkpoint)
        ctx.dirs[role] = directory
        if directory is None:
            if ctx.offline and not checkpoint.startswith("builtin:"):
                skipped.append(role)
            continue
        _check_dir(ctx, role, path, directory)
    if skipped:
        ctx.add(INFO, "offline", f"offline: skipped checkpoint files, tokenizer compatibility and head checks for "
                f"{', '.join(skipped)}", "run `specdeploy validate` without --offline on the build host")


def _check_dir(ctx: CheckContext, role: str, path: str, directory: Path) -> None:
    problem = checkpoint_dir_problem(directory)
    if problem:
        ctx.add(ERROR, "files", f"{role} checkpoint directory {problem}", "download the checkpoint or fix the path", path)
        ctx.dirs[role] = None
        return
    for what, patterns, why in _required_files(ctx.cfg, role):
        matches = sorted({m for pattern in patterns for m in directory.glob(pattern)})
        if not matches:
            ctx.add(ERROR, "files", f"{role}: {' or '.join(patterns)} missing in {directory}" + (f" ({why})" if why else ""),
                    _missing_fix(ctx.cfg, directory, what, patterns), path)
            continue
        for match in matches:
            if not _readable(match):
                ctx.add(ERROR, "files", f"{role}: {match} is not readable", "fix its permissions", path)
    for problem in index_problems(directory):
        ctx.add(ERROR, "files", f"{role}: {problem}", "download every shard the index names", path)


def check_weights(ctx: CheckContext) -> None:
    """Each resolved checkpoint's weight files whole, its tensors matching its config.json and
    its architecture one the deployment loads (:func:`~pipeline.validate.weight_integrity.checkpoint_problems`):
    a truncated download or a draft of another architecture fails here, not when ``serve`` loads it."""
    for role, path, _ in spec_checkpoints(ctx.cfg):
        directory = ctx.dirs.get(role)
        if directory is None:
            continue
        for problem in checkpoint_problems(ctx.cfg, role, directory):
            ctx.add(ERROR, "weights", f"{role}: {problem.message}", problem.fix, path)


def _missing_fix(cfg: DeploymentConfig, directory: Path, what: str, patterns: tuple[str, ...]) -> str:
    pickles = [p.name for p in directory.glob("*") if p.suffix in (".bin", ".pt", ".pth")]
    if cfg.backend == "reference" and what == "weights" and pickles:
        return ("the CPU reference engine loads safetensors only: convert the .bin/.pt weights to safetensors "
                "(or build with backend trtllm, which reads them)")
    return f"add {patterns[0]} to {directory} (download it with the checkpoint)"


def _readable(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.read(1)
        return True
    except OSError:
        return False


def load_shapes(ctx: CheckContext) -> None:
    for role, path, spec in spec_roles(ctx.cfg):
        directory = ctx.dirs.get(role)
        shape = None
        if directory is not None and (directory / "config.json").is_file():
            try:
                shape = shape_from_config(read_config_json(directory), f"{directory}/config.json")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                ctx.add(ERROR, "files", f"{role}: config.json is not a usable model config ({exc})",
                        "use the checkpoint's original config.json", path + ".checkpoint")
        elif directory is None and not spec.is_builtin:
            shape = known_shape(spec.checkpoint)
        ctx.shapes[role] = shape


def _has_tokenizer(directory: Path) -> bool:
    return (directory / "tokenizer.json").is_file() or (directory / "tokenizer.model").is_file()


def check_tokenizers(ctx: CheckContext) -> None:
    target_dir, draft_dir = ctx.dirs.get("target"), ctx.dirs.get("draft")
    if not ctx.cfg.method_info.draft_model or target_dir is None or draft_dir is None:
        return
    if not _has_tokenizer(target_dir) or not _has_tokenizer(draft_dir):
        return  # already reported as missing files
    try:
        problems = compare_tokenizers(target_dir, draft_dir)
    except (OSError, ValueError) as exc:
        ctx.add(ERROR, "tokenizer", f"cannot compare tokenizers: {exc}", "fix the tokenizer files",
                "speculation.draft.checkpoint")
        return
    for problem in problems:
        ctx.add(ERROR, "tokenizer", f"draft and target tokenizers differ: {problem}",
                "use a draft trained with the target's tokenizer (same family, e.g. Llama-3.2-1B for Llama-3.1)",
                "speculation.draft.checkpoint")


def check_heads(ctx: CheckContext) -> None:
    method = ctx.cfg.method_info
    role = method.head_role
    directory = ctx.dirs.get(role) if role else None
    if directory is None or not (directory / "config.json").is_file():
        return
    try:
        head_cfg = read_config_json(directory)
    except (OSError, ValueError) as exc:
        ctx.add(ERROR, "files", f"{role}: unreadable config.json ({exc})", "restore the head's config.json",
                "speculation")
        return
    method.check_head(ctx, head_cfg, lambda: _head_tensors(ctx, role, directory), directory)


def _head_tensors(ctx: CheckContext, role: str, directory: Path) -> tuple[dict, Path] | None:
    """(tensor shapes, weights file) of a head directory; None when the file is missing (reported as
    such) or unreadable (reported here)."""
    weights = _head_weights(ctx.cfg, role, directory)
    if weights is None:
        return None
    try:
        return tensor_shapes(weights), weights
    except UnreadableWeights as exc:
        ctx.add(INFO, "heads", f"{role}: tensor names not checked ({exc})", "", "speculation")
        return None


def _head_weights(cfg: DeploymentConfig, role: str, directory: Path) -> Path | None:
    """The file the build route (or the CPU engine) reads the head's weights from."""
    (_, patterns, _), = [rule for rule in _required_files(cfg, role) if rule[0] == "weights"]
    for pattern in patterns:
        matches = sorted(directory.glob(pattern))
        if matches:
            return matches[0]
    return None
