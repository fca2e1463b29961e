"""Fast projections for the CPU: :class:`FastLinear` (the same ``y = x Wᵀ + b`` as
:class:`pipeline.reference.fast.linear.FastLinear`, through the kernel that is cheapest for the row
count) and :class:`RowWeight` (a few-row ``x @ W`` for the fused drafting steps), plus the int8
packing both use. Reads and writes nothing.

Why each kernel (what it costs is in ``benchmarks/results/engine.json``, never here):

- float32, one row: ``torch.mm`` on an ``[in, out]`` copy beats ``F.linear``'s GEMV on the
  ``[out, in]`` weight; several rows: a oneDNN-blocked copy keeps verifying K+1 tokens close to
  the cost of one;
- int8 (float32 compute): the per-row int8 product of the plain Linear (:mod:`pipeline.reference.int8_gemm`), scripted;
- int8 draft-side weights (``int8_copy``): up to :data:`~pipeline.reference.fast.kernels.DRAFT_PACK_ROWS`
  rows run ``torch._weight_int8pack_mm`` on bfloat16 activations — a quarter of float32's bytes,
  nothing quantized per call. Its rounding is not the per-row int8 scheme, which drafts need not
  keep: they change what is accepted, never the output. More rows keep the int8 product.
"""

from __future__ import annotations

import torch

from pipeline.reference.checkpoint import quantize_weight
from pipeline.reference.fast.kernels import FLOAT, INT8, INT8_DRAFT, PLAIN, linear, row_addmm, row_mm
from pipeline.reference.modeling import Linear

PACK_IN_MULTIPLE = 16  # _weight_int8pack_mm reads out of bounds (garbage, or SIGSEGV) for other in_features


class FastLinear(Linear):
    """A :class:`~pipeline.reference.modeling.Linear` whose every call is one TorchScript call,
    :func:`~pipeline.reference.fast.kernels.linear`, with the ``mode`` and ``operands`` fixed
    here. ``drafting=True`` (int8 only): the few-row packed kernel (module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None, drafting: bool = False):
        super().__init__(weight, bias, scale)
        self.packed = None  # drafting kernel: (int8 [out, in], bf16 scale [out])
        if self.int8:
            if drafting:
                self.packed = _pack_int8(weight.contiguous(), self.scale)
            self.mode, self.operands = INT8, [self.gemm_weight, self.scale]
            if self.packed is not None:
                self.mode, self.operands = INT8_DRAFT, [*self.operands, *self.packed]
        else:
            blocked = _prepack_onednn(weight) if weight.dtype == torch.float32 else None
            if blocked is None:
                self.mode, self.operands = PLAIN, [weight]
            else:  # one row: torch.mm on the [in, out] copy; more: the oneDNN-blocked one
                self.mode, self.operands = FLOAT, [weight.t().contiguous(), blocked]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.mode, self.operands, self.bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` for 2-D ``x``; one fused ``addmm`` for float weights without bias
        at one row (the EAGLE draft step), else the plain sum."""
        if self.weight is not None and self.bias is None and x.shape[0] == 1:
            return torch.addmm(residual, x, self.weight.t())
        return residual + self(x)

    def int8_copy(self) -> "FastLinear":
        """The same projection with int8 weights and the drafting kernel; an int8 checkpoint's
        Linear gets the drafting kernel over the same weights."""
        if self.packed is not None or (not self.int8 and self.weight.dtype != torch.float32):
            return self
        if self.int8:
            return FastLinear(self.weight_t.t(), self.bias, self.scale, drafting=True)
        weight, scale = quantize_weight(self.weight)
        return FastLinear(weight, self.bias, scale, drafting=True)


def int8_copy(projection: FastLinear) -> FastLinear:
    return projection.int8_copy()


def _prepack_onednn(weight: torch.Tensor):
    """oneDNN-blocked copy of a float32 weight (None: a torch without oneDNN, F.linear everywhere)."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    except (RuntimeError, AttributeError):
        return None


def _pack_int8(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Operands of ``torch._weight_int8pack_mm`` for int8 ``weight [out, in]``, or None where
    this torch build or shape cannot run it (the caller keeps the int8 product). The kernel does not
    reject what it mishandles (``in`` not a multiple of 16 gave garbage or a crash on torch
    2.13), so the shape is checked first and one random row against the dequantized product."""
    if weight.shape[1] % PACK_IN_MULTIPLE:
        return None
    packed = (weight, scale.to(torch.bfloat16))
    probe = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    try:
        got = torch.ops.aten._weight_int8pack_mm(probe, *packed).float()
    except (RuntimeError, AttributeError):
        return None
    want = probe.float() @ (weight.float() * packed[1].float()[:, None]).t()
    return packed if torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6) else None


class RowWeight:
    """``x @ W`` (and ``x @ W + residual``) for a few rows, ``W`` given as a float ``[in, out]``
    matrix: float runs ``torch.mm`` on it; ``int8`` quantizes it per output channel and runs
    ``torch._weight_int8pack_mm`` on bfloat16 activations (the drafting kernel of
    :class:`FastLinear`), keeping the float matrix where the kernel cannot run and for weights
    that are not float32 (float64 reference runs stay exact). Both go through the scripted
    :func:`~pipeline.reference.fast.kernels.row_mm` / ``row_addmm``, like every fused drafting
    step, so they all round alike."""

    def __init__(self, weight_in_out: torch.Tensor, int8: bool = False):
        int8 = int8 and weight_in_out.dtype == torch.float32
        self.packed = _pack_int8(*quantize_weight(weight_in_out.t())) if int8 else None
        self.weight = weight_in_out if self.packed is None else None
        # the (weight, scale) pair the scripted kernels take
        self.pair = self.packed if self.packed is not None else (self.weight, None)

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return row_mm(x, *self.pair)

    def addmm(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return row_addmm(residual, x, *self.pair)


def pair_lists(weights: list[RowWeight]) -> tuple[list, list]:
    """Per-layer weights as the scripted kernels take them: the matrices, then the scales."""
    return [w.pair[0] for w in weights], [w.pair[1] for w in weights]
