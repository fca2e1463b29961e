"""Memory fit per GPU rank: weights by format + KV cache + activations + a runtime margin.

Reads a :class:`DeploymentConfig`, the model shapes (``pipeline.facts.model_shapes``) and the hardware
profile; writes nothing. The estimate follows the usual sizing rule (docs/validate.md): weights ≈ params × bytes/weight ÷
(TP×PP) with embeddings and ``lm_head`` left unquantized; KV per token per rank =
2 × layers/PP × (KV heads × head_dim / TP) × bytes(KV dtype), sized for max batch × (max sequence
+ draft-length overhead). The rank that carries the most is reported (rank 0: in draft-target the
draft shares the target's first GPUs). Figures are GiB.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from pipeline.config import DeploymentConfig, ModelSpec
from pipeline.facts.hardware import HardwareProfile
from pipeline.facts.model_shapes import ModelShape

GIB = 1024**3
# CUDA context, cuBLAS/NCCL workspaces, Triton + Python backends: the project's own allowance, neither
# measured nor published (TensorRT-LLM's memory guide accounts only for weights, activations and KV);
# each run checks it, since a margin that is too small leaves the backend a smaller KV capacity than
# planned (pipeline/report/kv_capacity_check.py; docs/gpu-serving.md "The runtime margin")
RUNTIME_MARGIN_GIB = 2.0
EXTRA_MODEL_MARGIN_GIB = 0.5  # each further engine in the same server (the draft)
THIN_HEADROOM_FRACTION = 0.10  # warn when less than 10 % of device memory is left

_DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float64": 8.0}
_KV_BYTES = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "fp32": 4.0}
_FORMAT_BYTES = {
    "fp8": 1.0,
    "int8_sq": 1.0,
    "int8_wo": 1.0,
    "int4_awq": 0.5 + 2 / 128,  # 4-bit + one fp16 scale per group of 128
    "int4_wo": 0.5 + 2 / 128,
    "w4a8_awq": 0.5 + 2 / 128,
    "nvfp4": 0.5 + 1 / 16,  # 4-bit + one fp8 scale per block of 16
}


@dataclass
class MemoryRow:
    component: str
    gib: float
    detail: str


@dataclass
class MemoryEstimate:
    device_gib: float
    device: str
    rows: list[MemoryRow] = field(default_factory=list)
    kv_gib: float = 0.0
    kv_pool_gib: float = 0.0  # what the runtime's KV fraction will actually allocate

    @property
    def total_gib(self) -> float:
        return sum(r.gib for r in self.rows)

    @property
    def headroom_gib(self) -> float:
        return self.device_gib - self.total_gib

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= 0

    @property
    def thin(self) -> bool:
        return self.fits and self.headroom_gib < THIN_HEADROOM_FRACTION * self.device_gib

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "device_gib": round(self.device_gib, 2),
            "rows": [{"component": r.component, "gib": round(r.gib, 3), "detail": r.detail} for r in self.rows],
            "total_gib": round(self.total_gib, 2),
            "headroom_gib": round(self.headroom_gib, 2),
            "kv_pool_gib": round(self.kv_pool_gib, 2),
            "fits": self.fits,
            "thin": self.thin,
        }


def params_text(count: int) -> str:
    """A parameter count as people say it: 8.03 B, 1.24 B, 350 M, 96.3 K (tiny demo models too)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            value = count / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return str(count)


def weight_bytes_per_param(spec: ModelSpec, backend: str, compute_dtype: str) -> float:
    fmt = spec.quantization.format
    if fmt != "none":
        return _FORMAT_BYTES[fmt]
    dtype = compute_dtype if backend == "reference" else spec.dtype
    return _DTYPE_BYTES[dtype]


def kv_bytes(spec: ModelSpec, backend: str, compute_dtype: str) -> float:
    kv = spec.quantization.kv_cache_dtype
    if kv != "auto":
        return _KV_BYTES[kv]
    return _DTYPE_BYTES[compute_dtype if backend == "reference" else spec.dtype]


def model_weights_gib(shape: ModelShape, spec: ModelSpec, backend: str, compute_dtype: str) -> float:
    """Weights on the busiest rank: body ÷ (TP×PP); embedding + lm_head (unquantized) ÷ TP."""
    body = shape.body_params() * weight_bytes_per_param(spec, backend, compute_dtype) / spec.world_size
    dense = _DTYPE_BYTES[compute_dtype if backend == "reference" else spec.dtype]
    # TensorRT-LLM engines hold their own lm_head even when the HF checkpoint ties it.
    tied_once = backend == "reference" and shape.tie_word_embeddings
    embed_and_head = shape.embedding_params() * (1 if tied_once else 2) * dense / spec.tp
    return (body + embed_and_head) / GIB


