"""lib.kernels.decode_attention against a float32 reference, in Triton's interpreter on the CPU.

Fresh random inputs; ragged lengths including 1 and non-multiples of the page size; page sizes 1, 16,
64, 256; H_q/H_kv of 1, 4, 8, 32; one and several splits; a guard region around the output. fp16 and
fp32 here (the interpreter computes bf16 wrongly); bf16 at full size is checked on the GPU.
"""

from __future__ import annotations

import types

import pytest
import torch

from lib.kernels import decode_attention as da

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def paged_case(lens, H_kv, G, D, page, dtype, gen):
    """Random q and a paged K/V cache whose pages lie in a random order."""
    B, L = len(lens), max(lens)
    q = torch.randn(B, G * H_kv, D, generator=gen).to(dtype)
    k = torch.randn(B, H_kv, L, D, generator=gen).to(dtype)
    v = torch.randn(B, H_kv, L, D, generator=gen).to(dtype)
    kc, bt = da.paginate(k, page, generator=gen)
    vc, _ = da.paginate(v, page, block_table=bt)
    return q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32)


def run_guarded(q, kc, vc, bt, lens, **kw):
    """Run into a view of a NaN-poisoned buffer with a guard row on each side; check every element
    of the output was written and nothing around it."""
    B, H_q, D = q.shape
    buf = torch.full((B + 2, H_q, D), float("nan"), dtype=q.dtype)
    out = da.decode_attention(q, kc, vc, bt, lens, out=buf[1:-1], **kw)
    assert out.data_ptr() == buf[1:-1].data_ptr()
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all(), "wrote outside the output"
    assert not torch.isnan(out).any(), "left part of the output unwritten"
    return out


