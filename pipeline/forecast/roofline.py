"""Time of one forward: a model over B sequences × T new tokens with context L.

Reads nothing, writes nothing. A :class:`ModelCost` is what one forward of a model (or a drafting
head) moves and computes on its busiest rank, derived from its shapes
(:class:`pipeline.facts.model_shapes.ModelShape`) and formats (bytes per weight and per KV
element as :mod:`pipeline.facts.memory_fit` sizes them). A device turns it into seconds:

- :class:`GpuDevice` — the roofline ``max(bytes / (BW·η_mem), FLOPs / (peak·η_comp))`` plus a fixed
  per-step overhead, plus, under tensor parallelism, two all-reduces per layer
  (latency + ring traffic ``2(tp−1)/tp · B·T·H·2 bytes`` over NVLink);
- the CPU device (:mod:`pipeline.forecast.cpu`), the same terms with coefficients fitted to a
  microbenchmark of the reference engine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.facts.model_shapes import ModelShape
from pipeline.forecast.figures import EngineFigures, GpuFigures

ACTIVATION_BYTES = 2  # fp16/bf16 activations on the wire of an all-reduce


@dataclass(frozen=True)
class ModelCost:
    """One forward's work on the busiest rank (TP splits every term)."""

    name: str
    weight_bytes: float  # weights read once per forward
    flops_per_token: float  # 2 × parameters touched per new token
    kv_bytes_per_ctx_token: float  # KV read per context token per sequence (all layers)
    attn_flops_per_ctx_token: float  # QKᵀ + AV per new token per context token
    layers: int
    hidden: int
    tp: int = 1
    compute_dtype: str = "bfloat16"
    overhead_share: float = 1.0  # of the engine's fixed per-step cost: 1 for a forward of its own (a draft
    # model's step); a head inside the target's step pays per layer it adds (layers ÷ the target's)

    def scaled(self, name: str, layers: int, params: float, bytes_per_param: float) -> ModelCost:
        """A head of ``params`` weights and ``layers`` decoder layers on this model's shapes."""
        per_layer_kv = self.kv_bytes_per_ctx_token / max(self.layers, 1)
        per_layer_attn = self.attn_flops_per_ctx_token / max(self.layers, 1)
        return ModelCost(name, params * bytes_per_param / self.tp, 2 * params / self.tp, per_layer_kv * layers,
                         per_layer_attn * layers, layers, self.hidden, self.tp, self.compute_dtype,
                         overhead_share=max(layers, 1) / max(self.layers, 1))


def model_cost(name: str, shape: ModelShape, weight_bytes_per_param: float, dense_bytes: float,
               kv_bytes: float, tp: int = 1, compute_dtype: str = "bfloat16") -> ModelCost:
    """Cost of a decoder model: body at its weight format, LM head unquantized, embedding lookup free."""
    body, head = shape.body_params(), shape.embedding_params()
    kv_width = shape.num_kv_heads * shape.head_dim
    return ModelCost(
        name=name,
        weight_bytes=(body * weight_bytes_per_param + head * dense_bytes) / tp,
        flops_per_token=2 * (body + head) / tp,
        kv_bytes_per_ctx_token=2 * shape.num_layers * kv_width * kv_bytes / tp,
        attn_flops_per_ctx_token=4 * shape.num_layers * shape.num_heads * shape.head_dim / tp,
        layers=shape.num_layers, hidden=shape.hidden_size, tp=tp, compute_dtype=compute_dtype,
    )