def kv_cache_gib(shape: ModelShape, spec: ModelSpec, tokens: int, backend: str, compute_dtype: str,
                 layers: int | None = None) -> float:
    layers_on_rank = math.ceil((layers if layers is not None else shape.num_layers) / spec.pp)
    kv_heads_on_rank = max(1, shape.num_kv_heads // spec.tp)
    per_token = 2 * layers_on_rank * kv_heads_on_rank * shape.head_dim * kv_bytes(spec, backend, compute_dtype)
    return per_token * tokens / GIB


def activations_gib(shape: ModelShape, spec: ModelSpec, num_tokens: int, batch: int, draft_len: int) -> float:
    """Activation + I/O buffers fixed at build time; they scale with max_num_tokens."""
    per_token = (6 * shape.hidden_size + 3 * shape.intermediate_size / spec.tp) * 2
    logits = batch * (draft_len + 1) * shape.vocab_size * 4 / spec.tp
    return (num_tokens * per_token + logits) / GIB


def _draft_len_overhead(cfg: DeploymentConfig) -> tuple[int, int]:
    """(extra KV positions per sequence, draft length K) for the speculative engine."""
    return cfg.method_info.memory_draft_len(cfg.speculation)


def _effective_num_tokens(cfg: DeploymentConfig, draft_len: int) -> int:
    b = cfg.build
    tokens = max(b.max_num_tokens, b.max_batch_size * (draft_len + 1) if draft_len else 0)
    return min(tokens, b.max_batch_size * b.max_seq_len)


def _heads_rows(cfg: DeploymentConfig, shape: ModelShape, dense: float) -> tuple[list[MemoryRow], list[KvPart]]:
    """Weights of the speculative engine's own drafting heads, and the KV their decoder layer keeps."""
    head = cfg.method_info.draft_head(cfg.speculation)
    if head is None:
        return [], []
    params = head.resident_params(shape.hidden_size, shape.vocab_size, shape.layer_params())
    rows = [MemoryRow(head.name, params * dense / cfg.target.tp / GIB, head.detail)]
    if head.kv_name is None:
        return rows, []
    per_token = kv_cache_gib(shape, cfg.target, 1, cfg.backend, cfg.reference.compute_dtype, layers=1)
    return rows, [KvPart(head.kv_name, per_token, "1 layer × {tokens} tokens")]


@dataclass(frozen=True)
class KvPart:
    """One KV cache of an executor: GiB per token on its busiest rank; ``detail`` takes {tokens}."""

    component: str
    per_token_gib: float
    detail: str


@dataclass
class ExecutorMemory:
    """One TensorRT-LLM executor (a ``tensorrt_llm`` model of one arm) on each GPU it spans: what
    it holds besides the KV cache, the KV it keeps per token, and the tokens it could ever use
    (max batch × its longest sequence)."""

    arm: str
    model_name: str
    rows: list[MemoryRow]
    kv: list[KvPart]
    full_tokens: int
    margin: MemoryRow

    @property
    def non_kv_gib(self) -> float:
        return sum(r.gib for r in self.rows) + self.margin.gib

    @property
    def kv_per_token_gib(self) -> float:
        return sum(part.per_token_gib for part in self.kv)

    def kv_rows(self, tokens: int, per_sequence: str) -> list[MemoryRow]:
        return [MemoryRow(p.component, p.per_token_gib * tokens, p.detail.format(tokens=per_sequence)) for p in self.kv]


def _weights_row(name: str, shape: ModelShape, spec: ModelSpec, cfg: DeploymentConfig) -> MemoryRow:
    return MemoryRow(name, model_weights_gib(shape, spec, cfg.backend, cfg.reference.compute_dtype),
                     f"{params_text(shape.total_params())} params, {spec.quantization.format}, TP{spec.tp}×PP{spec.pp}")


def _margin(profile: HardwareProfile, first: bool, name: str) -> MemoryRow:
    if profile.is_gpu:
        return MemoryRow(name, RUNTIME_MARGIN_GIB if first else EXTRA_MODEL_MARGIN_GIB,
                         "CUDA context, workspaces, server" if first else "a further engine in the server")
    return MemoryRow(name, 0.5 if first else 0.25, "process overhead")


def baseline_executor(cfg: DeploymentConfig, profile: HardwareProfile, shape: ModelShape, prefix: str = "") -> ExecutorMemory:
    """The baseline arm's engine: the target without speculation (``prefix`` names its rows when it
    shares a GPU with the speculative arm)."""
    t, b = cfg.target, cfg.build
    num_tokens = _effective_num_tokens(cfg, 0)
    acts = MemoryRow(f"{prefix}activations", activations_gib(shape, t, num_tokens, b.max_batch_size, 0),
                     f"max_num_tokens {num_tokens}")
    per_token = kv_cache_gib(shape, t, 1, cfg.backend, cfg.reference.compute_dtype)
    kv_name = f"{prefix}KV cache" if prefix else "target KV cache"
    return ExecutorMemory(
        "baseline", "tensorrt_llm", [_weights_row(f"{prefix}weights" if prefix else "target weights", shape, t, cfg), acts],
        [KvPart(kv_name, per_token, "{tokens} tokens")], b.max_batch_size * b.max_seq_len,
        _margin(profile, True, f"{prefix}runtime margin" if prefix else "runtime margin"),
    )


def speculative_executors(cfg: DeploymentConfig, profile: HardwareProfile, target_shape: ModelShape,
                          draft_shape: ModelShape | None) -> list[ExecutorMemory]:
    """The speculative arm's engines: the target (with its heads) and, for draft-target, the draft."""
    compute, b, t = cfg.reference.compute_dtype, cfg.build, cfg.target
    extra_positions, draft_len = _draft_len_overhead(cfg)
    dense = _DTYPE_BYTES[compute if cfg.backend == "reference" else t.dtype]
    heads, head_kv = _heads_rows(cfg, target_shape, dense)
    num_tokens = _effective_num_tokens(cfg, draft_len)
    acts = MemoryRow("activations", activations_gib(target_shape, t, num_tokens, b.max_batch_size, draft_len),
                     f"max_num_tokens {num_tokens}")
    main = ExecutorMemory(
        "speculative", "tensorrt_llm", [_weights_row("target weights", target_shape, t, cfg), *heads, acts],
        [KvPart("target KV cache", kv_cache_gib(target_shape, t, 1, cfg.backend, compute), "{tokens} tokens"), *head_kv],
        b.max_batch_size * (b.max_seq_len + extra_positions), _margin(profile, True, "runtime margin"),
    )
    draft = cfg.draft
    if draft is None or draft_shape is None:
        return [main]
    draft_acts = activations_gib(draft_shape, draft, min(b.max_num_tokens, num_tokens), b.max_batch_size, 0)
    return [main, ExecutorMemory(
        "speculative", "tensorrt_llm_draft",
        [_weights_row("draft weights", draft_shape, draft, cfg),
         MemoryRow("draft activations", draft_acts, f"max_num_tokens {min(b.max_num_tokens, num_tokens)}")],
        [KvPart("draft KV cache", kv_cache_gib(draft_shape, draft, 1, cfg.backend, compute), "{tokens} tokens")],
        b.max_batch_size * (b.max_seq_len + draft_len), _margin(profile, False, "draft runtime margin"),
    )]


def device_memory_gib(profile: HardwareProfile) -> float:
    return profile.memory_gib if profile.memory_gib is not None else host_memory_gib()


def gpu_estimate(cfg: DeploymentConfig, profile: HardwareProfile, executors: list[ExecutorMemory],
                 kv_tokens: int | None = None, where: str = "") -> MemoryEstimate:
    """Memory of one GPU holding ``executors``. Without a KV capacity each KV cache is sized for
    max batch × its longest sequence and ``kv_pool_gib`` is what the KV fraction leaves; with
    ``kv_tokens`` (the equal capacity of co-resident arms) each KV cache is that many tokens, which
    is what the runtime allocates. ``kv_gib`` is always what max batch × max sequence would need."""
    device_gib = device_memory_gib(profile)
    est = MemoryEstimate(device_gib=device_gib, device=profile.display_name + (f" · {where}" if where else ""))
    batch = cfg.build.max_batch_size
    for executor in executors:
        full = executor.kv_rows(executor.full_tokens, f"{batch} × {executor.full_tokens // batch}")
        kv_rows = full if kv_tokens is None else executor.kv_rows(
            kv_tokens, f"{kv_tokens} (a full batch: {executor.full_tokens})")
        est.rows.extend(executor.rows[:1] + kv_rows[:1] + executor.rows[1:] + kv_rows[1:])
        est.kv_gib += sum(r.gib for r in full)
    est.rows.extend(executor.margin for executor in executors)
    if kv_tokens is not None:
        est.kv_pool_gib = sum(e.kv_per_token_gib * kv_tokens for e in executors)
    else:
        non_kv = est.total_gib - est.kv_gib
        est.kv_pool_gib = max(0.0, cfg.triton.kv_cache_free_gpu_mem_fraction * (device_gib - non_kv))
    return est


def estimate_memory(
    cfg: DeploymentConfig,
    profile: HardwareProfile,
    target_shape: ModelShape,
    draft_shape: ModelShape | None = None,
) -> MemoryEstimate:
    """Per-rank memory of the speculative arm alone on its GPUs (the baseline alone needs less);
    ``pipeline.plan.gpu_layout`` adds the baseline when both arms share a GPU."""
    if not cfg.speculative:
        return gpu_estimate(cfg, profile, [baseline_executor(cfg, profile, target_shape)])
    return gpu_estimate(cfg, profile, speculative_executors(cfg, profile, target_shape, draft_shape))


def host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16.0
