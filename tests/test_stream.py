"""lib.kernels.stream.read_sum in Triton's interpreter: it reads every element once, tails included."""

from __future__ import annotations

import pytest
import torch

from lib.kernels import stream


@pytest.mark.parametrize("n,programs,block", [(1, 4, 16), (1000, 3, 64), (4096, 4, 1024), (5000, 1, 256)])
def test_read_sum_totals(n, programs, block):
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=gen).to(torch.float16)
    b = torch.randn(n, generator=gen).to(torch.float16)
    part = stream.read_sum(a, b, programs=programs, block=block)
    assert part.shape[0] <= programs
    want = a.double().sum() + b.double().sum()
    assert abs(part.double().sum() - want) < 1e-3 * n ** 0.5 + 1e-4


def test_read_sum_rejects_bad_input():
    a = torch.randn(64)
    with pytest.raises(ValueError, match="one size"):
        stream.read_sum(a, torch.randn(32))
    with pytest.raises(ValueError, match="contiguous"):
        stream.read_sum(torch.randn(8, 8).t(), torch.randn(8, 8))
    with pytest.raises(ValueError, match="power of two"):
        stream.read_sum(a, a, block=100)
