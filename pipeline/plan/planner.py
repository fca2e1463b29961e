"""The build plan: the ordered steps that turn a :class:`DeploymentConfig` into engine dirs.

``make_plan(cfg)`` returns a :class:`BuildPlan` without running anything (a dry run: the
checkpoints need not exist). It reads only two things when they exist: whether the image's
``/app/examples`` is there (:mod:`pipeline.trtllm.layout`) and an EAGLE head's ``config.json``
(its decoder-layer count, for the FP8 route). Each :class:`Step` has an argv list (run without a shell), the paths
it reads (``inputs``) and the paths it creates (``outputs``, always whole directories or links,
written atomically by ``pipeline.build.builder``). The cache key of a step — sha256 of its argv plus the
content fingerprints of its inputs — is computed at build time, when the inputs exist.

Backends: ``trtllm`` steps are TensorRT-LLM commands (``pipeline.trtllm.commands``, spelled for
``cfg.trtllm_version``); ``reference`` steps run ``python -m pipeline.build.reference_step`` to
resolve checkpoints, quantize them (``int8_wo``) and write ``engine.json`` descriptors. Every
method gets a separate **baseline** engine (the A/B control). Paths in steps are absolute, under
``engines/<name>/`` of the working directory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import (
    BUILTIN_PREFIX,
    DeploymentConfig,
    DraftTargetSpec,
    Eagle3Spec,
    EagleSpec,
    MedusaSpec,
    ModelSpec,
    NgramSpec,
    config_hash,
    ngram_through_bls,
)
from pipeline.errors import ConfigError
from pipeline.facts.hardware import get_profile
from pipeline.facts.model_shapes import eagle_head_layers
from pipeline.infra.trees import choices_or_chain
from pipeline.methods.eagle import EAGLE_MAX_BATCH_SIZE
from pipeline.paths import engine_root
from pipeline.plan.llmapi import plan_llm_api
from pipeline.plan.step import Step
from pipeline.trtllm import commands as tc
from pipeline.trtllm.checkpoint_config import ExpectedCheckpoint
from pipeline.trtllm.engine_config import ExpectedEngine
from pipeline.trtllm.layout import TrtllmRoot, resolve_trtllm_root

BUILD_STEP_MODULE = "pipeline.build.reference_step"
REFERENCE_QUANT_FORMATS = ("none", "int8_wo")


@dataclass
class BuildPlan:
    name: str
    backend: str
    method: str
    config_hash: str
    trtllm_version: str | None
    root: str  # engines/<name>/ (absolute)
    steps: list[Step]
    engines: dict[str, str]  # role → engine dir
    tokenizer_dir: str  # the target's HF dir (a link made by a resolve step for builtin models)
    max_draft_len: int
    num_draft_tokens: int | None
    trtllm_root: TrtllmRoot | None = None  # where the example scripts are (trtllm backend)

    def to_json(self) -> list[dict[str, Any]]:
        return [step.to_json() for step in self.steps]

    def step(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


class _Planner:
    """Accumulates the steps of one plan; one method per kind of step."""

    def __init__(self, cfg: DeploymentConfig, trtllm_root: str | None):
        self.cfg = cfg
        self.root = engine_root(cfg).absolute()
        self.trtllm = resolve_trtllm_root(trtllm_root, cfg.trtllm_root) if cfg.backend == "trtllm" else None
        self.trtllm_root = self.trtllm.path if self.trtllm else ""
        self.steps: list[Step] = []
        self.engines: dict[str, str] = {}

    def path(self, *parts: str) -> str:
        return str(self.root.joinpath(*parts))

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    # -- sources ---------------------------------------------------------------------------
    def source(self, label: str, checkpoint: str, kind: str, always_resolve: bool) -> str:
        """The HF dir of a model (or heads): a link made by a resolve step for ``builtin:``
        names (and, on the reference backend, for checked local dirs); else the absolute path."""
        if checkpoint.startswith(BUILTIN_PREFIX):
            where = ["--builtin", checkpoint[len(BUILTIN_PREFIX) :]]
            inputs: list[str] = []
        else:
            local = str(Path(checkpoint).expanduser().absolute())
            if not always_resolve:
                return local
            where, inputs = ["--local", local], [local]
        link = self.path("checkpoints", f"{label}-hf")
        argv = [sys.executable, "-m", BUILD_STEP_MODULE, "resolve", *where, "--kind", kind, "--out", link]
        self.add(Step(f"resolve-{label}", argv, inputs, [link], _reference_env(), kind="resolve"))
        return link


def _reference_env() -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------------------
# Reference backend


def _reference_model(p: _Planner, label: str, spec: ModelSpec, field_path: str) -> tuple[str, str]:
    """(model dir for engine.json, quantization) for one Llama model."""
    fmt = spec.quantization.format
    if fmt not in REFERENCE_QUANT_FORMATS:
        raise ConfigError(
            "config", [f"{field_path}.quantization.format: '{fmt}' is not available on the reference backend (use none or int8_wo)"]
        )
    src = p.source(label, spec.checkpoint, "llama", always_resolve=True)
    if fmt == "none":
        return src, "none"
    dst = p.path("checkpoints", f"{label}-{fmt}")
    argv = [sys.executable, "-m", BUILD_STEP_MODULE, "quantize", "--src", src, "--dst", dst, "--format", fmt]
    p.add(Step(f"quantize-{label}", argv, [src], [dst], _reference_env(), kind="quantize"))
    return dst, fmt


def _reference_engine(p: _Planner, role: str, model: tuple[str, str], proposer: list[str], max_draft_len: int, inputs: list[str]) -> None:
    cfg = p.cfg
    out = p.path(role)
    argv = [
        sys.executable, "-m", BUILD_STEP_MODULE, "engine", "--out", out, "--role", role,
        "--model-dir", model[0], "--quantization", model[1], *proposer,
        "--max-draft-len", str(max_draft_len),
        "--max-batch-size", str(cfg.reference.max_batch_size or cfg.build.max_batch_size),
        "--max-seq-len", str(cfg.build.max_seq_len), "--max-input-len", str(engine_max_input_len(cfg)),
        "--compute-dtype", cfg.reference.compute_dtype, "--threads", str(cfg.reference.threads),
        "--prefix-cache-entries", str(cfg.reference.prefix_cache_entries),
        *([] if cfg.reference.fast_paths else ["--no-fast-paths"]),
        "--name", cfg.name,
    ]  # no config hash here: a load-test-only config change must not rebuild engines
    p.add(Step(f"engine-{role}", argv, [model[0], *inputs], [out], _reference_env(), kind="engine"))
    p.engines[role] = out


def _plan_reference(p: _Planner) -> str:
    cfg, spec, method = p.cfg, p.cfg.speculation, p.cfg.method_info
    target = _reference_model(p, "target", cfg.target, "target")
    tokenizer = p.path("checkpoints", "target-hf")
    none = ["--method", "none"]
    if isinstance(spec, DraftTargetSpec):
        draft = _reference_model(p, "draft", spec.draft, "speculation.draft")
    elif isinstance(spec, MedusaSpec):
        heads = p.source("medusa", spec.heads_dir, "medusa", always_resolve=True)
    elif isinstance(spec, (EagleSpec, Eagle3Spec)):
        head = p.source("eagle", spec.head_dir, "eagle", always_resolve=True)
    _reference_engine(p, "baseline", target, none, 0, [])
    if isinstance(spec, DraftTargetSpec):
        k = spec.engine_max_draft_len
        _reference_engine(p, "target", target, none, k, [])
        _reference_engine(p, "draft", draft, none, 0, [])
        proposer = ["--method", "draft_target", "--draft-dir", draft[0], "--draft-quantization", draft[1],
                    "--num-draft-tokens", str(spec.num_draft_tokens)]
        _reference_engine(p, "speculative", target, proposer + _draft_weights(cfg), k, [draft[0]])
    elif isinstance(spec, MedusaSpec):
        choices = choices_or_chain(spec.choices, spec.num_heads)
        proposer = ["--method", "medusa", "--heads-dir", heads, "--num-heads", str(spec.num_heads),
                    "--choices", json.dumps(choices, separators=(",", ":"))]
        _reference_engine(p, "speculative", target, proposer + _draft_weights(cfg), spec.engine_max_draft_len, [heads])
    elif isinstance(spec, EagleSpec):
        choices = choices_or_chain(spec.choices, spec.num_layers)
        proposer = ["--method", "eagle", "--head-dir", head, "--num-layers", str(spec.num_layers),
                    "--choices", json.dumps(choices, separators=(",", ":"))]
        _reference_engine(p, "speculative", target, proposer + _draft_weights(cfg), spec.engine_max_draft_len, [head])
    elif ngram_through_bls(cfg):
        # the BLS drafts: a target that verifies external drafts, as draft-target's
        _reference_engine(p, "target", target, none, spec.max_draft_len, [])
    elif isinstance(spec, Eagle3Spec):  # a chain; model_mode is the LLM API's (one engine either way here)
        proposer = ["--method", "eagle3", "--head-dir", head, "--num-draft-tokens", str(spec.max_draft_len)]
        _reference_engine(p, "speculative", target, proposer + _draft_weights(cfg), spec.max_draft_len, [head])
    elif isinstance(spec, NgramSpec):
        _reference_engine(p, "speculative", target, ngram_args(spec), spec.max_draft_len, [])
    elif method.proposer:  # a checkpoint-free method: its proposer's fields as the method gives them
        proposer = ["--method", method.proposer, "--proposer-fields",
                    json.dumps(method.proposer_fields(spec), separators=(",", ":"), sort_keys=True)]
        _reference_engine(p, "speculative", target, proposer, method.engine_max_draft_len(spec), [])
    return tokenizer


def ngram_args(spec: NgramSpec) -> list[str]:
    """build_step arguments of the n-gram proposer (no checkpoint: the engine drafts from the tokens)."""
    flags = [(f"--{knob.replace('_', '-')}", "true" if getattr(spec, knob) else "false")
             for knob in ("is_keep_all", "is_use_oldest", "is_public_pool")]
    return ["--method", "ngram", "--num-draft-tokens", str(spec.max_draft_len),
            "--max-matching-ngram-size", str(spec.max_matching_ngram_size),
            "--min-matching-ngram-size", str(spec.min_matching_ngram_size), *[a for pair in flags for a in pair]]


def _draft_weights(cfg: DeploymentConfig) -> list[str]:
    """``reference.draft_weights`` for the speculative engine (absent when float, the default)."""
    return ["--draft-weights", cfg.reference.draft_weights] if cfg.reference.draft_weights != "float" else []


# ------------------------------------------------------------------------------------------------
# TensorRT-LLM backend


def _checkpoint_expectation(role: str, spec: ModelSpec, **extra: Any) -> ExpectedCheckpoint:
    q = spec.quantization
    return ExpectedCheckpoint(role=role, quant_algo=tc.QUANT_ALGO[q.format],
                              kv_cache_quant_algo=tc.KV_CACHE_QUANT_ALGO.get(q.kv_cache_dtype), tp=spec.tp, pp=spec.pp,
                              **extra)


def _trtllm_checkpoint(p: _Planner, v: tc.Version, label: str, spec: ModelSpec) -> tuple[str, str]:
    """convert (unquantized) or ModelOpt quantize of one Llama model → (HF dir, TRT-LLM checkpoint dir)."""
    src = p.source(label, spec.checkpoint, "llama", always_resolve=False)
    out = p.path("checkpoints", f"{label}-trtllm")
    q = spec.quantization
    if q.format == "none" and q.kv_cache_dtype not in tc.KV_CACHE_QUANT_ALGO:
        argv = tc.convert_llama(v, p.trtllm_root, model_dir=src, output_dir=out, dtype=spec.dtype, tp=spec.tp, pp=spec.pp)
        kind = "convert"
    else:
        argv = tc.quantize_modelopt(
            v, p.trtllm_root, model_dir=src, output_dir=out, dtype=spec.dtype, qformat=q.format,
            kv_cache_dtype=q.kv_cache_dtype, calib_dataset=q.calibration_dataset, calib_size=q.calibration_size,
            awq_block_size=q.awq_block_size, tp=spec.tp, pp=spec.pp,
        )
        kind = "quantize"
    p.add(Step(f"{kind}-{label}", argv, [src], [out], kind=kind, expect_checkpoint=_checkpoint_expectation(label, spec)))
    return src, out


def engine_max_input_len(cfg: DeploymentConfig) -> int:
    """``--max_input_len`` of every engine of ``cfg``, TensorRT-LLM's and the reference engine's
    alike (both refuse a longer prompt, docs/request-validation.md). Draft-target: the BLS sends the whole context
    (prompt + every accepted token) as the input of each draft and verify call, and the executor
    rejects an input longer than the engine's max_input_len, so those engines accept inputs up to
    max_seq_len − 1 (the baseline too, so both arms take the same prompts)."""
    return cfg.build.max_seq_len - 1 if _is_dtm(cfg) else cfg.build.max_input_len


def paged_context_fmha_kept(cfg: DeploymentConfig, spec: ModelSpec) -> bool:
    """Whether trtllm-build keeps ``--use_paged_context_fmha enable`` for this model's KV dtype."""
    q = spec.quantization
    return tc.paged_context_fmha_survives(q.format, q.kv_cache_dtype, get_profile(cfg.hardware).sm)


