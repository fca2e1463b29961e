"""Preflight: everything that can be known to fail before a build starts.

Reads a validated :class:`DeploymentConfig`, the hardware profile and (unless ``offline``) the
checkpoint directories — ``config.json``, weight-file headers and tensor lists
(:mod:`pipeline.validate.weight_files`), ``tokenizer.json`` or SentencePiece ``tokenizer.model``,
``tokenizer_config.json``; always the prompt set (``loadtest.prompts``) and this process's allowed
CPUs (``reference.cpu_pinning``); and, for the ``trtllm`` backend, whether each TensorRT-LLM script the
plan runs exists under the resolved examples root. Writes nothing. :func:`run_preflight` returns
:class:`Finding` s — error / warning / info, each with the field it concerns and the fix — covering
backend × hardware, GPU architecture × quantization and KV-cache dtype, the speculation method's
rules, parallelism, files (in the formats each build route reads), tokenizer compatibility and the
memory fit per GPU rank. The checks live beside it: :mod:`~pipeline.validate.checkpoints` (files,
shapes, tokenizers, heads; ``builtin:`` checkpoints resolve through ``pipeline.demo.resolve_builtin``)
and :mod:`~pipeline.validate.method_rules` (quantization, method rules, build limits);
this module runs them in order and holds the backend, memory-fit and later-stage checks (the
plan's scripts, the prompt set, CPU pinning: dry runs of the stages after this one).
"""

from __future__ import annotations

from typing import Callable

from pipeline.artefacts.deployment import arms_of
from pipeline.config import DeploymentConfig
from pipeline.errors import PreflightError, SpecdeployError
from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import MemoryEstimate
from pipeline.infra.cpu_pinning import allowed_cpus, pinning_problems
from pipeline.loadtest.inputs import PromptSetError, load_prompt_set
from pipeline.paths import model_repo_dir, served_repository_problem
from pipeline.plan.gpu_layout import validate_estimate
from pipeline.plan.llmapi import missing_modelopt_scripts
from pipeline.plan.planner import make_plan
from pipeline.render.arms import decide_arm
from pipeline.render.renderer import llm_models
from pipeline.trtllm import llmapi_checks
from pipeline.trtllm.layout import missing_scripts, missing_scripts_fix
from pipeline.validate.checkpoints import check_files, check_heads, check_tokenizers, check_weights, load_shapes
from pipeline.validate.findings import ERROR, INFO, WARNING, CheckContext, Finding, spec_models
from pipeline.validate.method_rules import (
    check_build_limits,
    check_method,
    check_quantization,
    check_shapes,
)
from pipeline.validate.version_rules import check_versions

# ----------------------------------------------------------------------------------------------
# Entry points


def run_preflight(cfg: DeploymentConfig, offline: bool = False, trtllm_root: str | None = None) -> list[Finding]:
    """All findings for ``cfg``; ``offline`` checks the config's logic without checkpoint files or
    TensorRT-LLM scripts (``trtllm_root``: the ``--trtllm-root`` override)."""
    ctx = CheckContext(cfg=cfg, profile=get_profile(cfg.hardware), offline=offline, trtllm_root=trtllm_root)
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


def _check_backend(ctx: CheckContext) -> None:
    cfg, profile = ctx.cfg, ctx.profile
    if cfg.backend == "reference" and profile.is_gpu:
        ctx.add(ERROR, "backend", f"backend 'reference' is the CPU engine but hardware is '{cfg.hardware}'",
                "set hardware: cpu (or backend: trtllm for GPU engines)", "backend")
    if cfg.backend == "trtllm" and not profile.is_gpu:
        ctx.add(ERROR, "backend", "backend 'trtllm' needs a GPU but hardware is 'cpu'",
                "set backend: reference for the CPU path, or a GPU hardware profile", "backend")
    if cfg.backend == "reference":
        for path, spec in spec_models(cfg):
            if spec.world_size > 1:
                ctx.add(ERROR, "backend", "the CPU reference engine runs one process per model (no TP/PP)",
                        "set tp: 1 and pp: 1", f"{path}.tp")
    if cfg.backend == "trtllm" and cfg.runtime == "engine":
        _check_trtllm_version(ctx)
    llmapi_checks.check_runtime(ctx)


def _check_draft_weights(ctx: CheckContext) -> None:
    """``reference.draft_weights: int8`` quantizes draft-side weights of a float32 engine only."""
    cfg = ctx.cfg
    if cfg.reference.draft_weights != "int8":
        return
    if cfg.backend != "reference":
        ctx.add(WARNING, "draft-weights", "int8 draft weights are a CPU reference engine setting; TensorRT-LLM "
                "engines ignore it", "quantize the draft with speculation.draft.quantization, or remove it",
                "reference.draft_weights")
    elif not cfg.speculative:
        ctx.add(WARNING, "draft-weights", "int8 draft weights have no effect: this config does not speculate",
                "remove reference.draft_weights", "reference.draft_weights")
    elif cfg.reference.compute_dtype != "float32":
        ctx.add(WARNING, "draft-weights", f"int8 draft weights are ignored with compute_dtype {cfg.reference.compute_dtype}",
                "use compute_dtype: float32, or draft_weights: float", "reference.draft_weights")
    elif cfg.method_info.draft_model and cfg.method_info.bls_orchestrated(cfg.speculation):
        ctx.add(WARNING, "draft-weights", "int8 draft weights reach the in-engine draft only: with orchestration "
                "bls the served tensorrt_llm_draft engine keeps the checkpoint's weights",
                "set speculation.orchestration: engine, or speculation.draft.quantization.format: int8_wo",
                "reference.draft_weights")


