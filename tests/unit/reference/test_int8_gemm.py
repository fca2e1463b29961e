"""The int8 product's two kernels (pipeline/reference/int8_gemm.py): the float one is bit-identical
to ``torch._int_mm``, the choice follows the measurement or the environment, and an int8
projection gives the same bits on either kernel."""

from __future__ import annotations

import pytest
import torch

from pipeline.reference import int8_gemm
from pipeline.reference.checkpoint import quantize_weight
from pipeline.reference.fast.linear import FastLinear
from pipeline.reference.modeling import Linear


@pytest.fixture
def forced(monkeypatch):
    """Force a kernel for the duration of a test (the choice is cached per process)."""

    def force(name: str | None) -> None:
        if name is None:
            monkeypatch.delenv(int8_gemm.ENV, raising=False)
        else:
            monkeypatch.setenv(int8_gemm.ENV, name)
        int8_gemm.kernel.cache_clear()

    yield force
    int8_gemm.kernel.cache_clear()


def _int8(shape, gen, extreme=False):
    if extreme:  # the largest partial sums an int8 product can have
        return torch.full(shape, 127, dtype=torch.int8) * torch.where(torch.rand(shape, generator=gen) < 0.5, -1, 1).to(torch.int8)
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen)


@pytest.mark.parametrize("rows", [1, 2, 8, 17])
@pytest.mark.parametrize("in_features", [256, 1024, 1040, 2048])
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "all-127"])
def test_the_float_kernel_equals_int_mm_bit_for_bit(rows, in_features, extreme, forced):
    forced("float")
    gen = torch.Generator().manual_seed(rows * 7919 + in_features)
    x, weight = _int8((rows, in_features), gen), _int8((in_features, 48), gen, extreme)
    if extreme:
        x = torch.full_like(x, 127)
    want = torch._int_mm(x, weight).to(torch.float32)
    operand = int8_gemm.operand(weight)
    assert operand.dtype == (torch.float32 if in_features <= int8_gemm.FLOAT32_EXACT_IN else torch.float64)
    assert torch.equal(int8_gemm.int8_product(x, operand), want)


def test_beyond_the_float32_bound_float32_would_round():
    """Why the bound: all-127 products summed over 1100 inputs pass 2**24, where float32 rounds."""
    x = torch.full((1, 1100), 127, dtype=torch.int8)
    weight = torch.full((1100, 1), 127, dtype=torch.int8)
    weight[1] = 126  # an odd total above 2**24
    want = torch._int_mm(x, weight).item()
    assert want > 2**24 and want % 2 == 1
    assert x.to(torch.float32).mm(weight.to(torch.float32)).item() != want
    assert x.to(torch.float64).mm(weight.to(torch.float64)).item() == want


def test_int_mm_is_kept_unless_it_is_clearly_slower():
    assert int8_gemm.choose(int_mm_s=1.0, float_s=1.0) == "int_mm"
    assert int8_gemm.choose(int_mm_s=1.9, float_s=1.0) == "int_mm"
    assert int8_gemm.choose(int_mm_s=10.0, float_s=1.0) == "float"


def test_the_environment_forces_a_kernel_and_a_typo_is_named(forced):
    forced("int_mm")
    weight = torch.zeros(16, 8, dtype=torch.int8)
    assert int8_gemm.kernel() == "int_mm" and int8_gemm.operand(weight) is weight
    forced("float")
    assert int8_gemm.kernel() == "float" and int8_gemm.operand(weight).dtype == torch.float32
    forced("fast")
    with pytest.raises(ValueError, match=int8_gemm.ENV):
        int8_gemm.kernel()
    forced(None)
    assert int8_gemm.kernel() in int8_gemm.CHOICES  # measured


@pytest.mark.parametrize("projection", [Linear, FastLinear])
@torch.inference_mode()
def test_an_int8_projection_gives_the_same_bits_on_either_kernel(projection, forced):
    gen = torch.Generator().manual_seed(3)
    weight, scale = quantize_weight(torch.randn(96, 256, generator=gen))
    x = torch.randn(5, 3, 256, generator=gen)
    outputs = {}
    for name in int8_gemm.CHOICES:
        forced(name)
        layer = projection(weight, None, scale)
        assert (layer.gemm_weight.dtype == torch.int8) == (name == "int_mm")
        outputs[name] = layer(x)
    assert torch.equal(outputs["int_mm"], outputs["float"])


def test_a_calibration_records_the_kernel_but_its_key_does_not_depend_on_it(forced):
    from pipeline.forecast import cpu

    forced("float")
    described = cpu.machine()
    assert described["int8_gemm"] == "float"
    forced("int_mm")
    assert cpu.machine()["int8_gemm"] == "int_mm"
    assert cpu.machine_key() == cpu.machine_key(described)  # the same machine's calibration file either way