def needs_paged_context_fmha(cfg: DeploymentConfig, role: str, mode: str) -> bool:
    """Draft-target (both engines), EAGLE and KV-cache reuse rely on paged context FMHA."""
    return mode in ("draft_tokens_external", "eagle") or (_is_dtm(cfg) and role in ("target", "draft")) \
        or cfg.triton.enable_kv_cache_reuse


def _expect(p: _Planner, role: str, spec: ModelSpec, mode: str, k: int, logits: bool, **extra: Any) -> ExpectedEngine:
    cfg = p.cfg
    q = spec.quantization
    return ExpectedEngine(
        role=role, speculative_decoding_mode=mode, max_draft_len=k,
        paged_context_fmha=needs_paged_context_fmha(cfg, role, mode),
        quant_algo=tc.QUANT_ALGO[q.format], kv_cache_quant_algo=tc.KV_CACHE_QUANT_ALGO.get(q.kv_cache_dtype),
        tp=spec.tp, pp=spec.pp, max_batch_size=cfg.build.max_batch_size, max_input_len=engine_max_input_len(cfg),
        max_seq_len=cfg.build.max_seq_len, gather_generation_logits=logits, version=cfg.trtllm_version, **extra,
    )


def _is_dtm(cfg: DeploymentConfig) -> bool:
    """The BLS re-sends the whole context every round: draft-target, and n-gram through the BLS."""
    return isinstance(cfg.speculation, DraftTargetSpec) or ngram_through_bls(cfg)


