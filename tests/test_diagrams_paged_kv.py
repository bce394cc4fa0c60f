"""The paged-KV diagram (lib.diagrams.paged_kv): a hand-worked batch, the split ranges against hand-worked
plans and against what the kernel itself computes per split, and bad input refused."""

from __future__ import annotations

import types

import pytest
import torch

from lib.bench import glue
from lib.diagrams import paged_kv
from lib.kernels import decode_attention as da


def test_example_batch_by_hand():
    # a request of 2 blocks takes 0 and 1 and finishes: they go to the end of the free list [2..9, 0, 1];
    # then requests of 40, 64 and 19 tokens (3, 4 and 2 blocks of 16) take one block each in turns:
    # round 1: 2, 3, 4; round 2: 5, 6, 7; round 3: 8, 9 (request 2 is full); round 4: 0 (request 1)
    pool, table, lens = paged_kv.example_batch((40, 64, 19), block_size=16, num_blocks=10, finished=2)
    assert lens == [40, 64, 19]
    assert table == [[2, 5, 8, 8], [3, 6, 9, 0], [4, 7, 7, 7]]  # rows padded with their last entry
    assert pool.free_count == 1 and pool.is_free(1) and not pool.is_free(0)
    assert [pool.refs[b] for b in range(10)] == [1, 0, 1, 1, 1, 1, 1, 1, 1, 1]


def test_example_batch_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="larger num_blocks"):
        paged_kv.example_batch((40, 64), block_size=16, num_blocks=6)  # 3 + 4 blocks
    with pytest.raises(ValueError, match="positive token counts"):
        paged_kv.example_batch((40, 0))


def _plan(splits, block_n, max_seq_len=None, pages=4, page=16):
    """The attributes split_ranges reads, for hand-worked plans."""
    return types.SimpleNamespace(splits=splits, meta={"BLOCK_N": block_n}, max_seq_len=max_seq_len, page=page,
                                 layout=(None, None, None, (3, pages), None))


def test_split_ranges_by_hand():
    # capacity 4 pages of 16 = 64 tokens, 4 splits, tiles of 16: 16 tokens per split
    assert paged_kv.split_ranges(_plan(4, 16), [40, 64, 19]) == [
        [(0, 16), (16, 32), (32, 40), (40, 40)],
        [(0, 16), (16, 32), (32, 48), (48, 64)],
        [(0, 16), (16, 19), (19, 19), (19, 19)]]
    # a bound of 100 tokens in 4 splits: 25 tokens, rounded up to whole tiles of 16: 32 per split
    assert paged_kv.split_len(_plan(4, 16, max_seq_len=100)) == 32
    assert paged_kv.split_ranges(_plan(4, 16, max_seq_len=100), [100, 33]) == [
        [(0, 32), (32, 64), (64, 96), (96, 100)],
        [(0, 32), (32, 33), (33, 33), (33, 33)]]
    assert paged_kv.split_ranges(_plan(1, 16), [7]) == [[(0, 7)]]


@pytest.mark.parametrize("lens, splits", [((40, 64, 19), 4), ((5, 64, 33), 8), ((64, 17, 1), 2)])
def test_split_ranges_match_the_kernels_own_splits(lens, splits):
    """The kernel's split pass writes m = -inf for a split that holds no token of its request: exactly the
    empty ranges; and each split's l (the sum of 2^(s - m) over its tokens) lies between 1 and its token count."""
    pool, table, lens = paged_kv.example_batch(lens, block_size=16, num_blocks=16, finished=0)
    gen = torch.Generator().manual_seed(0)
    H_q, H_kv, D = 4, 1, 16
    q = torch.randn(len(lens), H_q, D, generator=gen)
    k = torch.randn(pool.num_blocks, H_kv, pool.block_size, D, generator=gen)
    v = torch.randn(pool.num_blocks, H_kv, pool.block_size, D, generator=gen)
    bt, sl = torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    plan = da.DecodeAttention(q, k, v, bt, sl, combine="kernel", num_splits=splits)
    _, m, l_sum = plan.partials(q, k, v, bt, sl)
    for r, row in enumerate(paged_kv.split_ranges(plan, lens)):
        assert len(row) == splits
        for s, (a, b) in enumerate(row):
            if a == b:
                assert torch.isinf(m[r, :, s]).all() and (m[r, :, s] < 0).all()
            else:
                assert torch.isfinite(m[r, :, s]).all()
                assert ((l_sum[r, :, s] >= 1 - 1e-5) & (l_sum[r, :, s] <= (b - a) + 1e-5)).all()
        covered = sorted(t for a, b in row for t in range(a, b))
        assert covered == list(range(lens[r]))  # the splits cover every token once


def _default_plan(pool, table, lens):
    q = torch.zeros(len(lens), 4, 16)
    k = torch.zeros(pool.num_blocks, 1, pool.block_size, 16)
    return da.DecodeAttention(q, k, k, torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32))


def test_figure_is_legible_and_refuses_a_table_that_disagrees_with_the_pool():
    pool, table, lens = paged_kv.example_batch()
    plan = _default_plan(pool, table, lens)
    fig = paged_kv.figure(pool, table, lens, plan)
    glue.figure_png("fig_03_paged_kv", fig)  # raises if any text would be shown under 9 pt
    words = {t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))}
    assert "L = 40" in words and "combine: out[2]" in words
    with pytest.raises(ValueError, match="one row per request"):
        paged_kv.figure(pool, table[:2], lens, plan)
    with pytest.raises(ValueError, match="free in the pool"):
        paged_kv.figure(pool, [[1, 5, 8, 8], *table[1:]], lens, plan)  # block 1 is free
    with pytest.raises(ValueError, match="names only"):
        paged_kv.figure(pool, [[2, 5], *table[1:]], lens, plan)
