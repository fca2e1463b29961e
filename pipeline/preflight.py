"""Preflight: everything that can be known to fail before a build starts.

Reads a validated :class:`DeploymentConfig`, the hardware profile and (unless ``offline``) the
checkpoint directories — ``config.json``, weight-file headers and tensor lists
(:mod:`pipeline.weight_files`), ``tokenizer.json`` or SentencePiece ``tokenizer.model``,
``tokenizer_config.json``; always the prompt set (``loadtest.prompts``) and this process's allowed
CPUs (``reference.cpu_pinning``); and, for the ``trtllm`` backend, whether each TensorRT-LLM script the
plan runs exists under the resolved examples root. Writes nothing. :func:`run_preflight` returns
:class:`Finding` s — error / warning / info, each with the field it concerns and the fix — covering
backend × hardware, GPU architecture × quantization and KV-cache dtype, the speculation method's
rules, parallelism, files (in the formats each build route reads), tokenizer compatibility and the
memory fit per GPU rank. The TensorRT-LLM runtime rules — which runtime the version has, which
methods each runs, and the LLM-API arguments against the recorded upstream facts — live in
``pipeline.trtllm.llmapi_checks``. ``builtin:`` checkpoints resolve through
``pipeline.reference.demo.resolve_builtin``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.config import DeploymentConfig, DraftTargetSpec, Eagle3Spec, EagleSpec, MedusaSpec, ModelSpec
from pipeline.errors import PreflightError, SpecdeployError
from pipeline.hardware import HardwareProfile, formats_supported_on, get_profile
from pipeline.gpu_layout import validate_estimate
from pipeline.memory_fit import MemoryEstimate
from pipeline.model_shapes import ModelShape, known_shape, read_config_json, shape_from_config
from pipeline.trtllm import llmapi_checks
from pipeline.trtllm.commands import KV_CACHE_QUANT_ALGO, paged_context_fmha_survives
from pipeline.weight_files import UnreadableWeights, hf_weight_files, index_problems, tensor_shapes

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass
class Finding:
    severity: str  # error | warning | info
    check: str  # short id of the check, e.g. "gpu-quant"
    message: str
    fix: str = ""
    field: str = ""
    data: dict[str, Any] | None = None

    def line(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{where}{self.message}" + (f" (fix: {self.fix})" if self.fix else "")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}


@dataclass
class _Context:
    cfg: DeploymentConfig
    profile: HardwareProfile
    offline: bool
    trtllm_root: str | None = None  # --trtllm-root, when given
    findings: list[Finding] = field(default_factory=list)
    dirs: dict[str, Path | None] = field(default_factory=dict)  # role → resolved dir (None = skipped)
    shapes: dict[str, ModelShape | None] = field(default_factory=dict)

    def add(self, severity: str, check: str, message: str, fix: str = "", field_path: str = "", **data: Any) -> None:
        self.findings.append(Finding(severity, check, message, fix, field_path, data or None))


# ----------------------------------------------------------------------------------------------
# Entry points


def run_preflight(cfg: DeploymentConfig, offline: bool = False, trtllm_root: str | None = None) -> list[Finding]:
    """All findings for ``cfg``; ``offline`` checks the config's logic without checkpoint files or
    TensorRT-LLM scripts (``trtllm_root``: the ``--trtllm-root`` override)."""
    ctx = _Context(cfg=cfg, profile=get_profile(cfg.hardware), offline=offline, trtllm_root=trtllm_root)
    for check in _CHECKS:
        check(ctx)
    return ctx.findings


def errors_of(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]


def raise_on_errors(findings: list[Finding]) -> None:
    """PreflightError with one line per error finding (for `run` and `build`)."""
    errors = errors_of(findings)
    if errors:
        raise PreflightError([f.line() for f in errors])


def memory_estimate_of(findings: list[Finding]) -> dict | None:
    for f in findings:
        if f.check == "memory-fit" and f.data and "estimate" in f.data:
            return f.data["estimate"]
    return None


# ----------------------------------------------------------------------------------------------
# Backend × hardware


def _check_backend(ctx: _Context) -> None:
    cfg, profile = ctx.cfg, ctx.profile
    if cfg.backend == "reference" and profile.is_gpu:
        ctx.add(ERROR, "backend", f"backend 'reference' is the CPU engine but hardware is '{cfg.hardware}'",
                "set hardware: cpu (or backend: trtllm for GPU engines)", "backend")
    if cfg.backend == "trtllm" and not profile.is_gpu:
        ctx.add(ERROR, "backend", "backend 'trtllm' needs a GPU but hardware is 'cpu'",
                "set backend: reference for the CPU path, or a GPU hardware profile", "backend")
    if cfg.backend == "reference":
        for path, spec in _models(cfg):
            if spec.world_size > 1:
                ctx.add(ERROR, "backend", "the CPU reference engine runs one process per model (no TP/PP)",
                        "set tp: 1 and pp: 1", f"{path}.tp")
    if cfg.backend == "trtllm" and cfg.runtime == "engine":
        _check_trtllm_version(ctx)
    llmapi_checks.check_runtime(ctx)


def _check_draft_weights(ctx: _Context) -> None:
    """``reference.draft_weights: int8`` quantizes draft-side weights of a float32 engine only."""
    cfg = ctx.cfg
    if cfg.reference.draft_weights != "int8":
        return
    if cfg.backend != "reference":
        ctx.add(WARNING, "draft-weights", "int8 draft weights are a CPU reference engine setting; TensorRT-LLM "
                "engines ignore it", "quantize the draft with speculation.draft.quantization, or remove it",
                "reference.draft_weights")
    elif cfg.method == "none":
        ctx.add(WARNING, "draft-weights", "int8 draft weights have no effect: this config does not speculate",
                "remove reference.draft_weights", "reference.draft_weights")
    elif cfg.reference.compute_dtype != "float32":
        ctx.add(WARNING, "draft-weights", f"int8 draft weights are ignored with compute_dtype {cfg.reference.compute_dtype}",
                "use compute_dtype: float32, or draft_weights: float", "reference.draft_weights")
    elif isinstance(cfg.speculation, DraftTargetSpec) and cfg.speculation.orchestration == "bls":
        ctx.add(WARNING, "draft-weights", "int8 draft weights reach the in-engine draft only: with orchestration "
                "bls the served tensorrt_llm_draft engine keeps the checkpoint's weights",
                "set speculation.orchestration: engine, or speculation.draft.quantization.format: int8_wo",
                "reference.draft_weights")


def _check_trtllm_version(ctx: _Context) -> None:
    """Engine-runtime versions (past 1.2.x: ``llmapi_checks.check_runtime``)."""
    cfg = ctx.cfg
    version = cfg.trtllm_version_tuple[:2]
    if version < (0, 12):
        ctx.add(ERROR, "version", f"TensorRT-LLM {cfg.trtllm_version} predates the supported build flags",
                "use 0.12 or newer (1.2.1 recommended)", "trtllm_version")
    if cfg.method == "eagle" and version < (0, 15):
        ctx.add(ERROR, "version", "EAGLE needs TensorRT-LLM ≥ 0.15", "raise trtllm_version", "trtllm_version")
    draft_logits = isinstance(cfg.speculation, DraftTargetSpec) and cfg.speculation.use_draft_logits
    if draft_logits and version < (0, 15):
        ctx.add(ERROR, "version", "draft logits (fast logits) need TensorRT-LLM ≥ 0.15", "raise trtllm_version",
                "trtllm_version")


# ----------------------------------------------------------------------------------------------
# GPU architecture × quantization × KV-cache dtype


def _format_fix(fmt: str, profile: HardwareProfile) -> str:
    if fmt in ("fp8", "w4a8_awq") and profile.sm < 89:
        return "use int4_awq (W4A16) or int8_sq on Ampere, or pick an H100/H200 profile"
    if fmt == "nvfp4":
        return "NVFP4 is Blackwell-only: use fp8 on Hopper/Ada, int4_awq on Ampere, or hardware b200-180gb"
    if not profile.is_gpu:
        return "the CPU reference engine supports format none or int8_wo"
    supported = ", ".join(profile.weight_formats)
    return f"use one of: {supported}"


def _paged_context_fmha_survives(spec: ModelSpec, profile: HardwareProfile) -> bool:
    q = spec.quantization
    return paged_context_fmha_survives(q.format, q.kv_cache_dtype, profile.sm)


def _check_quantization(ctx: _Context) -> None:
    for path, spec in _models(ctx.cfg):
        _check_model_quantization(ctx, path, spec)
    llmapi_checks.check_quantization(ctx)


def _check_model_quantization(ctx: _Context, path: str, spec: ModelSpec) -> None:
    cfg, profile = ctx.cfg, ctx.profile
    q = spec.quantization
    if q.format not in profile.weight_formats:
        where = ", ".join(formats_supported_on(q.format)) or "no profile"
        ctx.add(ERROR, "gpu-quant", f"weight format {q.format} is not supported on {profile.display_name} "
                f"(supported on: {where})", _format_fix(q.format, profile), f"{path}.quantization.format")
    if q.kv_cache_dtype not in profile.kv_cache_dtypes:
        ctx.add(ERROR, "kv-dtype", f"KV-cache dtype {q.kv_cache_dtype} is not available on {profile.display_name}",
                f"use one of: {', '.join(profile.kv_cache_dtypes)}", f"{path}.quantization.kv_cache_dtype")
    elif profile.is_gpu and not cfg.uses_llm_api and not _paged_context_fmha_survives(spec, profile):
        _report_paged_fmha_loss(ctx, path, spec)
    if q.format in ("int4_awq", "w4a8_awq") and q.calibration_size > 32:
        ctx.add(INFO, "calibration", f"AWQ caps calibration_size at 32 (configured {q.calibration_size})",
                "set calibration_size: 32 to say what will run", f"{path}.quantization.calibration_size")
    if cfg.backend == "trtllm" and spec.dtype == "float32":
        ctx.add(WARNING, "dtype", "float32 engines double weight memory and run far slower than bfloat16",
                "use dtype: bfloat16 (or float16)", f"{path}.dtype")
    if spec.trust_remote_code:
        ctx.add(WARNING, "security", "trust_remote_code runs Python code shipped with the checkpoint",
                "leave it false unless you trust the checkpoint's source", f"{path}.trust_remote_code")


def _paged_fmha_needed_by(cfg: DeploymentConfig) -> str | None:
    """Why this deployment cannot run without paged context FMHA (None: it can)."""
    if cfg.method == "draft_target":
        return "draft-target needs it on both engines (KV-cache reuse)"
    if cfg.method == "eagle":
        return ("EAGLE needs it: the builder turns it back on and the attention plugin then refuses this KV dtype "
                "at the first context step")
    if cfg.triton.enable_kv_cache_reuse:
        return ("KV-cache reuse (triton.enable_kv_cache_reuse) needs it, and the post-build check refuses an engine "
                "without it")
    return None


def _report_paged_fmha_loss(ctx: _Context, path: str, spec: ModelSpec) -> None:
    """The 1.x builder (tensorrt_llm/builder.py build()) drops ``--use_paged_context_fmha`` for FP8
    KV without FP8 context FMHA (weights other than fp8/w4a8_awq/nvfp4, or below sm89) and for INT8
    KV; where the deployment relies on it that is an error for every method."""
    q = spec.quantization
    why = (f"KV-cache dtype {q.kv_cache_dtype} with weight format {q.format} on sm{ctx.profile.sm} makes "
           "trtllm-build switch use_paged_context_fmha off")
    fix = "keep kv_cache_dtype auto (FP16/BF16)" + (
        "; FP8 KV keeps paged context FMHA only with fp8/w4a8_awq weights on sm ≥ 89" if q.kv_cache_dtype == "fp8" else "")
    field_path = f"{path}.quantization.kv_cache_dtype"
    needed = _paged_fmha_needed_by(ctx.cfg)
    if needed:
        extra = ", or set triton.enable_kv_cache_reuse: false" if ctx.cfg.method in ("none", "medusa") else ""
        ctx.add(ERROR, "kv-dtype", f"{why}; {needed}", fix + extra, field_path)
    else:
        ctx.add(INFO, "kv-dtype", why + "; the plan builds it with --use_paged_context_fmha disable (no chunked "
                "context, no KV reuse)", fix, field_path)


# ----------------------------------------------------------------------------------------------
# Speculation method rules (structure is validated in config.py; these need the whole picture)


def _check_method(ctx: _Context) -> None:
    cfg = ctx.cfg
    spec = cfg.speculation
    if cfg.method != "none" and cfg.build.max_beam_width != 1:
        ctx.add(ERROR, "method", f"speculative decoding has no beam search (max_beam_width {cfg.build.max_beam_width})",
                "set build.max_beam_width: 1", "build.max_beam_width")
    if isinstance(spec, DraftTargetSpec):
        _check_draft_target(ctx, spec)
    elif isinstance(spec, EagleSpec):
        _check_eagle(ctx, spec)
    elif isinstance(spec, MedusaSpec):
        _check_medusa(ctx, spec)


def _check_draft_target(ctx: _Context, spec: DraftTargetSpec) -> None:
    cfg = ctx.cfg
    if spec.use_draft_logits and not cfg.build.gather_generation_logits:
        ctx.add(ERROR, "method", "use_draft_logits needs generation logits from both engines",
                "set build.gather_generation_logits: true", "build.gather_generation_logits")
    if cfg.build.gather_generation_logits and not spec.use_draft_logits:
        ctx.add(WARNING, "method", "gather_generation_logits without use_draft_logits costs memory for nothing",
                "set build.gather_generation_logits: false or speculation.use_draft_logits: true",
                "build.gather_generation_logits")
    if cfg.uses_llm_api:
        return  # no BLS and no engines: the LLM API drafts inside its executor
    if cfg.backend == "trtllm" and not cfg.triton.enable_kv_cache_reuse:
        ctx.add(ERROR, "method", "the draft-target target engine requires KV-cache reuse at runtime",
                "set triton.enable_kv_cache_reuse: true", "triton.enable_kv_cache_reuse")
    if cfg.backend == "trtllm" and ctx.profile.sm < 89 and ctx.profile.is_gpu:
        ctx.add(INFO, "method", "draft-target through the Triton BLS has known problems on A100 and at TP4 "
                "(NVIDIA/TensorRT-LLM#2684, #2709)", "smoke-test each engine alone through the ensemble first",
                "hardware")
    if cfg.backend == "trtllm":
        _check_draft_target_lengths(ctx)


def _check_draft_target_lengths(ctx: _Context) -> None:
    """The BLS sends the whole context (prompt + accepted tokens) to both engines every round, so
    the plan builds them with max_input_len = max_seq_len − 1; one engine step must then hold such
    an input unless chunked context splits it (the executor refuses it otherwise)."""
    b = ctx.cfg.build
    longest = b.max_seq_len - 1
    ctx.add(INFO, "build", f"draft-target engines are built with max_input_len {longest} (max_seq_len − 1), not "
            f"{b.max_input_len}: every draft and verify call re-sends the whole context", "", "build.max_input_len")
    chunked = bool(getattr(ctx.cfg.triton, "enable_chunked_context", False))
    if b.max_num_tokens < longest and not chunked:
        ctx.add(ERROR, "build", f"max_num_tokens ({b.max_num_tokens}) is below the longest draft-target context "
                f"({longest} = max_seq_len − 1): a request whose prompt plus generated tokens passes "
                f"{b.max_num_tokens} fails mid-generation", f"raise build.max_num_tokens to ≥ {longest}",
                "build.max_num_tokens")


def _check_eagle(ctx: _Context, spec: EagleSpec) -> None:  # noqa: ARG001 - tree rules live in config
    cfg = ctx.cfg
    if cfg.build.max_batch_size > 512:
        ctx.add(ERROR, "method", f"EAGLE engines allow max_batch_size ≤ 512 (configured {cfg.build.max_batch_size})",
                "set build.max_batch_size: 512 or less", "build.max_batch_size")
    if cfg.target.pp != 1:
        ctx.add(ERROR, "method", "EAGLE does not support pipeline parallelism", "set target.pp: 1 (use tp)",
                "target.pp")
    if cfg.backend == "trtllm" and cfg.target.quantization.format not in ("none", "fp8"):
        ctx.add(ERROR, "method", f"quantized EAGLE is FP8 only (configured {cfg.target.quantization.format})",
                "use target.quantization.format: fp8 or none", "target.quantization.format")


def _check_medusa(ctx: _Context, spec: MedusaSpec) -> None:
    cfg = ctx.cfg
    if cfg.backend == "trtllm" and not cfg.loadtest.sampling.greedy:
        ctx.add(WARNING, "method", "TensorRT-LLM verifies Medusa drafts greedily; sampled load tests compare unlike arms",
                "set loadtest.sampling.top_k: 1", "loadtest.sampling.top_k")
    if cfg.backend == "trtllm" and cfg.target.quantization.format not in ("none", "fp8"):
        ctx.add(WARNING, "method", f"Medusa is documented for FP16/BF16 and FP8 bases, not "
                f"{cfg.target.quantization.format}", "use target.quantization.format: fp8 or none",
                "target.quantization.format")
    if cfg.build.max_batch_size > 16:
        ctx.add(INFO, "method", f"Medusa gains shrink with batch size (max_batch_size {cfg.build.max_batch_size})",
                "load-test the concurrency you deploy at", "build.max_batch_size")


# ----------------------------------------------------------------------------------------------
# Build limits and parallelism


def _check_build_limits(ctx: _Context) -> None:
    cfg, b = ctx.cfg, ctx.cfg.build
    if b.max_input_len > b.max_num_tokens:
        ctx.add(WARNING, "build", f"max_input_len ({b.max_input_len}) exceeds max_num_tokens ({b.max_num_tokens}); "
                "long prompts need chunked context", "raise build.max_num_tokens to ≥ max_input_len",
                "build.max_num_tokens")
    room = b.max_seq_len - b.max_input_len
    if cfg.loadtest.max_tokens > room:
        ctx.add(WARNING, "build", f"loadtest.max_tokens ({cfg.loadtest.max_tokens}) exceeds max_seq_len − max_input_len "
                f"({room}); long prompts will be cut short", "raise build.max_seq_len or lower loadtest.max_tokens",
                "loadtest.max_tokens")
    devices = ctx.profile.devices_per_node
    for path, spec in _models(cfg):
        if ctx.profile.is_gpu and spec.world_size > devices:
            ctx.add(ERROR, "parallelism", f"TP×PP = {spec.world_size} exceeds the {devices} GPUs of one node",
                    f"use tp × pp ≤ {devices}", f"{path}.tp")


def _check_scripts(ctx: _Context) -> None:
    """Each TensorRT-LLM script the plan runs exists under the resolved examples root (on the
    build host only: offline there is nothing to look at)."""
    cfg = ctx.cfg
    if cfg.backend != "trtllm":
        return
    if ctx.offline:
        ctx.add(INFO, "offline", "offline: TensorRT-LLM example scripts not looked for",
                "run `specdeploy validate` without --offline on the build host")
        return
    from pipeline.plan import make_plan  # noqa: PLC0415 - plan imports preflight's neighbours
    from pipeline.trtllm.layout import missing_scripts, missing_scripts_fix  # noqa: PLC0415

    try:
        plan = make_plan(cfg, ctx.trtllm_root)
    except SpecdeployError:
        return  # the config problem is reported by the checks that own it
    if cfg.uses_llm_api:
        from pipeline.trtllm.llmapi_plan import missing_modelopt_scripts  # noqa: PLC0415

        for message, fix in missing_modelopt_scripts(plan):
            ctx.add(ERROR, "scripts", message, fix, "llm_api.modelopt_root")
        return
    missing = missing_scripts(plan.steps, plan.trtllm_root.path)
    fix = missing_scripts_fix(missing, plan.trtllm_root.path, cfg.trtllm_version) if missing else ""
    for script in missing:
        ctx.add(ERROR, "scripts", f"{script.path} (step {script.step}) does not exist under the TensorRT-LLM "
                f"examples root {plan.trtllm_root.path} (from {plan.trtllm_root.source})", fix, "trtllm_root")


def _check_shapes(ctx: _Context) -> None:
    """Rules that need the model's shape (config.json, or the known-model table offline)."""
    for role, path, spec in _roles(ctx.cfg):
        shape = ctx.shapes.get(role)
        if shape is None:
            continue
        for what, count in (("KV heads", shape.num_kv_heads), ("attention heads", shape.num_heads)):
            if count % spec.tp:
                ctx.add(ERROR, "parallelism", f"tp {spec.tp} does not divide the {count} {what} of the {role}",
                        f"use a tp that divides {count}", f"{path}.tp")
                break
        if spec.pp > 1 and shape.num_layers % spec.pp:
            ctx.add(WARNING, "parallelism", f"pp {spec.pp} splits {shape.num_layers} layers unevenly",
                    "use a pp that divides the layer count", f"{path}.pp")
        max_pos = shape.max_position_embeddings
        if max_pos and ctx.cfg.build.max_seq_len > max_pos:
            ctx.add(WARNING, "build", f"max_seq_len {ctx.cfg.build.max_seq_len} exceeds the {role}'s "
                    f"max_position_embeddings ({max_pos})", f"set build.max_seq_len ≤ {max_pos}", "build.max_seq_len")
    target = ctx.shapes.get("target")
    if ctx.cfg.method == "eagle" and target is not None and not target.is_llama:
        ctx.add(ERROR, "method", f"EAGLE in TensorRT-LLM needs a LLaMA-architecture base, got {target.architecture}",
                "use a LLaMA-family target or another method", "target.checkpoint")
    target_dir = ctx.dirs.get("target")
    target_config = None
    if ctx.cfg.method == "mtp" and target_dir is not None and (target_dir / "config.json").is_file():
        try:
            target_config = read_config_json(target_dir)
        except (OSError, ValueError):
            target_config = None  # reported by _load_shapes
    llmapi_checks.check_mtp_target(ctx, target_dir, target_config, target)
    draft = ctx.shapes.get("draft")
    if target is not None and draft is not None and target.vocab_size != draft.vocab_size:
        ctx.add(ERROR, "tokenizer", f"vocab_size differs: target {target.vocab_size} ({target.source}) vs draft "
                f"{draft.vocab_size} ({draft.source})", "pick a draft from the target's model family",
                "speculation.draft.checkpoint")