def _trtllm_engine(p: _Planner, v: tc.Version, role: str, ckpt: str, spec: ModelSpec, *, mode: str | None = None,
                   k: int = 0, logits: bool = False, **extra: Any) -> None:
    cfg = p.cfg
    out = p.path(role)
    # A KV dtype that loses paged context FMHA is a validate error where the deployment needs it;
    # elsewhere the plan asks for what the builder will produce.
    paged = paged_context_fmha_kept(cfg, spec) or needs_paged_context_fmha(cfg, role, mode or "none")
    options = tc.BuildOptions(
        max_batch_size=cfg.build.max_batch_size, max_input_len=engine_max_input_len(cfg),
        max_seq_len=cfg.build.max_seq_len, max_num_tokens=cfg.build.max_num_tokens,
        max_beam_width=cfg.build.max_beam_width if role == "baseline" else 1,
        workers=min(cfg.build.workers or spec.world_size, spec.world_size),
        gemm_plugin=tc.gemm_plugin_for(spec.quantization.format, cfg.build.max_batch_size),
        speculative_decoding_mode=mode, max_draft_len=k, gather_generation_logits=logits, paged_context_fmha=paged,
    )
    timing_cache = p.path("timing_cache", f"{role}.cache")
    argv = tc.trtllm_build(v, checkpoint_dir=ckpt, output_dir=out, timing_cache=timing_cache, options=options)
    expect = _expect(p, role, spec, mode or "none", k, logits, **extra)
    p.add(Step(f"build-{role}", argv, [ckpt], [out], kind="build", expect=expect,
               scratch_dirs=[str(Path(timing_cache).parent)]))
    p.engines[role] = out