def _check_trtllm_version(ctx: CheckContext) -> None:
    """Engine-runtime versions (past 1.2.x: ``llmapi_checks.check_runtime``)."""
    cfg = ctx.cfg
    version = cfg.trtllm_version_tuple[:2]
    if version < (0, 12):
        ctx.add(ERROR, "version", f"TensorRT-LLM {cfg.trtllm_version} predates the supported build flags",
                "use 0.12 or newer (1.2.1 recommended)", "trtllm_version")
    needs = cfg.method_info.min_engine_version
    if needs is not None and version < needs:
        ctx.add(ERROR, "version", f"{cfg.method_info.title} needs TensorRT-LLM ≥ {needs[0]}.{needs[1]}",
                "raise trtllm_version", "trtllm_version")
    draft_logits = cfg.method_info.uses_draft_logits(cfg.speculation)
    if draft_logits and version < (0, 15):
        ctx.add(ERROR, "version", "draft logits (fast logits) need TensorRT-LLM ≥ 0.15", "raise trtllm_version",
                "trtllm_version")


# ----------------------------------------------------------------------------------------------
# Memory fit


def _check_memory(ctx: CheckContext) -> None:
    target, draft = ctx.shapes.get("target"), ctx.shapes.get("draft")
    if target is None or (ctx.cfg.method_info.draft_model and draft is None):
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


def _report_memory(ctx: CheckContext, est: MemoryEstimate) -> None:
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


def _check_prompt_set(ctx: CheckContext) -> None:
    """``loadtest.prompts`` exists and holds readable prompts, resolved and parsed exactly as the
    load test will (``pipeline.loadtest.inputs.load_prompt_set``)."""
    try:
        load_prompt_set(ctx.cfg)
    except PromptSetError as exc:
        ctx.add(ERROR, "prompts", exc.detail, "point loadtest.prompts at a directory of <category>.jsonl files "
                "(one {id, category, prompt} object a line) or at one such file, or name another format with "
                "loadtest.dataset_name / dataset_path (docs/workload.md)", exc.field)


def _check_cpu_ids(ctx: CheckContext) -> None:
    """An explicit ``reference.cpu_pinning`` list names CPUs this process may run on
    (``os.sched_getaffinity``), enough of them for every arm's engine models, one left over."""
    cfg, pinning = ctx.cfg, ctx.cfg.reference.cpu_pinning
    if not isinstance(pinning, list):
        return
    if cfg.backend != "reference":
        ctx.add(WARNING, "cpu-ids", "CPU pinning applies to the CPU reference engine only; backend trtllm ignores it",
                "remove reference.cpu_pinning", "reference.cpu_pinning")
        return
    manifest = {"engines": dict.fromkeys(("baseline", "speculative", "target", "draft"), "")}
    arms = {arm: [m.model_name for m in llm_models(cfg, manifest, arm)] for arm in ("baseline", "speculative")}
    # nothing is rendered yet: render's own decision, dry-run like its models above
    most = max(decide_arm(cfg, arm).engine_models for arm in arms_of(cfg))
    for problem in pinning_problems(pinning, arms, cfg.reference.threads, allowed_cpus(), most):
        ctx.add(ERROR, "cpu-ids", problem, "name CPUs from the allowed set, or use cpu_pinning: auto",
                "reference.cpu_pinning")


def _check_output_root(ctx: CheckContext) -> None:
    """The CPU path serves the repository where ``render`` writes it: its path must be one the
    Python backend's stub can load (``pipeline.paths.served_repository_problem``)."""
    if ctx.offline or ctx.cfg.backend != "reference":
        return  # GPU repositories are served from where the container mounts them
    problem = served_repository_problem(model_repo_dir(ctx.cfg, "baseline"))
    if problem:
        ctx.add(ERROR, "output-root", problem, "run from (or pass --workdir) a plain ASCII path without spaces")


def check_scripts(ctx: CheckContext) -> None:
    """Each TensorRT-LLM script the plan runs exists under the resolved examples root (on the
    build host only: offline there is nothing to look at): a dry run of the plan stage."""
    cfg = ctx.cfg
    if cfg.backend != "trtllm":
        return
    if ctx.offline:
        ctx.add(INFO, "offline", "offline: TensorRT-LLM example scripts not looked for",
                "run `specdeploy validate` without --offline on the build host")
        return
    try:
        plan = make_plan(cfg, ctx.trtllm_root)
    except SpecdeployError:
        return  # the config problem is reported by the checks that own it
    if cfg.runs_llm_api:
        for message, fix in missing_modelopt_scripts(plan):
            ctx.add(ERROR, "scripts", message, fix, "llm_api.modelopt_root")
        return
    missing = missing_scripts(plan.steps, plan.trtllm_root.path)
    fix = missing_scripts_fix(missing, plan.trtllm_root.path, cfg.trtllm_version) if missing else ""
    for script in missing:
        ctx.add(ERROR, "scripts", f"{script.path} (step {script.step}) does not exist under the TensorRT-LLM "
                f"examples root {plan.trtllm_root.path} (from {plan.trtllm_root.source})", fix, "trtllm_root")



_CHECKS: list[Callable[[CheckContext], None]] = [
    check_versions,
    _check_backend,
    _check_draft_weights,
    check_quantization,
    check_method,
    check_build_limits,
    check_scripts,
    check_files,
    check_weights,
    load_shapes,
    check_shapes,
    check_tokenizers,
    check_heads,
    _check_memory,
    _check_prompt_set,
    _check_cpu_ids,
    _check_output_root,
]