# ----------------------------------------------------------------------------------------------
# Checkpoints: resolution, files, shapes


def _resolve(ctx: _Context, role: str, path: str, checkpoint: str) -> Path | None:
    """Directory of ``checkpoint`` or None when it is not checked (offline / builtin not available)."""
    if checkpoint.startswith("builtin:"):
        if ctx.offline:
            ctx.add(INFO, "offline", f"{role}: builtin demo model not resolved offline", "", path)
            return None
        try:
            from pipeline.reference.demo import resolve_builtin  # noqa: PLC0415 - trains on first use
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
    q = cfg.target.quantization
    return cfg.method == "eagle" and (q.format != "none" or q.kv_cache_dtype in KV_CACHE_QUANT_ALGO)


def _required_files(cfg: DeploymentConfig, role: str) -> list[tuple[str, tuple[str, ...], str]]:
    table = _TRTLLM_FILES if cfg.backend == "trtllm" else _REFERENCE_FILES
    rules = table.get(role, table["model"])
    if role == "EAGLE head" and cfg.backend == "trtllm" and eagle_fp8_route(cfg):
        rules = [rules[0], _EAGLE_FP8_WEIGHTS]
    return rules


def _check_files(ctx: _Context) -> None:
    skipped = []
    for role, path, checkpoint in _checkpoints(ctx.cfg):
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