def rel_err(out, ref):
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("page", [1, 16, 64, 256])
@pytest.mark.parametrize("G", [1, 4, 8, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(page, G, dtype):
    gen = torch.Generator().manual_seed(1000 * page + 10 * G + (dtype == torch.float16))
    H_kv = 1 if G == 32 else 2
    lens = [1, page + 3, 2 * page - 1 if page > 1 else 7, 97]
    q, kc, vc, bt, sl = paged_case(lens, H_kv, G, 32, page, dtype, gen)
    ref = da.reference(q, kc, vc, bt, sl)
    for splits, combine in ((1, "kernel"), (4, "kernel"), (4, "inline")):
        out = run_guarded(q, kc, vc, bt, sl, num_splits=splits, block_n=16, combine=combine)
        assert rel_err(out, ref) < TOL[dtype], (page, G, dtype, splits, combine)


@pytest.mark.parametrize("G", [24, 32, 48])
@pytest.mark.parametrize("combine", ["kernel", "inline"])
def test_head_blocks(G, combine):
    """A group split over programs of 16 query heads (the last one partly masked when 16 does not divide
    it), each reading the same K and V: every head written once, right, and nothing outside."""
    gen = torch.Generator().manual_seed(G)
    q, kc, vc, bt, sl = paged_case([1, 19, 40], 2, G, 32, 16, torch.float32, gen)
    ref = da.reference(q, kc, vc, bt, sl)
    for splits in (1, 4):
        out = run_guarded(q, kc, vc, bt, sl, num_splits=splits, block_n=16, combine=combine, head_block=16)
        assert rel_err(out, ref) < 1e-5, (G, combine, splits)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, head_block=16)
    assert plan.grid[1] == 2 * -(-G // 16) and plan.meta["HEAD_BLOCKS"] == -(-G // 16)
    with pytest.raises(ValueError, match="head_block"):
        da.DecodeAttention(q, kc, vc, bt, sl, head_block=24)


def test_dense_cache_is_one_page_per_request():
    gen = torch.Generator().manual_seed(7)
    B, H_kv, G, L, D = 3, 2, 4, 50, 64
    q = torch.randn(B, H_kv * G, D, generator=gen)
    k, v = torch.randn(B, H_kv, L, D, generator=gen), torch.randn(B, H_kv, L, D, generator=gen)
    kc, bt = da.dense_as_paged(k)
    lens = torch.tensor([50, 1, 33], dtype=torch.int32)
    out = run_guarded(q, kc, v, bt, lens, block_n=16)
    assert rel_err(out, da.reference(q, kc, v, bt, lens)) < 1e-5


def test_split_reduction_resets_its_counters():
    """The last split of each (request, KV head) combines the partials and zeroes the counter: a second
    call on new data must be right too."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        q, kc, vc, bt, sl = paged_case([40, 9], 2, 4, 32, 16, torch.float32, gen)
        out = run_guarded(q, kc, vc, bt, sl, num_splits=8, block_n=16, combine="inline")
        assert rel_err(out, da.reference(q, kc, vc, bt, sl)) < 1e-5
    counters = [ws[3] for key, ws in da._WORKSPACE.items() if key[-1] == 8]
    assert counters and all(int(c.abs().sum()) == 0 for c in counters)


@pytest.mark.parametrize("combine", ["kernel", "inline"])
def test_empty_splits_and_scale(combine):
    """More splits than the short requests have tokens: empty splits must not disturb the result."""
    gen = torch.Generator().manual_seed(5)
    q, kc, vc, bt, sl = paged_case([1, 2, 64], 1, 4, 16, 16, torch.float32, gen)
    out = run_guarded(q, kc, vc, bt, sl, num_splits=4, block_n=16, scale=0.3, combine=combine)
    assert rel_err(out, da.reference(q, kc, vc, bt, sl, scale=0.3)) < 1e-5


@pytest.mark.parametrize("combine", ["kernel", "inline"])
def test_splits_past_the_block_table(combine):
    """Splits that start beyond the block table's last page: their first block-table load is masked by the
    table's width (not by the length, which loads alongside it), and they contribute nothing."""
    gen = torch.Generator().manual_seed(21)
    q, kc, vc, bt, sl = paged_case([17, 3], 2, 4, 32, 16, torch.float32, gen)  # tables of 2 pages
    ref = da.reference(q, kc, vc, bt, sl)
    for block_n in (16, 32, 64):  # one entry per tile, one per token, one per page
        out = run_guarded(q, kc, vc, bt, sl, num_splits=4, block_n=block_n, combine=combine)
        assert rel_err(out, ref) < 1e-5, block_n


def test_choose_tile():
    # groups of up to 16 query heads: one warp, tiles of 16 (the seed: B=8, H_kv=8, 4 heads per KV head)
    assert da.choose_tile(pairs=64, max_len=4096, sms=132, group=4) == (16, True, 1)
    assert da.choose_tile(pairs=512, max_len=512, sms=132, group=4) == (16, True, 1)
    assert da.choose_tile(pairs=2048, max_len=4096, sms=132, group=1) == (64, False, 4)  # many programs
    assert da.choose_tile(pairs=64, max_len=16384, sms=132, group=32) == (64, True, 4)  # splits of 2048 tokens
    # groups of 32 over more than 1024 tokens: tiles of 64; over 1024 or fewer, tiles of 32
    assert da.choose_tile(pairs=1, max_len=131072, sms=132, group=32) == (64, True, 4)
    assert da.choose_tile(pairs=8, max_len=2048, sms=132, group=32) == (64, True, 4)
    assert da.choose_tile(pairs=8, max_len=1024, sms=132, group=32) == (32, True, 4)
    assert da.choose_tile(pairs=128, max_len=512, sms=132, group=32, head_blocks=2) == (128, True, 4)
    gen = torch.Generator().manual_seed(12)
    q, kc, vc, bt, sl = paged_case([40, 9], 2, 8, 32, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl)  # the plan takes all three; a caller's choice wins
    assert (plan.meta["BLOCK_N"], plan.meta["PREFETCH"], plan.options["num_warps"]) == (16, True, 1)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, block_n=32, prefetch=False, num_warps=4)
    assert (plan.meta["BLOCK_N"], plan.meta["PREFETCH"], plan.options["num_warps"]) == (32, False, 4)
    assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5


def test_wide_and_long_plan_asks_for_one_wave():
    """MQA-like groups over more than 1024 tokens: tiles of 64 and about one program per SM (the CPU
    counts as 4 SMs), where other groups get two waves."""
    assert da.wide_and_long(32, 1025) and not da.wide_and_long(32, 1024) and not da.wide_and_long(16, 4096)
    gen = torch.Generator().manual_seed(13)
    q, kc, vc, bt, sl = paged_case([1100, 2048], 1, 32, 16, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl)  # 2 pairs, 4 SMs: one wave is 2 splits, two waves 4
    assert (plan.meta["BLOCK_N"], plan.options["num_warps"], plan.splits) == (64, 4, 2)
    assert da.choose_splits(2, 2048, 64, 4, waves=2.0) == 4
    assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5
    q, kc, vc, bt, sl = paged_case([900, 1024], 1, 32, 16, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, head_block=32)  # 1024 tokens: two waves
    assert (plan.meta["BLOCK_N"], plan.splits) == (64, 4)


def test_choose_head_block_and_its_plan():
    assert da.choose_head_block(pairs=64, max_len=512, sms=132, group=32) == 16  # MQA, short: blocks of 16
    assert da.choose_head_block(pairs=64, max_len=4096, sms=132, group=32) == 32  # long: one program per group
    assert da.choose_head_block(pairs=8, max_len=512, sms=132, group=32) == 32  # few pairs: split the context
    assert da.choose_head_block(pairs=64, max_len=512, sms=132, group=4) == 16  # a small group is padded to 16
    gen = torch.Generator().manual_seed(11)
    q, kc, vc, bt, sl = paged_case([33, 7], 1, 32, 32, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl)  # 2 pairs on the interpreter's 4 "SMs": blocks of 16
    assert (plan.meta["BLOCK_G"], plan.meta["HEAD_BLOCKS"], plan.splits, plan.meta["BLOCK_N"]) == (16, 2, 1, 128)
    assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5


def test_choose_splits():
    assert da.choose_splits(programs=64, max_len=4096, block_n=64, sms=132) == 8  # about 2 waves
    assert da.choose_splits(programs=2048, max_len=4096, block_n=64, sms=132) == 1
    assert da.choose_splits(programs=1, max_len=100, block_n=64, sms=132) == 2  # no more than the tiles
    s = da.choose_splits(programs=1, max_len=1 << 20, block_n=64, sms=132)
    assert s == 256 and s & (s - 1) == 0  # the cap
    assert da.choose_splits(programs=1, max_len=1 << 20, block_n=64, sms=132, most=64) == 64
    # a group of 32 query heads: the partials to combine stay no larger than one split's share
    assert da.choose_splits(programs=1, max_len=4096, block_n=64, sms=132, group=32) == 8
    assert da.choose_splits(programs=1, max_len=4096, block_n=64, sms=132, group=4) == 32


@pytest.mark.parametrize("combine", ["kernel", "inline"])
def test_many_splits_with_empty_splits(combine):
    """Many splits of d=128; short requests leave most splits empty."""
    gen = torch.Generator().manual_seed(7)
    q, kc, vc, bt, sl = paged_case([1, 300, 17], 2, 4, 128, 16, torch.float32, gen)
    out = run_guarded(q, kc, vc, bt, sl, num_splits=16, block_n=16, combine=combine)
    assert rel_err(out, da.reference(q, kc, vc, bt, sl)) < 1e-5


def test_bad_input_is_rejected():
    gen = torch.Generator().manual_seed(0)
    q, kc, vc, bt, sl = paged_case([5], 2, 4, 32, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        da.decode_attention(q[:, :7], kc, vc, bt, sl)
    with pytest.raises(TypeError, match="int32"):
        da.decode_attention(q, kc, vc, bt.long(), sl)
    with pytest.raises(TypeError, match="share one of"):
        da.decode_attention(q.half(), kc, vc, bt, sl)
    with pytest.raises(ValueError, match="power of two"):
        da.decode_attention(q[..., :24], kc[..., :24], vc[..., :24], bt, sl)
    with pytest.raises(ValueError, match="num_splits"):
        da.decode_attention(q, kc, vc, bt, sl, num_splits=3)
    with pytest.raises(ValueError, match="combine must be"):
        da.decode_attention(q, kc, vc, bt, sl, combine="later")
    with pytest.raises(ValueError, match="block_table must be"):
        da.decode_attention(q, kc, vc, bt[:, :0].expand(2, 0), sl)


def test_planned_launches_match_and_check_shapes():
    gen = torch.Generator().manual_seed(11)
    q, kc, vc, bt, sl = paged_case([30, 7], 2, 4, 32, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=2, block_n=16)
    assert plan.combine == "inline" and not plan.second  # few splits: combined inside the one launch
    many = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=16, block_n=16)
    assert many.combine == "kernel" and many.second
    for _ in range(2):  # the first call compiles (or interprets), later ones launch directly on a GPU
        q2, kc2, vc2, bt2, sl2 = paged_case([30, 7], 2, 4, 32, 16, torch.float32, gen)
        out = plan(q2, kc2, vc2, bt2, sl2)
        assert rel_err(out, da.reference(q2, kc2, vc2, bt2, sl2)) < 1e-5
    with pytest.raises(ValueError, match="planned shapes"):
        plan(q[:1], kc, vc, bt[:1], sl[:1])


def test_partials_combined_by_hand():
    """The split pass alone: its partials, combined by log-sum-exp in float64 (``combine_partials``), give
    the reference; a split past a request's end has no tokens (m = -inf, l = 0); the combined call
    agrees; plans that combine inside their one launch refuse."""
    gen = torch.Generator().manual_seed(17)
    q, kc, vc, bt, sl = paged_case([61, 5, 33], 2, 4, 32, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=4, block_n=16, combine="kernel")
    acc, m, l_sum = (t.clone().double() for t in plan.partials(q, kc, vc, bt, sl))
    assert acc.shape == (3, 8, 4, 32) and m.shape == l_sum.shape == (3, 8, 4)
    # splits of 16 tokens: request 1 (5 tokens) has tokens in its first split only
    assert torch.isinf(m[1, :, 1:]).all() and (m[1, :, 1:] < 0).all() and (l_sum[1, :, 1:] == 0).all()
    assert torch.isfinite(m[0]).all() and (l_sum[0] >= 1).all()
    by_hand = da.combine_partials(acc, m, l_sum)
    ref = da.reference(q, kc, vc, bt, sl, dtype=torch.float64)
    assert ((by_hand - ref).norm() / ref.norm()).item() < 1e-5
    assert rel_err(plan(q, kc, vc, bt, sl), ref.float()) < 1e-5
    inline = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=4, block_n=16, combine="inline")
    with pytest.raises(ValueError, match="combine='kernel'"):
        inline.partials(q, kc, vc, bt, sl)