def _medusa_checkpoint(p: _Planner, v: tc.Version, spec: MedusaSpec, base: str) -> str:
    cfg, q = p.cfg, p.cfg.target.quantization
    heads = p.source("medusa", spec.heads_dir, "medusa", always_resolve=False)
    out = p.path("checkpoints", "speculative-trtllm")
    k = spec.engine_max_draft_len
    if q.format == "none" and q.kv_cache_dtype not in tc.KV_CACHE_QUANT_ALGO:
        argv = tc.convert_medusa(v, p.trtllm_root, model_dir=base, heads_dir=heads, output_dir=out, dtype=cfg.target.dtype,
                                 num_heads=spec.num_heads, max_draft_len=k, tp=cfg.target.tp)
        kind = "convert"
    elif q.format in ("none", "fp8"):
        extra = tc.medusa_quantize_extra(v, heads_dir=heads, num_heads=spec.num_heads, max_draft_len=k)
        argv = tc.quantize_modelopt(
            v, p.trtllm_root, model_dir=base, output_dir=out, dtype=cfg.target.dtype, qformat=q.format,
            kv_cache_dtype=q.kv_cache_dtype, calib_dataset=q.calibration_dataset, calib_size=q.calibration_size,
            awq_block_size=q.awq_block_size, tp=cfg.target.tp, pp=cfg.target.pp, extra=extra,
        )
        kind = "quantize"
    else:
        raise ConfigError("config", [f"target.quantization.format: Medusa supports none or fp8, not '{q.format}'"])
    expect = _checkpoint_expectation("speculative", cfg.target, architecture="MedusaForCausalLM", num_medusa_heads=spec.num_heads)
    p.add(Step(f"{kind}-speculative", argv, [base, heads], [out], kind=kind, expect_checkpoint=expect))
    return out