def _check_dir(ctx: _Context, role: str, path: str, directory: Path) -> None:
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


def _load_shapes(ctx: _Context) -> None:
    for role, path, spec in _roles(ctx.cfg):
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


def _check_tokenizers(ctx: _Context) -> None:
    target_dir, draft_dir = ctx.dirs.get("target"), ctx.dirs.get("draft")
    if ctx.cfg.method != "draft_target" or target_dir is None or draft_dir is None:
        return
    if not _has_tokenizer(target_dir) or not _has_tokenizer(draft_dir):
        return  # already reported as missing files
    from pipeline.tokenizer_compat import compare_tokenizers  # noqa: PLC0415

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


def _check_heads(ctx: _Context) -> None:
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


def _check_head_dims(ctx: _Context, role: str, field_path: str, dims: dict[str, int | None]) -> None:
    target = ctx.shapes.get("target")
    if target is None:
        return
    for key, expected in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        if dims.get(key) is not None and dims[key] != expected:
            ctx.add(ERROR, "heads", f"{role} {key} {dims[key]} does not match the target's {expected}",
                    "use heads trained for this target", field_path)


def _check_medusa_heads(ctx: _Context, spec: MedusaSpec, head_cfg: dict, shapes: dict, weights: Path) -> None:
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


def _check_eagle_head(ctx: _Context, head_cfg: dict, shapes: dict, weights: Path, directory: Path) -> None:
    field_path = "speculation.head_dir"
    _check_head_dims(ctx, "EAGLE head", field_path, {k: head_cfg.get(k) for k in ("hidden_size", "vocab_size")})
    fp8_route = ctx.cfg.backend == "trtllm" and eagle_fp8_route(ctx.cfg)
    missing = [k for k in ("fc.weight", "fc.bias") if k not in shapes]
    if fp8_route and missing == ["fc.bias"]:
        ctx.add(INFO, "heads", f"EAGLE head has no fc.bias; examples/eagle/quantize.py uses zeros for it", "", field_path)
    elif missing:
        ctx.add(ERROR, "heads", f"EAGLE head lacks {missing} in {weights.name} (convert_checkpoint.py fails with "
                "KeyError, NVIDIA/TensorRT-LLM#2588)", "use an EAGLE-1 checkpoint whose fc layer has a bias "
                "(the verified one is yuhuili/EAGLE-Vicuna-7B-v1.3), or the FP8 route, which tolerates its absence",
                field_path)
    if fp8_route:
        _check_eagle_layers(ctx, shapes, weights, directory, field_path)


