"""The oneDNN float projection runs at a bounded set of row counts (``kernels.bucket_rows``):
padding keeps every real row's bits, the set stays small for any batch, and running many
distinct row counts no longer grows the process's memory once each bucket has been seen."""

from __future__ import annotations

import psutil
import pytest
import torch

from pipeline.reference.fast import kernels
from pipeline.reference.fast.linear import FastLinear as Linear


def test_buckets_are_few_cover_every_row_count_and_pad_little():
    assert isinstance(kernels.bucket_rows, torch.jit.ScriptFunction)
    buckets = {kernels.bucket_rows(rows) for rows in range(2, 4097)}
    assert len(buckets) <= 48
    assert [kernels.bucket_rows(rows) for rows in range(1, 9)] == list(range(1, 9))  # a verify pass: as it is
    for rows in range(9, 4097):
        padded = kernels.bucket_rows(rows)
        assert padded >= rows and padded % 4 == 0
        assert padded <= (rows + 3 if rows <= 64 else rows * 5 // 4 + 1), rows
    assert kernels.bucket_rows(kernels.bucket_rows(100)) == kernels.bucket_rows(100)  # buckets map to themselves


def _unpadded(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    """What the float kernel computed before bucketing: oneDNN at exactly ``x``'s row count."""
    return torch.ops.mkldnn._linear_pointwise(x, lin.operands[1], lin.bias, "none", [], "")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", [(768, 256), (256, 672), (1024, 256)], ids=["qkv", "down", "lm-head"])
@torch.inference_mode()
def test_padded_rows_leave_the_real_rows_bit_identical(shape, bias):
    g = torch.Generator().manual_seed(shape[0] + bias)
    out_features, in_features = shape
    lin = Linear(torch.randn(out_features, in_features, generator=g),
                 torch.randn(out_features, generator=g) if bias else None)
    assert lin.mode == kernels.FLOAT
    for rows in [*range(2, 70), 97, 129, 200, 257, 511]:
        x = torch.randn(rows, in_features, generator=g)
        got = lin(x)
        assert got.shape == (rows, out_features)
        assert torch.equal(got, _unpadded(lin, x)), rows
    x3 = torch.randn(3, 6, in_features, generator=g)  # [B, T, H] as the batched forward passes it
    assert torch.equal(lin(x3), _unpadded(lin, x3.reshape(18, in_features)).reshape(3, 6, out_features))


@pytest.mark.slow
@torch.inference_mode()
def test_many_distinct_row_counts_stop_growing_memory_once_every_bucket_was_seen():
    lins = [Linear(torch.randn(o, i, generator=torch.Generator().manual_seed(o + i)))
            for o, i in [(768, 256), (256, 256), (1344, 256), (256, 672)]]
    inputs = {lin: torch.randn(400, lin.operands[0].shape[0]) for lin in lins}

    def sweep(order):
        for rows in order:
            for lin in lins:
                lin(inputs[lin][:rows])

    proc = psutil.Process()
    sweep(range(2, 400))  # every bucket up to 400 rows once
    before = proc.memory_info().rss
    sweep(range(399, 1, -1))
    sweep(range(2, 400, 3))
    grown_mb = (proc.memory_info().rss - before) / 2**20
    # unpadded, every row count is a shape of its own and the sweep re-creates evicted ones
    assert grown_mb < 40, f"RSS grew {grown_mb:.0f} MB over row counts already bucketed"
