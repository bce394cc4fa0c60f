"""lib.kernels.decode_attention against a float32 reference, in Triton's interpreter on the CPU.

Fresh random inputs; ragged lengths including 1 and non-multiples of the page size; page sizes 1, 16,
64, 256; H_q/H_kv of 1, 4, 8, 32; one and several splits; a guard region around the output. fp16 and
fp32 here (the interpreter computes bf16 wrongly); bf16 at full size is checked on the GPU.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import decode_attention as da
from lib.kernels import launch

triton = da.triton  # as the kernels imported it

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


# ---------------------------------------------------------------- the launch rules, by their properties
MAX_SHARED = 232448  # bytes of shared memory one program may use on Hopper (sm_90)


@settings(max_examples=400, deadline=None)
@given(programs=st.integers(1, 20000), max_len=st.integers(1, 1 << 21), block_n=st.sampled_from([16, 32, 64, 128]),
       sms=st.sampled_from([4, 78, 108, 132, 144]), group=st.integers(1, 64), waves=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
       most=st.sampled_from([8, 64, 256, 1024]))
def test_choose_splits_properties(programs, max_len, block_n, sms, group, waves, most):
    s = da.choose_splits(programs, max_len, block_n, sms, group=group, waves=waves, most=most)
    assert s >= 1 and s & (s - 1) == 0, "the combine kernel loads a head's partials as one block: a power of two"
    tiles = -(-max_len // block_n)
    assert s <= max(1, tiles), "a split without a whole tile only adds a partial"
    assert s <= most
    sqrt_cap = max(1, math.isqrt(max_len // group))
    assert s <= sqrt_cap, "the partials one program combines stay no larger than what one split reads"
    want = waves * sms
    if programs * s < want:  # short of the wanted waves only where doubling would break a cap
        assert 2 * s > min(max(1, tiles), most, sqrt_cap)
    if s > 1:  # the smallest power of two that reaches them
        assert programs * (s // 2) < want


def test_choose_splits_follows_the_programs():
    """More programs before splitting never get more splits; one program over a long context gets many."""
    counts = [da.choose_splits(p, 65536, 64, 132) for p in (1, 2, 8, 64, 256, 1024, 4096)]
    assert counts == sorted(counts, reverse=True) and counts[0] >= 64 and counts[-1] == 1


@settings(max_examples=400, deadline=None)
@given(pairs=st.integers(1, 4096), max_len=st.integers(1, 1 << 18), sms=st.sampled_from([4, 78, 132, 144]),
       group=st.sampled_from([1, 2, 4, 8, 16, 32, 64]), inline=st.booleans(), blocks=st.sampled_from([1, 2, 4]))
def test_choose_tile_properties(pairs, max_len, sms, group, inline, blocks):
    block_n, prefetch, warps = da.choose_tile(pairs, max_len, sms, group, split_group=group if inline else 1,
                                              head_blocks=blocks)
    assert block_n >= 16 and block_n & (block_n - 1) == 0, "a tile is a tl.dot operand: a power of two >= 16"
    assert warps in (1, 2, 4, 8) and isinstance(prefetch, bool)
    if warps == 1:  # a warp keeps the softmax's row statistics only for one tl.dot of 16 query heads
        assert group <= 16 and blocks == 1
    # K and V tiles of d = 128 in bf16, in a pipeline of 3 stages, fit in one program's shared memory
    assert 3 * 2 * block_n * 128 * 2 <= MAX_SHARED


def test_choose_tile_small_groups_with_few_programs_take_one_warp():
    """The regime the one-warp launch is for: up to 16 query heads per KV head and few (request, KV head)
    pairs per SM, whatever the context."""
    for group, pairs, L in [(1, 1, 512), (4, 64, 4096), (8, 8, 131072), (16, 132, 16384)]:
        assert da.choose_tile(pairs, L, 132, group)[2] == 1


@settings(max_examples=300, deadline=None)
@given(pairs=st.integers(1, 4096), max_len=st.integers(1, 1 << 18), sms=st.sampled_from([8, 78, 132, 144]),
       group=st.sampled_from([1, 2, 4, 8, 16, 24, 32, 48, 64, 128]))
def test_choose_head_block_properties(pairs, max_len, sms, group):
    hb = da.choose_head_block(pairs, max_len, sms, group)
    assert hb >= 16 and hb & (hb - 1) == 0, "a block of heads is a tl.dot operand: a power of two >= 16"
    whole = max(16, triton.next_power_of_2(group))
    assert hb <= whole, "never more heads per program than the group holds (padded to 16)"
    if group <= 16:
        assert hb == 16, "a small group is one block"
    if max_len >= 16384 or (pairs == 1 and sms >= 64):  # long contexts, one pair: split the context, not the group
        assert hb == whole


def test_wide_and_long_is_groups_of_32_over_long_contexts():
    assert da.wide_and_long(32, 1 << 17) and da.wide_and_long(64, 1 << 17)
    assert not da.wide_and_long(16, 1 << 17) and not da.wide_and_long(32, 128)


def test_plans_follow_the_rules_and_callers_win():
    """The plan takes choose_head_block's, choose_tile's and choose_splits' choices (the CPU counts as
    launch.CPU_SMS SMs); a caller's choice wins."""
    gen = torch.Generator().manual_seed(12)
    for lens, H_kv, G, page in [([40, 9], 2, 8, 16), ([33, 7], 1, 32, 16), ([1100, 2048], 1, 32, 16), ([96, 5], 1, 4, 1)]:
        q, kc, vc, bt, sl = paged_case(lens, H_kv, G, 16, page, torch.float32, gen)
        B, sms, max_len = len(lens), launch.CPU_SMS, bt.shape[1] * page
        plan = da.DecodeAttention(q, kc, vc, bt, sl, combine="kernel")
        hb = da.choose_head_block(B * H_kv, max_len, sms, G)
        blocks = -(-G // min(hb, max(16, triton.next_power_of_2(G))))
        tile = da.choose_tile(B * H_kv * blocks, max_len, sms, G, 1, blocks)
        assert (plan.meta["HEAD_BLOCKS"], plan.meta["BLOCK_N"], plan.meta["PREFETCH"], plan.options["num_warps"]) == \
            (blocks, *tile)
        waves = 1.0 if da.wide_and_long(G, max_len) else 2.0
        want = 1 if blocks > 1 else da.choose_splits(B * H_kv, max_len, tile[0], sms, waves=waves)
        assert plan.splits == want and plan.grid == (B, H_kv * blocks, want)
        assert plan.meta["PER_PAGE"] is (tile[0] >= da.PER_PAGE_MIN_PAGES * page)
        assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5
    plan = da.DecodeAttention(q, kc, vc, bt, sl, block_n=32, prefetch=False, num_warps=4, num_splits=2, head_block=16)
    assert (plan.meta["BLOCK_N"], plan.meta["PREFETCH"], plan.options["num_warps"], plan.splits) == (32, False, 4, 2)
    assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5


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
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        da.decode_attention(q, kc, vc, bt, sl, block_n=24)
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


# (page, block_n): a tile inside a page, tiles of many pages (one entry per page), and tiles of fewer pages
# than PER_PAGE_MIN_PAGES (one entry per token)
_FEW = max(2, da.PER_PAGE_MIN_PAGES // 2)
LOOKUPS = [(16, 16), (64, 32), (1, 32), (16, 16 * da.PER_PAGE_MIN_PAGES), (16, 16 * _FEW), (32, 32 * _FEW)]


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("page,block_n", LOOKUPS)
def test_block_table_lookups(prefetch, page, block_n):
    """Every way of finding a tile's pages (one entry per tile, per page, per token; requested a step
    ahead or not) gives the reference; ragged lengths end inside a page and inside a tile."""
    gen = torch.Generator().manual_seed(13 + page + block_n)
    q, kc, vc, bt, sl = paged_case([1, 31, 100, 64], 2, 4, 32, page, torch.float32, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl, num_splits=2, block_n=block_n, prefetch=prefetch)
    assert plan.meta["PREFETCH"] is prefetch
    assert rel_err(plan(q, kc, vc, bt, sl), da.reference(q, kc, vc, bt, sl)) < 1e-5


def test_lookups_cover_every_kernel_path():
    """LOOKUPS reach the kernel's three lookups: a tile inside a page, one entry per page, and one per
    token (reachable where a tile of fewer than PER_PAGE_MIN_PAGES pages spans at least two)."""
    gen = torch.Generator().manual_seed(1)
    seen = set()
    for page, block_n in LOOKUPS:
        q, kc, vc, bt, sl = paged_case([5], 1, 4, 16, page, torch.float32, gen)
        meta = da.DecodeAttention(q, kc, vc, bt, sl, block_n=block_n).meta
        seen.add("tile in a page" if page % block_n == 0 else "per page" if meta["PER_PAGE"] else "per token")
    assert seen >= {"tile in a page", "per page"}
    if da.PER_PAGE_MIN_PAGES > 2:
        assert "per token" in seen


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
    plan.split_launch.compiled = types.SimpleNamespace(asm={"ttgir": ring + "\n!ttg.memdesc<16x32xf32, #shared, #smem>"})
    assert plan.tiles_in_flight() == 2
    plan.split_launch.compiled = types.SimpleNamespace(asm={"ttgir": "no shared buffers"})
    assert plan.tiles_in_flight() is None