def _check_eagle_layers(ctx: _Context, shapes: dict, weights: Path, directory: Path, field_path: str) -> None:
    """quantize.py copies layers.{i}.* for i < --eagle_num_layers (the head's num_hidden_layers)."""
    from pipeline.plan import eagle_head_layers  # noqa: PLC0415

    layers = eagle_head_layers(str(directory))
    absent = [i for i in range(layers) if f"layers.{i}.self_attn.q_proj.weight" not in shapes]
    if absent:
        ctx.add(ERROR, "heads", f"EAGLE head config.json has num_hidden_layers {layers} but {weights.name} lacks "
                f"layers {absent} (examples/eagle/quantize.py --eagle_num_layers {layers} reads each)",
                "use the head's original config.json and weights", field_path)


# ----------------------------------------------------------------------------------------------
# Memory fit


def _check_memory(ctx: _Context) -> None:
    target, draft = ctx.shapes.get("target"), ctx.shapes.get("draft")
    if target is None or (ctx.cfg.method == "draft_target" and draft is None):
        ctx.add(INFO, "memory-fit", "memory fit not estimated: model shape unknown (no config.json and not a known "
                "example model)", "run without --offline where the checkpoints are")
        return
    est, layout, problem = validate_estimate(ctx.cfg, ctx.profile, target, draft)
    if problem:
        ctx.add(ERROR, "memory-fit", problem, "use more GPUs (triton.gpus), lower build.max_batch_size or "
                "build.max_seq_len, or quantize", "triton.arm_placement")
    elif layout is not None and layout.strategy not in ("single-arm", "cpu"):
        ctx.add(INFO, "memory", f"arms {layout.strategy} on GPUs {list(layout.host_gpus)} ({layout.gpus_source}), "
                f"KV capacity {layout.kv_tokens} tokens per model: {layout.reason}", "", "triton.arm_placement")
    _report_memory(ctx, est)


