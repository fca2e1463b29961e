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

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import BUILTIN_PREFIX, DeploymentConfig, ModelSpec, config_hash
from pipeline.errors import ConfigError
from pipeline.facts.hardware import get_profile
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

    # -- what a method's route hooks call (Method.plan_reference, Method.plan_trtllm) -----------
    def add_step(self, name: str, argv: list[str], inputs: list[str], outputs: list[str], *, kind: str,
                 expect_checkpoint: ExpectedCheckpoint | None = None) -> None:
        self.add(Step(name, argv, inputs, outputs, kind=kind, expect_checkpoint=expect_checkpoint))

    def reference_model(self, label: str, spec: ModelSpec, field_path: str) -> tuple[str, str]:
        return _reference_model(self, label, spec, field_path)

    def reference_engine(self, role: str, model: tuple[str, str], proposer: list[str], max_draft_len: int,
                         inputs: list[str]) -> None:
        _reference_engine(self, role, model, proposer, max_draft_len, inputs)

    def reference_baseline(self, target: tuple[str, str], role: str = "baseline", max_draft_len: int = 0) -> None:
        """An engine of the target alone (``--method none``): the baseline, or a verifier of external drafts."""
        _reference_engine(self, role, target, ["--method", "none"], max_draft_len, [])

    def draft_weights(self) -> list[str]:
        return _draft_weights(self.cfg)

    def checkpoint_expectation(self, role: str, spec: ModelSpec, **extra: Any) -> ExpectedCheckpoint:
        return _checkpoint_expectation(role, spec, **extra)

    def trtllm_checkpoint(self, v: tc.Version, label: str, spec: ModelSpec) -> tuple[str, str]:
        return _trtllm_checkpoint(self, v, label, spec)

    def trtllm_engine(self, v: tc.Version, role: str, ckpt: str, spec: ModelSpec, **options: Any) -> None:
        _trtllm_engine(self, v, role, ckpt, spec, **options)

    def trtllm_baseline(self, v: tc.Version, target_ckpt: str) -> None:
        _trtllm_engine(self, v, "baseline", target_ckpt, self.cfg.target, logits=self.cfg.build.gather_generation_logits)


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
    cfg = p.cfg
    target = _reference_model(p, "target", cfg.target, "target")
    tokenizer = p.path("checkpoints", "target-hf")
    cfg.method_info.plan_reference(p, cfg.speculation, target)
    return tokenizer


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
    return cfg.method_info.resends_context(cfg.speculation)


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


def _plan_trtllm(p: _Planner) -> str:
    cfg = p.cfg
    v = tc.Version.parse(cfg.trtllm_version)
    tokenizer, target_ckpt = _trtllm_checkpoint(p, v, "target", cfg.target)
    cfg.method_info.plan_trtllm(p, cfg.speculation, v, target_ckpt, tokenizer)
    return tokenizer


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
        num_draft_tokens=spec.num_draft_tokens if cfg.method_info.per_request_draft_len else None,
        trtllm_root=planner.trtllm,
    )