def _eagle_checkpoint(p: _Planner, v: tc.Version, spec: EagleSpec, base: str) -> str:
    cfg, q = p.cfg, p.cfg.target.quantization
    head = p.source("eagle", spec.head_dir, "eagle", always_resolve=False)
    out = p.path("checkpoints", "speculative-trtllm")
    common = dict(output_dir=out, dtype=cfg.target.dtype, max_draft_len=spec.engine_max_draft_len, num_layers=spec.num_layers,
                  max_non_leaves_per_layer=spec.max_non_leaves_per_layer, tp=cfg.target.tp)
    expect = _checkpoint_expectation("speculative", cfg.target, architecture="EagleForCausalLM", num_eagle_layers=spec.num_layers)
    if q.format == "none" and q.kv_cache_dtype not in tc.KV_CACHE_QUANT_ALGO:
        argv = tc.convert_eagle(v, p.trtllm_root, model_dir=base, head_dir=head, **common)
        p.add(Step("convert-speculative", argv, [base, head], [out], kind="convert", expect_checkpoint=expect))
        return out
    if q.format != "fp8" or q.kv_cache_dtype == "int8":
        raise ConfigError("config", ["target.quantization: quantized EAGLE is FP8 only (format fp8, kv_cache_dtype fp8 or auto)"])
    quantized = p.path("checkpoints", "speculative-fp8-modelopt")
    argv = tc.quantize_eagle(v, p.trtllm_root, model_dir=base, head_dir=head, output_dir=quantized,
                             head_layers=eagle_head_layers(head), kv_cache_dtype=q.kv_cache_dtype,
                             calib_dataset=q.calibration_dataset, calib_size=q.calibration_size)
    p.add(Step("quantize-speculative", argv, [base, head], [quantized], kind="quantize"))
    argv = tc.convert_eagle(v, p.trtllm_root, model_dir=quantized, head_dir=None, **common)
    p.add(Step("convert-speculative", argv, [quantized], [out], kind="convert", expect_checkpoint=expect))
    return out