def _report_memory(ctx: _Context, est: MemoryEstimate) -> None:
    data = {"estimate": est.to_dict()}
    summary = f"{est.total_gib:.1f} GiB of {est.device_gib:.1f} GiB per GPU (rank 0)"
    fix = "lower build.max_batch_size or build.max_seq_len, quantize weights/KV, or raise tp"
    if not est.fits:
        ctx.add(ERROR, "memory-fit", f"does not fit: needs {summary}, {-est.headroom_gib:.1f} GiB short", fix,
                "build.max_batch_size", **data)
    elif est.thin:
        ctx.add(WARNING, "memory-fit", f"thin headroom: {summary}, {est.headroom_gib:.1f} GiB left", fix,
                "build.max_batch_size", **data)
    else:
        ctx.add(INFO, "memory-fit", f"fits: {summary}, {est.headroom_gib:.1f} GiB headroom", "", "", **data)
    if est.fits and est.kv_gib > est.kv_pool_gib:
        ctx.add(WARNING, "memory-fit", f"the runtime KV pool ({est.kv_pool_gib:.1f} GiB at "
                f"kv_cache_free_gpu_mem_fraction {ctx.cfg.triton.kv_cache_free_gpu_mem_fraction}) holds less than "
                f"max batch × max sequence needs ({est.kv_gib:.1f} GiB); the scheduler will queue requests",
                "raise triton.kv_cache_free_gpu_mem_fraction or lower build.max_batch_size",
                "triton.kv_cache_free_gpu_mem_fraction")


