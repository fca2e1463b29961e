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

from pipeline.config import DeploymentConfig, Eagle3Spec, EagleSpec, MedusaSpec
from pipeline.errors import SpecdeployError
from pipeline.methods.eagle import fp8_route
from pipeline.trtllm import llmapi_checks
from pipeline.validate.findings import ERROR, INFO, CheckContext, spec_checkpoints, spec_roles
from pipeline.validate.model_shapes import known_shape, read_config_json, shape_from_config
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
            from pipeline.demo import resolve_builtin  # noqa: PLC0415 - trains on first use
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


# (what, glob patterns: any one match satisfies it, why) per role, for the files each route reads.
_REFERENCE_FILES = {
    "medusa heads": [("config.json", ("config.json",), ""), ("weights", ("medusa_lm_head.safetensors",), "")],
    "EAGLE head": [("config.json", ("config.json",), ""), ("weights", ("model.safetensors",), "")],
    "EAGLE-3 head": [("config.json", ("config.json",), ""), ("weights", ("model.safetensors",), "")],
    "model": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors",), ""),
              ("tokenizer", ("tokenizer.json",), "")],
}
# TensorRT-LLM routes: HF loaders read safetensors or .bin shards; the Medusa loader tries
# medusa_lm_head.pt then .safetensors (tensorrt_llm/models/medusa/weight.py load_medusa_hf); the
# EAGLE converter's ModelWeightsLoader reads safetensors, .bin or .pth.
_TRTLLM_FILES = {
    "medusa heads": [("config.json", ("config.json",), ""),
                     ("weights", ("medusa_lm_head.pt", "medusa_lm_head.safetensors"), "")],
    "EAGLE head": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors", "pytorch_model*.bin", "*.pth"), "")],
    "model": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors", "pytorch_model*.bin"), ""),
              ("tokenizer", ("tokenizer.json", "tokenizer.model"), "")],
    # the LLM API's EAGLE-3 drafter loads an HF-style checkpoint (safetensors or .bin)
    "EAGLE-3 head": [("config.json", ("config.json",), ""), ("weights", ("*.safetensors", "pytorch_model*.bin"), "")],
}
_EAGLE_FP8_WEIGHTS = ("weights", ("pytorch_model.bin",),
                      "examples/eagle/quantize.py loads exactly pytorch_model.bin from the EAGLE dir")


def eagle_fp8_route(cfg: DeploymentConfig) -> bool:
    """The quantized EAGLE route (examples/eagle/quantize.py, then convert_checkpoint.py)."""
    return isinstance(cfg.speculation, EagleSpec) and fp8_route(cfg.target)


def _required_files(cfg: DeploymentConfig, role: str) -> list[tuple[str, tuple[str, ...], str]]:
    table = _TRTLLM_FILES if cfg.backend == "trtllm" else _REFERENCE_FILES
    rules = table.get(role, table["model"])
    if role == "EAGLE head" and cfg.backend == "trtllm" and eagle_fp8_route(cfg):
        rules = [rules[0], _EAGLE_FP8_WEIGHTS]
    return rules


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
    from pipeline.validate.tokenizer_compat import compare_tokenizers  # noqa: PLC0415 - only this path needs it

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
    spec = ctx.cfg.speculation
    role = {"medusa": "medusa heads", "eagle": "EAGLE head", "eagle3": "EAGLE-3 head"}.get(ctx.cfg.method)
    directory = ctx.dirs.get(role) if role else None
    if directory is None or not (directory / "config.json").is_file():
        return
    try:
        head_cfg = read_config_json(directory)
    except (OSError, ValueError) as exc:
        ctx.add(ERROR, "files", f"{role}: unreadable config.json ({exc})", "restore the head's config.json",
                "speculation")
        return
    if isinstance(spec, Eagle3Spec):
        llmapi_checks.check_eagle3_head(ctx, head_cfg, ctx.shapes.get("target"))
        return
    weights = _head_weights(ctx.cfg, role, directory)
    if weights is None:
        return  # reported as a missing file
    try:
        shapes = tensor_shapes(weights)
    except UnreadableWeights as exc:
        ctx.add(INFO, "heads", f"{role}: tensor names not checked ({exc})", "", "speculation")
        return
    if isinstance(spec, MedusaSpec):
        _check_medusa_heads(ctx, spec, head_cfg, shapes, weights)
    else:
        _check_eagle_head(ctx, head_cfg, shapes, weights, directory)


