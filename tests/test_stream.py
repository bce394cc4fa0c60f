"""lib.kernels.stream in Triton's interpreter: read_sum reads every element once, tails included;
read_pages_sum reads exactly the pages it is given."""

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
    with pytest.raises(ValueError, match="evict='evict_often'"):
        stream.read_sum(a, a, evict="evict_often")
    with pytest.raises(ValueError, match="not both"):
        stream.read_sum(a, a, evict="evict_first", cache=".cg")


@pytest.mark.parametrize("evict,cache", [("evict_first", ""), ("", ".cg"), ("evict_last", "")])
def test_load_hints_keep_the_totals(evict, cache):
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(1000, generator=gen).to(torch.float16)
    b = torch.randn(1000, generator=gen).to(torch.float16)
    want = a.double().sum() + b.double().sum()
    part = stream.read_sum(a, b, programs=3, block=64, evict=evict, cache=cache)
    assert abs(part.double().sum() - want) < 1e-3 * 1000 ** 0.5 + 1e-4
    k = torch.randn(6, 2, 16, 16, generator=gen).to(torch.float16)
    pages = torch.tensor([4, 0, 5], dtype=torch.int32)
    part = stream.read_pages_sum(k, k, pages, programs=2, block=128, evict=evict, cache=cache)
    assert abs(part.double().sum() - 2 * k[pages.long()].double().sum()) < 1e-3 * 2048 ** 0.5 + 1e-4


@pytest.mark.parametrize("H_kv,page,d,n_pages,programs,block", [
    (1, 16, 16, 7, 3, 64),     # several pages per step, a ragged last step
    (2, 16, 16, 5, 2, 128),    # slab of 512 elements, 128 per step: pieces of a page
    (1, 4, 4, 9, 4, 256),      # tiny pages, many per step
    (4, 8, 8, 3, 1, 16),       # one program, smallest block
])
def test_read_pages_sum_reads_each_named_page(H_kv, page, d, n_pages, programs, block):
    gen = torch.Generator().manual_seed(n_pages * 10 + H_kv)
    k = torch.randn(n_pages + 4, H_kv, page, d, generator=gen).to(torch.float16)
    v = torch.randn(n_pages + 4, H_kv, page, d, generator=gen).to(torch.float16)
    pages = torch.randperm(n_pages + 4, generator=gen)[:n_pages].to(torch.int32)  # some pages never named
    part = stream.read_pages_sum(k, v, pages, programs=programs, block=block)
    assert part.shape[0] <= programs
    idx = pages.long()
    want = k[idx].double().sum() + v[idx].double().sum()
    assert abs(part.double().sum() - want) < 1e-3 * k[idx].numel() ** 0.5 + 1e-4


def test_read_pages_sum_rejects_bad_input():
    k = torch.randn(4, 1, 16, 16)
    with pytest.raises(ValueError, match="int32"):
        stream.read_pages_sum(k, k, torch.arange(4))
    with pytest.raises(ValueError, match="contiguous"):
        stream.read_pages_sum(k, k.transpose(2, 3), torch.arange(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="power of two"):
        stream.read_pages_sum(k[..., :12].contiguous(), k[..., :12].contiguous(), torch.arange(4, dtype=torch.int32))
    assert float(stream.read_pages_sum(k, k, torch.zeros(0, dtype=torch.int32)).sum()) == 0
    with pytest.raises(ValueError, match="cache='.cs'"):
        stream.read_pages_sum(k, k, torch.arange(4, dtype=torch.int32), cache=".cs")


def test_empty_inputs_sum_to_zero_without_a_launch():
    """No elements (or no pages): one partial sum of 0, into ``out`` if given; the arguments still checked."""
    empty = torch.zeros(0, dtype=torch.float16)
    part = stream.read_sum(empty, empty)
    assert part.shape == (1,) and part.dtype == torch.float32 and float(part[0]) == 0.0
    out = torch.full((1,), 5.0)
    assert stream.read_sum(empty, empty, programs=3, block=64, out=out) is out and float(out[0]) == 0.0
    with pytest.raises(ValueError, match="evict='evict_often'"):
        stream.read_sum(empty, empty, evict="evict_often")
    pool = torch.zeros(0, 1, 4, 4)  # a pool of no pages
    assert float(stream.read_pages_sum(pool, pool, torch.zeros(0, dtype=torch.int32))[0]) == 0.0
    with pytest.raises(ValueError, match=r"pages\[0\] = 0 names no page of the caches \(they have 0 pages"):
        stream.read_pages_sum(pool, pool, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache='.cs'"):
        stream.read_pages_sum(pool, pool, torch.zeros(0, dtype=torch.int32), cache=".cs")
    with pytest.raises(ValueError, match="must be a power of two.*got 0"):
        stream.read_pages_sum(torch.zeros(2, 1, 0, 4), torch.zeros(2, 1, 0, 4), torch.zeros(1, dtype=torch.int32))