# ----------------------------------------------------------------------------------------------
# Paths and CPUs that later stages need (checked here so `validate` refuses what they would)


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


def _check_prompt_set(ctx: _Context) -> None:
    """``loadtest.prompts`` exists and holds readable prompts, resolved and parsed exactly as the
    load test will (``pipeline.loadtest.load_prompt_set``)."""
    from pipeline.loadtest import PromptSetError, load_prompt_set  # noqa: PLC0415 - loadtest-only code

    try:
        load_prompt_set(ctx.cfg)
    except PromptSetError as exc:
        ctx.add(ERROR, "prompts", exc.detail, "point loadtest.prompts at a directory of <category>.jsonl files "
                "(one {id, category, prompt} object a line) or at one such file", exc.field)


def _check_cpu_ids(ctx: _Context) -> None:
    """An explicit ``reference.cpu_pinning`` list names CPUs this process may run on
    (``os.sched_getaffinity``), enough of them for every arm's engine models, one left over."""
    cfg, pinning = ctx.cfg, ctx.cfg.reference.cpu_pinning
    if not isinstance(pinning, list):
        return
    if cfg.backend != "reference":
        ctx.add(WARNING, "cpu-ids", "CPU pinning applies to the CPU reference engine only; backend trtllm ignores it",
                "remove reference.cpu_pinning", "reference.cpu_pinning")
        return
    from pipeline.cpu_pinning import allowed_cpus, pinning_problems  # noqa: PLC0415
    from pipeline.render import llm_models  # noqa: PLC0415 - the engine models each arm's repository holds

    manifest = {"engines": dict.fromkeys(("baseline", "speculative", "target", "draft"), "")}
    arms = {arm: [m.model_name for m in llm_models(cfg, manifest, arm)] for arm in ("baseline", "speculative")}
    for problem in pinning_problems(pinning, arms, cfg.reference.threads, allowed_cpus()):
        ctx.add(ERROR, "cpu-ids", problem, "name CPUs from the allowed set, or use cpu_pinning: auto",
                "reference.cpu_pinning")