def _head_weights(cfg: DeploymentConfig, role: str, directory: Path) -> Path | None:
    """The file the build route (or the CPU engine) reads the head's weights from."""
    (_, patterns, _), = [rule for rule in _required_files(cfg, role) if rule[0] == "weights"]
    for pattern in patterns:
        matches = sorted(directory.glob(pattern))
        if matches:
            return matches[0]
    return None


def _check_head_dims(ctx: CheckContext, role: str, field_path: str, dims: dict[str, int | None]) -> None:
    target = ctx.shapes.get("target")
    if target is None:
        return
    for key, expected in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        if dims.get(key) is not None and dims[key] != expected:
            ctx.add(ERROR, "heads", f"{role} {key} {dims[key]} does not match the target's {expected}",
                    "use heads trained for this target", field_path)


def _check_medusa_heads(ctx: CheckContext, spec: MedusaSpec, head_cfg: dict, shapes: dict, weights: Path) -> None:
    """Heads are counted in the weights: FasterDecoding's config.json says medusa_num_heads 2 for
    files holding more, and upstream builds with the explicit --num_medusa_heads."""
    field_path = "speculation.heads_dir"
    in_weights = 0
    while f"{in_weights}.1.weight" in shapes:
        in_weights += 1
    lm_head = shapes.get("0.1.weight")
    dims = {"vocab_size": lm_head[0], "hidden_size": lm_head[1]} if lm_head and len(lm_head) == 2 else {}
    _check_head_dims(ctx, "medusa heads", field_path, {**{k: head_cfg.get(k) for k in ("hidden_size", "vocab_size")}, **dims})
    if spec.num_heads > in_weights:
        missing = [f"{i}.1.weight" for i in range(in_weights, spec.num_heads)]
        ctx.add(ERROR, "heads", f"num_heads {spec.num_heads} but {weights.name} holds {in_weights} heads "
                f"(missing {', '.join(missing)})", f"set speculation.num_heads ≤ {in_weights}", "speculation.num_heads")
    declared = head_cfg.get("medusa_num_heads")
    if isinstance(declared, int) and declared != in_weights:
        ctx.add(INFO, "heads", f"medusa heads: config.json says medusa_num_heads {declared}, {weights.name} holds "
                f"{in_weights}; the build passes --num_medusa_heads {spec.num_heads} explicitly", "", field_path)


def _check_eagle_head(ctx: CheckContext, head_cfg: dict, shapes: dict, weights: Path, directory: Path) -> None:
    field_path = "speculation.head_dir"
    _check_head_dims(ctx, "EAGLE head", field_path, {k: head_cfg.get(k) for k in ("hidden_size", "vocab_size")})
    fp8_route = ctx.cfg.backend == "trtllm" and eagle_fp8_route(ctx.cfg)
    missing = [k for k in ("fc.weight", "fc.bias") if k not in shapes]
    if fp8_route and missing == ["fc.bias"]:
        ctx.add(INFO, "heads", "EAGLE head has no fc.bias; examples/eagle/quantize.py uses zeros for it", "", field_path)
    elif missing:
        ctx.add(ERROR, "heads", f"EAGLE head lacks {missing} in {weights.name} (convert_checkpoint.py fails with "
                "KeyError, NVIDIA/TensorRT-LLM#2588)", "use an EAGLE-1 checkpoint whose fc layer has a bias "
                "(the verified one is yuhuili/EAGLE-Vicuna-7B-v1.3), or the FP8 route, which tolerates its absence",
                field_path)
    if fp8_route:
        _check_eagle_layers(ctx, shapes, weights, directory, field_path)


def _check_eagle_layers(ctx: CheckContext, shapes: dict, weights: Path, directory: Path, field_path: str) -> None:
    """quantize.py copies layers.{i}.* for i < --eagle_num_layers (the head's num_hidden_layers)."""
    from pipeline.plan.planner import eagle_head_layers  # noqa: PLC0415 - only this path needs it

    layers = eagle_head_layers(str(directory))
    absent = [i for i in range(layers) if f"layers.{i}.self_attn.q_proj.weight" not in shapes]
    if absent:
        ctx.add(ERROR, "heads", f"EAGLE head config.json has num_hidden_layers {layers} but {weights.name} lacks "
                f"layers {absent} (examples/eagle/quantize.py --eagle_num_layers {layers} reads each)",
                "use the head's original config.json and weights", field_path)
