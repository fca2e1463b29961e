"""Memory fit per GPU rank: weights by format + KV cache + activations + a runtime margin.

Reads a :class:`DeploymentConfig`, the model shapes (``pipeline.model_shapes``) and the hardware
profile; writes nothing. The estimate follows trtllm-build.md §8: weights ≈ params × bytes/weight ÷
(TP×PP) with embeddings and ``lm_head`` left unquantized; KV per token per rank =
2 × layers/PP × (KV heads × head_dim / TP) × bytes(KV dtype), sized for max batch × (max sequence
+ draft-length overhead). The rank that carries the most is reported (rank 0: in draft-target the
draft shares the target's first GPUs). Figures are GiB.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from pipeline.config import DeploymentConfig, DraftTargetSpec, EagleSpec, MedusaSpec, ModelSpec
from pipeline.hardware import HardwareProfile
from pipeline.model_shapes import ModelShape

GIB = 1024**3
RUNTIME_MARGIN_GIB = 2.0  # CUDA context, cuBLAS/NCCL workspaces, Triton + Python backends
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
    spec = cfg.speculation
    if isinstance(spec, EagleSpec):
        return spec.engine_max_draft_len + spec.num_layers, spec.engine_max_draft_len
    if isinstance(spec, (DraftTargetSpec, MedusaSpec)):
        return spec.engine_max_draft_len, spec.engine_max_draft_len
    return 0, 0


def _effective_num_tokens(cfg: DeploymentConfig, draft_len: int) -> int:
    b = cfg.build
    tokens = max(b.max_num_tokens, b.max_batch_size * (draft_len + 1) if draft_len else 0)
    return min(tokens, b.max_batch_size * b.max_seq_len)


def _heads_rows(cfg: DeploymentConfig, shape: ModelShape, dense: float, tokens: int, compute: str) -> list[MemoryRow]:
    spec = cfg.speculation
    h, v, tp = shape.hidden_size, shape.vocab_size, cfg.target.tp
    if isinstance(spec, MedusaSpec):
        params = spec.num_heads * (h * h + h + v * h)
        return [MemoryRow("Medusa heads", params * dense / tp / GIB, f"{spec.num_heads} heads × (H² + V·H)")]
    if isinstance(spec, EagleSpec):
        params = 2 * h * h + h + shape.layer_params() + v * h + spec.num_layers * v * h
        kv = kv_cache_gib(shape, cfg.target, tokens, cfg.backend, compute, layers=1)
        return [
            MemoryRow("EAGLE head", params * dense / tp / GIB, f"fc + 1 layer + embed + {spec.num_layers} lm_head copies"),
            MemoryRow("EAGLE KV cache", kv, f"1 layer × {tokens} tokens"),
        ]
    return []


def estimate_memory(
    cfg: DeploymentConfig,
    profile: HardwareProfile,
    target_shape: ModelShape,
    draft_shape: ModelShape | None = None,
) -> MemoryEstimate:
    """Per-rank memory estimate for the speculative deployment (the baseline needs less)."""
    compute = cfg.reference.compute_dtype
    device_gib = profile.memory_gib if profile.memory_gib is not None else host_memory_gib()
    est = MemoryEstimate(device_gib=device_gib, device=profile.display_name)
    extra_positions, draft_len = _draft_len_overhead(cfg)
    batch = cfg.build.max_batch_size
    tokens = batch * (cfg.build.max_seq_len + extra_positions)
    t = cfg.target
    est.rows.append(
        MemoryRow(
            "target weights",
            model_weights_gib(target_shape, t, cfg.backend, compute),
            f"{target_shape.total_params() / 1e9:.2f} B params, {t.quantization.format}, TP{t.tp}×PP{t.pp}",
        )
    )
    target_kv = kv_cache_gib(target_shape, t, tokens, cfg.backend, compute)
    est.rows.append(MemoryRow("target KV cache", target_kv, f"{batch} × {cfg.build.max_seq_len + extra_positions} tokens"))
    est.kv_gib += target_kv
    dense = _DTYPE_BYTES[compute if cfg.backend == "reference" else t.dtype]
    for row in _heads_rows(cfg, target_shape, dense, tokens, compute):
        est.rows.append(row)
        if "KV" in row.component:
            est.kv_gib += row.gib
    num_tokens = _effective_num_tokens(cfg, draft_len)
    acts = activations_gib(target_shape, t, num_tokens, batch, draft_len)
    margin = RUNTIME_MARGIN_GIB if profile.is_gpu else 0.5
    draft = cfg.draft
    if draft is not None and draft_shape is not None:
        est.rows.append(
            MemoryRow(
                "draft weights",
                model_weights_gib(draft_shape, draft, cfg.backend, compute),
                f"{draft_shape.total_params() / 1e9:.2f} B params, {draft.quantization.format}, TP{draft.tp}",
            )
        )
        draft_tokens = batch * (cfg.build.max_seq_len + draft_len)
        draft_kv = kv_cache_gib(draft_shape, draft, draft_tokens, cfg.backend, compute)
        est.rows.append(MemoryRow("draft KV cache", draft_kv, f"{batch} × {cfg.build.max_seq_len + draft_len} tokens"))
        est.kv_gib += draft_kv
        acts += activations_gib(draft_shape, draft, min(cfg.build.max_num_tokens, num_tokens), batch, 0)
        margin += EXTRA_MODEL_MARGIN_GIB if profile.is_gpu else 0.25
    est.rows.append(MemoryRow("activations", acts, f"max_num_tokens {num_tokens}"))
    est.rows.append(MemoryRow("runtime margin", margin, "CUDA context, workspaces, server" if profile.is_gpu else "process overhead"))
    non_kv = est.total_gib - est.kv_gib
    est.kv_pool_gib = max(0.0, cfg.triton.kv_cache_free_gpu_mem_fraction * (device_gib - non_kv))
    return est


def host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16.0
