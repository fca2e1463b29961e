"""Preflight checks of the config as a whole: quantization on the GPU, the speculation method's
rules, build limits and parallelism (the plan's scripts are checked by ``preflight``, which dry-runs
the plan; these rules import no stage).

Reads the config, the hardware profile and the model shapes an earlier check loaded; writes
nothing: findings go to the
:class:`~pipeline.validate.findings.CheckContext`. Structure alone is validated in ``pipeline.config``;
these rules need the whole picture.
"""

from __future__ import annotations

from pipeline.config import DeploymentConfig, ModelSpec
from pipeline.facts.hardware import HardwareProfile, formats_supported_on
from pipeline.trtllm import llmapi_checks
from pipeline.trtllm.commands import paged_context_fmha_survives
from pipeline.validate.findings import ERROR, INFO, WARNING, CheckContext, spec_models, spec_roles

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


def check_quantization(ctx: CheckContext) -> None:
    for path, spec in spec_models(ctx.cfg):
        _check_model_quantization(ctx, path, spec)
    llmapi_checks.check_quantization(ctx)


def _check_model_quantization(ctx: CheckContext, path: str, spec: ModelSpec) -> None:
    cfg, profile = ctx.cfg, ctx.profile
    q = spec.quantization
    if q.format not in profile.weight_formats:
        where = ", ".join(formats_supported_on(q.format)) or "no profile"
        ctx.add(ERROR, "gpu-quant", f"weight format {q.format} is not supported on {profile.display_name} "
                f"(supported on: {where})", _format_fix(q.format, profile), f"{path}.quantization.format")
    if q.kv_cache_dtype not in profile.kv_cache_dtypes:
        ctx.add(ERROR, "kv-dtype", f"KV-cache dtype {q.kv_cache_dtype} is not available on {profile.display_name}",
                f"use one of: {', '.join(profile.kv_cache_dtypes)}", f"{path}.quantization.kv_cache_dtype")
    elif profile.is_gpu and not cfg.runs_llm_api and not _paged_context_fmha_survives(spec, profile):
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
    needed = cfg.method_info.paged_fmha_needed_by(cfg)
    if needed is None and cfg.triton.enable_kv_cache_reuse:
        return ("KV-cache reuse (triton.enable_kv_cache_reuse) needs it, and the post-build check refuses an engine "
                "without it")
    return needed


def _report_paged_fmha_loss(ctx: CheckContext, path: str, spec: ModelSpec) -> None:
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
        # only KV-cache reuse needs it: turning reuse off is a fix too
        extra = ", or set triton.enable_kv_cache_reuse: false" if ctx.cfg.method_info.paged_fmha_needed_by(ctx.cfg) is None else ""
        ctx.add(ERROR, "kv-dtype", f"{why}; {needed}", fix + extra, field_path)
    else:
        ctx.add(INFO, "kv-dtype", why + "; the plan builds it with --use_paged_context_fmha disable (no chunked "
                "context, no KV reuse)", fix, field_path)


# ----------------------------------------------------------------------------------------------
# Speculation method rules (structure is validated in config.py; these need the whole picture)


def check_method(ctx: CheckContext) -> None:
    cfg = ctx.cfg
    if cfg.speculative and cfg.build.max_beam_width != 1:
        ctx.add(ERROR, "method", f"speculative decoding has no beam search (max_beam_width {cfg.build.max_beam_width})",
                "set build.max_beam_width: 1", "build.max_beam_width")
    cfg.method_info.check(ctx)


# ----------------------------------------------------------------------------------------------
# Build limits and parallelism


def check_build_limits(ctx: CheckContext) -> None:
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
    for path, spec in spec_models(cfg):
        if ctx.profile.is_gpu and spec.world_size > devices:
            ctx.add(ERROR, "parallelism", f"TP×PP = {spec.world_size} exceeds the {devices} GPUs of one node",
                    f"use tp × pp ≤ {devices}", f"{path}.tp")


def check_shapes(ctx: CheckContext) -> None:
    """Rules that need the model's shape (config.json, or the known-model table offline)."""
    for role, path, spec in spec_roles(ctx.cfg):
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
    ctx.cfg.method_info.check_shapes(ctx)
    target = ctx.shapes.get("target")
    draft = ctx.shapes.get("draft")
    if target is not None and draft is not None and target.vocab_size != draft.vocab_size:
        ctx.add(ERROR, "tokenizer", f"vocab_size differs: target {target.vocab_size} ({target.source}) vs draft "
                f"{draft.vocab_size} ({draft.source})", "pick a draft from the target's model family",
                "speculation.draft.checkpoint")