def _plan_trtllm(p: _Planner) -> str:
    cfg, spec, method = p.cfg, p.cfg.speculation, p.cfg.method_info
    v = tc.Version.parse(cfg.trtllm_version)
    tokenizer, target_ckpt = _trtllm_checkpoint(p, v, "target", cfg.target)
    base_logits = cfg.build.gather_generation_logits
    if isinstance(spec, DraftTargetSpec):
        _, draft_ckpt = _trtllm_checkpoint(p, v, "draft", spec.draft)
    elif isinstance(spec, MedusaSpec):
        spec_ckpt = _medusa_checkpoint(p, v, spec, tokenizer)
    elif isinstance(spec, EagleSpec):
        _check_eagle(cfg)
        spec_ckpt = _eagle_checkpoint(p, v, spec, tokenizer)
    _trtllm_engine(p, v, "baseline", target_ckpt, cfg.target, logits=base_logits)
    if isinstance(spec, DraftTargetSpec):
        k, logits = spec.engine_max_draft_len, spec.use_draft_logits
        _trtllm_engine(p, v, "target", target_ckpt, cfg.target, mode="draft_tokens_external", k=k, logits=logits)
        _trtllm_engine(p, v, "draft", draft_ckpt, spec.draft, logits=logits)
    elif ngram_through_bls(cfg):
        # TensorRT-LLM's V1 n-gram workflow (examples/ngram/README.md): the target alone, built for
        # external drafts; the drafts come from the BLS's lookup
        _trtllm_engine(p, v, "target", target_ckpt, cfg.target, mode="draft_tokens_external", k=spec.max_draft_len)
    elif isinstance(spec, MedusaSpec):
        _trtllm_engine(p, v, "speculative", spec_ckpt, cfg.target, mode="medusa", k=spec.engine_max_draft_len, logits=base_logits,
                       architecture="MedusaForCausalLM", num_medusa_heads=spec.num_heads)
    elif isinstance(spec, EagleSpec):
        _trtllm_engine(p, v, "speculative", spec_ckpt, cfg.target, mode="eagle", k=spec.engine_max_draft_len, logits=base_logits,
                       architecture="EagleForCausalLM", num_eagle_layers=spec.num_layers)
    elif method.engine_from_target:  # the target's own checkpoint, built in the method's mode
        _trtllm_engine(p, v, "speculative", target_ckpt, cfg.target, mode=method.engine_mode,
                       k=method.engine_max_draft_len(spec), logits=base_logits)
    return tokenizer


def _check_eagle(cfg: DeploymentConfig) -> None:
    problems = []
    if cfg.target.pp != 1:
        problems.append(f"target.pp: EAGLE needs pp 1, got {cfg.target.pp}")
    if cfg.build.max_batch_size > EAGLE_MAX_BATCH_SIZE:
        problems.append(f"build.max_batch_size: EAGLE allows at most {EAGLE_MAX_BATCH_SIZE}, got {cfg.build.max_batch_size}")
    if problems:
        raise ConfigError("config", problems)


# ------------------------------------------------------------------------------------------------


def make_plan(cfg: DeploymentConfig, trtllm_root: str | None = None) -> BuildPlan:
    """The ordered build steps for ``cfg`` (no filesystem access; checkpoints may be absent)."""
    planner = _Planner(cfg, trtllm_root)
    if cfg.backend == "reference":
        tokenizer = _plan_reference(planner)
    elif cfg.runs_llm_api:
        tokenizer = plan_llm_api(planner)
    else:
        tokenizer = _plan_trtllm(planner)
    spec = cfg.speculation
    max_draft_len = cfg.method_info.engine_max_draft_len(spec)
    return BuildPlan(
        name=cfg.name,
        backend=cfg.backend,
        method=cfg.method,
        config_hash=config_hash(cfg),
        trtllm_version=cfg.trtllm_version if cfg.backend == "trtllm" else None,
        root=str(planner.root),
        steps=planner.steps,
        engines=planner.engines,
        tokenizer_dir=tokenizer,
        max_draft_len=max_draft_len,
        num_draft_tokens=spec.num_draft_tokens if isinstance(spec, DraftTargetSpec) else None,
        trtllm_root=planner.trtllm,
    )