# ----------------------------------------------------------------------------------------------
# Helpers


def _models(cfg: DeploymentConfig) -> list[tuple[str, ModelSpec]]:
    models = [("target", cfg.target)]
    if cfg.draft is not None:
        models.append(("speculation.draft", cfg.draft))
    return models


def _roles(cfg: DeploymentConfig) -> list[tuple[str, str, ModelSpec]]:
    return [("target" if path == "target" else "draft", path, spec) for path, spec in _models(cfg)]


def _checkpoints(cfg: DeploymentConfig) -> list[tuple[str, str, str]]:
    """(role, field path, checkpoint string) of every directory the deployment reads."""
    items = [("target", "target.checkpoint", cfg.target.checkpoint)]
    spec = cfg.speculation
    if isinstance(spec, DraftTargetSpec):
        items.append(("draft", "speculation.draft.checkpoint", spec.draft.checkpoint))
    elif isinstance(spec, MedusaSpec):
        items.append(("medusa heads", "speculation.heads_dir", spec.heads_dir))
    elif isinstance(spec, EagleSpec):
        items.append(("EAGLE head", "speculation.head_dir", spec.head_dir))
    elif isinstance(spec, Eagle3Spec):
        items.append(("EAGLE-3 head", "speculation.head_dir", spec.head_dir))
    return items


_CHECKS: list[Callable[[_Context], None]] = [
    _check_backend,
    _check_draft_weights,
    _check_quantization,
    _check_method,
    _check_build_limits,
    _check_scripts,
    _check_files,
    _load_shapes,
    _check_shapes,
    _check_tokenizers,
    _check_heads,
    _check_memory,
    _check_prompt_set,
    _check_cpu_ids,
]