@pytest.mark.parametrize("per_page", [True, False])
@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("page", [1, 16, 32, 64])
def test_block_table_prefetch_either_way(prefetch, page, per_page):
    """Requesting the next tile's page numbers a step ahead, one per page or one per token, must not
    change the result; ragged lengths end inside a page and inside a tile."""
    gen = torch.Generator().manual_seed(13 + page)
    q, kc, vc, bt, sl = paged_case([1, 31, 100, 64], 2, 4, 32, page, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=2, block_n=32, prefetch=prefetch, per_page=per_page)
    out = plan(q, kc, vc, bt, sl)
    assert plan.meta["PREFETCH"] is prefetch and plan.meta["PER_PAGE"] is per_page
    assert rel_err(out, da.reference(q, kc, vc, bt, sl)) < 1e-5
    assert da.DecodeAttention(q, kc, vc, bt, sl, block_n=32).meta["PER_PAGE"] is (32 >= 4 * page)


@pytest.mark.parametrize("prefetch", [True, False])
def test_block_table_prefetch_dense(prefetch):
    """A contiguous cache is one page per request: the prefetch looks up one entry per tile."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 4, 32, generator=gen)
    k, v = torch.randn(2, 3, 2, 96, 32, generator=gen)
    kc, bt = da.dense_as_paged(k)
    sl = torch.tensor([96, 1, 33], dtype=torch.int32)
    out = da.DecodeAttention(q, kc, v, bt, sl, num_splits=2, block_n=32, prefetch=prefetch)(q, kc, v, bt, sl)
    assert rel_err(out, da.reference(q, kc, v, bt, sl)) < 1e-5


def test_tiles_in_flight_reads_the_compiled_ring():
    gen = torch.Generator().manual_seed(6)
    q, kc, vc, bt, sl = paged_case([5, 40], 2, 4, 32, 16, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, block_n=32)
    assert plan.tiles_in_flight() is None  # nothing compiled in the interpreter
    ring = "%k = ttg.local_alloc : () -> !ttg.memdesc<2x32x32xf32, #shared, #smem, mutable>"
    plan.compiled = types.SimpleNamespace(asm={"ttgir": ring + "\n!ttg.memdesc<16x32xf32, #shared, #smem>"})
    assert plan.tiles_in_flight() == 2
    plan.compiled = types.SimpleNamespace(asm={"ttgir": "no shared buffers"})
    assert plan.tiles_in_flight() is None
