"""The int8 × int8 product of the engine's int8 projections, on the kernel that is fast on this CPU.

Reads ``SPECDEPLOY_INT8_GEMM`` (``int_mm``, ``float`` or unset: measure) and, unset, times both
kernels once per process; writes nothing.

Why: how fast ``torch._int_mm`` is on a CPU depends on the instruction set its build finds. On an
AVX2-only host (no AVX-512) it ran tens of times slower than a float GEMM of the same shape, which
turned int8 draft weights from a saving into a NO-GO there
(``benchmarks/bench_int8_gemm.py`` measures both side by side). The float kernel here is *exact*,
not an approximation: the int8 values are held as a float copy and every partial sum of int8
products is an integer below 2**24 (float32, for up to :data:`FLOAT32_EXACT_IN` inputs) or 2**53
(float64, beyond), so the product is bit-identical to ``_int_mm``'s and an int8 model's output
does not depend on the host. What it gives up is memory: the copy is 4 (or 8) bytes per weight.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import torch

from pipeline.infra.measured_choice import best_seconds, forced

ENV = "SPECDEPLOY_INT8_GEMM"
CHOICES = ("int_mm", "float")
FLOAT32_EXACT_IN = 1024  # 1024 × 128² = 2**24: every partial sum is an integer float32 holds exactly
SLOWER_THAN_FLOAT = 2.0  # _int_mm is kept unless it costs more than this many float GEMMs


def choose(int_mm_s: float, float_s: float) -> str:
    """The kernel to use from one timing of each on the same shape."""
    return "float" if int_mm_s > SLOWER_THAN_FLOAT * float_s else "int_mm"


def _measure() -> str:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (8, 512), dtype=torch.int8, generator=gen)  # a batched verify's rows
    weight = torch.randint(-127, 128, (512, 512), dtype=torch.int8, generator=gen)
    try:
        int_mm_s = best_seconds(lambda: torch._int_mm(x, weight))
    except (RuntimeError, AttributeError):  # a torch without a CPU _int_mm
        return "float"
    as_float = weight.float()
    return choose(int_mm_s, best_seconds(lambda: torch.mm(x.float(), as_float)))


@lru_cache(maxsize=1)
def kernel() -> str:
    """``int_mm`` or ``float``: ``$SPECDEPLOY_INT8_GEMM`` if set, else the measured faster one."""
    return forced(ENV, CHOICES) or _measure()


def operand(weight_t: torch.Tensor) -> torch.Tensor:
    """What :func:`int8_product` multiplies by for an int8 ``[in, out]`` weight: the weight itself
    for ``_int_mm``, or its exact float copy."""
    if kernel() == "int_mm":
        return weight_t
    return weight_t.to(torch.float32 if weight_t.shape[0] <= FLOAT32_EXACT_IN else torch.float64)


def _int8_product(x_int8: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x_int8 [M, in] @ weight [in, out]`` as float32, ``weight`` from :func:`operand`: int8
    runs ``_int_mm``; a float copy runs ``mm`` on the same integers, exactly."""
    if weight.dtype == torch.int8:
        return torch._int_mm(x_int8, weight).to(torch.float32)
    return torch.mm(x_int8.to(weight.dtype), weight).to(torch.float32)


def _scripted(fn):
    """Scripted, so the scripted kernels can call it (the Python function where TorchScript fails)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return torch.jit.script(fn)
        except Exception:  # noqa: BLE001 - same maths in Python (fast.kernels.script says when that happens)
            return fn


int8_product = _scripted(_int8_product)