@dataclass(frozen=True)
class ForwardTime:
    seconds: float
    memory_s: float
    compute_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def regime(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


@dataclass(frozen=True)
class GpuDevice:
    gpu: GpuFigures
    engine: EngineFigures
    kind: str = "gpu"

    def describe(self) -> dict:
        return {"kind": "gpu", "hardware": self.gpu.name, "engine": self.engine.name,
                "hbm_bandwidth_gb_s": self.gpu.hbm_bandwidth_gb_s, "peak_dense_tflops": self.gpu.peak_dense_tflops,
                "memory_efficiency": self.engine.memory_efficiency, "compute_efficiency": self.engine.compute_efficiency,
                "step_overhead_ms": self.engine.step_overhead_ms, "source": self.gpu.source}

    def with_overhead(self, step_overhead_ms: float) -> GpuDevice:
        return GpuDevice(self.gpu, replace(self.engine, step_overhead_ms=step_overhead_ms))

    def scaled(self, factor: float) -> GpuDevice:
        """Efficiencies × ``factor`` (the band's edges)."""
        e = self.engine
        return GpuDevice(self.gpu, replace(e, memory_efficiency=min(1.0, e.memory_efficiency * factor),
                                           compute_efficiency=min(1.0, e.compute_efficiency * factor)))

    def forward(self, model: ModelCost, batch: int, tokens: int, context: int) -> ForwardTime:
        rows = batch * tokens
        memory_s, compute_s = self._roofline(model, rows, batch * (context + tokens) * model.kv_bytes_per_ctx_token,
                                             rows * context)
        allreduce_s = 0.0
        if model.tp > 1:
            ring = 2 * (model.tp - 1) / model.tp * rows * model.hidden * ACTIVATION_BYTES
            per_call = self.engine.allreduce_latency_us * 1e-6 + ring / (self.gpu.interconnect_gb_s * 1e9 / 2)
            allreduce_s = 2 * model.layers * per_call
        overhead_s = self.engine.step_overhead_ms * 1e-3 * model.overhead_share
        return ForwardTime(max(memory_s, compute_s) + allreduce_s + overhead_s, memory_s, compute_s, allreduce_s, overhead_s)

    def prefill_seconds(self, model: ModelCost, prompt_tokens: int, batch: int, width: float, context: int) -> float:
        """One admission's prefill as in-flight batching runs it, inside a step of the others
        (``batch`` sequences × ``width`` tokens): what the step costs with the prompt's rows (and
        the KV they write) beyond what it costs without them — the weights are read once for both."""
        rows = batch * width
        alone = self._roofline(model, rows, batch * (context + width) * model.kv_bytes_per_ctx_token, rows * context)
        joined = self._roofline(model, rows + prompt_tokens,
                                (batch * (context + width) + prompt_tokens) * model.kv_bytes_per_ctx_token,
                                rows * context + prompt_tokens * prompt_tokens / 2)
        return max(max(joined) - max(alone), 0.0)

    def _roofline(self, model: ModelCost, rows: float, kv_bytes: float, attended: float) -> tuple[float, float]:
        """(memory, compute) seconds of a forward over ``rows`` tokens that moves the weights and
        ``kv_bytes`` of KV and attends over ``attended`` (row, context token) pairs."""
        memory_s = (model.weight_bytes + kv_bytes) / (self.gpu.bandwidth * self.engine.memory_efficiency)
        flops = rows * model.flops_per_token + attended * model.attn_flops_per_ctx_token
        return memory_s, flops / (self.gpu.peak_flops(model.compute_dtype) * self.engine.compute_efficiency)

    def round_trip_s(self, orchestration: str | None) -> float:
        """Extra cost per step of an orchestration: the BLS pays a model call per round."""
        return {"bls": self.engine.bls_round_trip_ms * 1e-3}.get(orchestration or "", 0.0)

    # the step terms a CPU calibration measures (forecast/cpu.py CpuDevice); on a GPU the engine's
    # per-step overhead is inside ``forward`` and the proposer's cost follows from its shapes
    def step_overhead(self, batch: int) -> float:
        return 0.0

    def proposer_seconds(self, method: str, batch: int) -> float | None:
        return None

    def spec_step_extra(self, method: str, batch: int) -> float:
        return 0.0  # not modelled on a GPU (docs/forecast.md: why a concurrency trend can miss)
