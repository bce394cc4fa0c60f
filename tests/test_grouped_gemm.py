"""lib.kernels.grouped_gemm against a float32 reference, in Triton's interpreter on the CPU.

Fresh random inputs; M, N, K at tile - 1, tile + 1, 1 and 0; empty experts (all of them, and between
non-empty ones); leading dimensions that are not multiples of 16; a guard region after every output; a
small number of programs so that each loops over several tiles. Both kernels: TMA descriptors (rows
16-byte aligned) and masked pointer loads (rows that are not). fp16 and fp32 here (the interpreter
computes bf16 wrongly); bf16 at full size is checked on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import grouped_gemm as gg
from lib.kernels import launch

BM, BN, BK = 16, 32, 16
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def case(Ms, K, N, dtype, gen, pad_k=0, pad_n=0, w_nk=False):
    """Tokens sorted by expert, with rows and weights stored in padded (non-multiple-of-16) strides."""
    T = sum(Ms)
    xbuf = torch.randn(T, K + pad_k, generator=gen).to(dtype)
    x = xbuf[:, :K]
    if w_nk:  # a weight stored [E, N, K], used through a transposed view
        w = torch.randn(len(Ms), N, K + pad_k, generator=gen).to(dtype)[:, :, :K].transpose(1, 2)
    else:
        w = torch.randn(len(Ms), K, N + pad_n, generator=gen).to(dtype)[:, :, :N]
    offsets = torch.tensor([0] + list(torch.tensor(Ms).cumsum(0).tolist()) if Ms else [0], dtype=torch.int32)
    return x, w, offsets


def run_guarded(x, w, offsets, **kw):
    """Output in a NaN-poisoned buffer with a guard column block after each row and guard rows after it."""
    T, N = x.shape[0], w.shape[2]
    buf = torch.full((T + 2, N + 5), float("nan"), dtype=x.dtype)
    out = buf[:T, :N]
    out.zero_()
    gg.grouped_gemm(x, w, offsets, out=out, block_m=BM, block_n=BN, block_k=BK, **kw)
    assert torch.isnan(buf[:, N:]).all() and torch.isnan(buf[T:]).all(), "wrote outside the output"
    assert not torch.isnan(out).any()
    return out


def rel_err(out, ref):
    if ref.numel() == 0:
        return 0.0
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("Ms,K,N", [
    ([BM - 1, BM + 1, 1], BK - 1, BN + 1),        # tails everywhere
    ([BM + 1, 0, 2 * BM - 1], BK + 1, BN - 1),    # an empty expert between non-empty ones
    ([0, 0, 5, 0], 2 * BK + 3, 1),                # empties around one expert, N = 1
    ([1, 1, 1, 1, 1, 1, 1], 1, BN),               # K = 1, many one-token experts
    ([3 * BM, BM], 3 * BK, 2 * BN + 7),           # several tiles per expert in both directions
])
@pytest.mark.parametrize("tma", [False, True])
def test_matches_reference(Ms, K, N, dtype, tma):
    gen = torch.Generator().manual_seed(sum(Ms) * 31 + K * 7 + N)
    if tma:  # rows padded to 8 elements more than a multiple of 8: 16-byte aligned, not multiples of 16
        x, w, offsets = case(Ms, K, N, dtype, gen, pad_k=(-K) % 8 + 8, pad_n=(-N) % 8 + 8)
    else:  # rows of x an odd number of elements apart: only the masked pointer loads can take them
        x, w, offsets = case(Ms, K, N, dtype, gen, pad_k=3 if K % 2 == 0 else 2, pad_n=5)
    assert gg.tma_applies(x, w) == tma
    out = run_guarded(x, w, offsets, num_programs=3)  # few programs: each loops over several tiles
    assert rel_err(out, gg.reference(x, w, offsets)) < TOL[dtype]


@pytest.mark.parametrize("tma", [False, True])
def test_half_tail_tiles(tma):
    """Half-height last row tiles (block_m 32, halves of 16): experts whose rows past their last full tile
    number 1, 16 (a half tile exactly), 17 (a full tile), 0, and an expert of one half tile between empty
    ones; the same output as whole tiles, and the schedule counts the halves."""
    gen = torch.Generator().manual_seed(11)
    Ms, K, N = [33, 48, 49, 0, 16, 0, 64, 1], 40, 2 * BN + 3
    pad = dict(pad_k=(-K) % 8 + 8, pad_n=(-N) % 8 + 8) if tma else dict(pad_k=3, pad_n=5)
    x, w, offsets = case(Ms, K, N, torch.float32, gen, **pad)
    ref = gg.reference(x, w, offsets)
    T = x.shape[0]
    for half in (True, False):
        buf = torch.full((T + 2, N + 5), float("nan"))
        out = buf[:T, :N]
        out.zero_()
        plan = gg.GroupedGemm(x, w, offsets, out=out, block_m=32, block_n=BN, block_k=BK, num_programs=3, tma=tma,
                              half_tail=half)
        assert plan.config["half_tail"] is half and plan.tma is tma
        plan(x, w, offsets, out=out)
        assert torch.isnan(buf[:, N:]).all() and torch.isnan(buf[T:]).all(), "wrote outside the output"
        assert rel_err(out, ref) < 1e-5
    heights = [gg.row_tiles(m, 32, half_tail=True) for m in Ms]
    assert heights == [[32, 16], [32, 16], [32, 32], [], [16], [], [32, 32], [16]]
    assert [gg.row_tiles(m, 32) for m in (33, 16, 0)] == [[32, 32], [32], []]
    rows = gg.tile_schedule(Ms, N, 32, BN, workers=3, half_tail=True)
    assert len(rows) == sum(map(len, heights)) * 3 and sum(r["rows"] for r in rows) == 3 * sum(map(sum, heights))
    with pytest.raises(ValueError, match="half_tail needs block_m"):
        gg.GroupedGemm(x, w, offsets, block_m=16, half_tail=True)
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        gg.GroupedGemm(x, w, offsets, block_m=24)


@pytest.mark.parametrize("tma", [False, True])
def test_heavy_experts_first(tma):
    """Heavy experts (more than one row tile) and light ones, empties between: taken heavy first, every
    tile is computed once (zeroed output, guard regions)."""
    gen = torch.Generator().manual_seed(12)
    Ms, K, N = [3 * BM + 1, 1, 0, BM, 2 * BM, 0, 5, BM + 1, 0], 2 * BK + 1, 2 * BN + 3
    pad = dict(pad_k=(-K) % 8 + 8, pad_n=(-N) % 8 + 8) if tma else dict(pad_k=3, pad_n=5)
    x, w, offsets = case(Ms, K, N, torch.float32, gen, **pad)
    out = run_guarded(x, w, offsets, num_programs=3, order="heavy_first", tma=tma)
    assert rel_err(out, gg.reference(x, w, offsets)) < 1e-5
    with pytest.raises(ValueError, match="order must be one of"):
        gg.GroupedGemm(x, w, offsets, order="interleave")


@settings(max_examples=200, deadline=None)
@given(Ms=st.lists(st.integers(0, 300), min_size=0, max_size=12), N=st.integers(1, 700),
       block_m=st.sampled_from([32, 64, 128]), block_n=st.sampled_from([16, 64, 128, 256]), workers=st.integers(1, 9),
       half_tail=st.booleans(), order=st.sampled_from(sorted(gg.ORDERS)))
def test_tile_schedule_properties(Ms, N, block_m, block_n, workers, half_tail, order):
    """Every output tile once; workers take positions round-robin; the heights cover each expert's rows
    exactly, a half tile only where the rows left fit in it; heavy experts first where asked; within an
    expert, rows fastest."""
    rows = gg.tile_schedule(Ms, N, block_m, block_n, workers, half_tail=half_tail, order=order)
    tn_count = -(-N // block_n)
    assert sorted(r["tile"] for r in rows) == list(range(sum(-(-m // block_m) for m in Ms) * tn_count))
    assert all(r["worker"] == i % workers and r["round"] == i // workers for i, r in enumerate(rows))
    for p, m in enumerate(Ms):
        mine = [r for r in rows if r["problem"] == p]
        heights = {r["tm"]: r["rows"] for r in mine}
        assert len(mine) == len(heights) * tn_count
        covered = sum(heights.values())
        assert m <= covered < m + block_m and all(h in (block_m, block_m // 2) for h in heights.values())
        assert all(h == block_m for tm, h in heights.items() if tm < len(heights) - 1), "only the last tile is halved"
        if not half_tail:
            assert covered == -(-m // block_m) * block_m
        assert [(r["tn"], r["tm"]) for r in mine] == sorted((r["tn"], r["tm"]) for r in mine), "rows fastest"
    heavy = [-(-Ms[r["problem"]] // block_m) > 1 for r in rows]
    if order == "heavy_first":
        assert heavy == sorted(heavy, reverse=True)
    else:
        assert [r["tile"] for r in rows] == sorted(r["tile"] for r in rows)


def test_planned_launch():
    """GroupedGemm plans once: new token counts reuse the plan; other shapes are refused, bad offsets too."""
    gen = torch.Generator().manual_seed(6)
    x, w, offsets = case([20, 0, 13], 24, 40, torch.float32, gen)
    plan = gg.GroupedGemm(x, w, offsets, block_m=BM, block_n=BN, block_k=BK, num_programs=2)
    assert plan.config["block_m"] == BM and plan.grid == (2,) and plan.tma == gg.tma_applies(x, w)
    assert rel_err(plan(x, w, offsets), gg.reference(x, w, offsets)) < 1e-5
    other = torch.tensor([0, 5, 30, 33], dtype=torch.int32)  # new token counts, same shapes: the same plan
    assert rel_err(plan(x, w, other), gg.reference(x, w, other)) < 1e-5
    buf = torch.full((33, 48), float("nan"))  # an out of other strides than the planned one
    out = buf[:, :40]
    out.zero_()
    plan(x, w, offsets, out=out)
    assert torch.isnan(buf[:, 40:]).all() and rel_err(out, gg.reference(x, w, offsets)) < 1e-5
    with pytest.raises(ValueError, match="differ from the planned"):
        plan(x[:10], w, offsets)
    with pytest.raises(ValueError, match="non-decreasing"):
        plan(x, w, torch.tensor([0, 9, 3, 33], dtype=torch.int32))
    with pytest.raises(ValueError, match="out must be"):
        plan(x, w, offsets, out=torch.empty(33, 41))


def test_weights_as_a_transposed_view():
    gen = torch.Generator().manual_seed(2)
    x, w, offsets = case([20, 7], 40, 33, torch.float32, gen, pad_k=1, w_nk=True)
    assert not w.is_contiguous()
    out = run_guarded(x, w, offsets, num_programs=2)
    assert rel_err(out, gg.reference(x, w, offsets)) < 1e-5


def test_empty_problems():
    gen = torch.Generator().manual_seed(3)
    x, w, offsets = case([0, 0, 0], 16, 32, torch.float32, gen)  # every expert empty: T = 0
    assert gg.grouped_gemm(x, w, offsets).shape == (0, 32)
    x, w, offsets = case([4, 4], 0, 8, torch.float32, gen)  # K = 0: an empty sum
    assert torch.equal(run_guarded(x, w, offsets, num_programs=2), torch.zeros(8, 8))
    x, w, offsets = case([4, 4], 8, 0, torch.float32, gen)  # N = 0
    assert gg.grouped_gemm(x, w, offsets).shape == (8, 0)
    x = torch.randn(3, 16, generator=gen)  # rows, but every expert empty: the kernel runs no tile
    out = run_guarded(x, torch.randn(2, 16, 8, generator=gen), torch.zeros(3, dtype=torch.int32), num_programs=2)
    assert torch.equal(out, torch.zeros(3, 8))


def test_rows_no_expert_owns_are_left_alone():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(10, 16, generator=gen)
    w = torch.randn(2, 16, 8, generator=gen)
    offsets = torch.tensor([2, 5, 7], dtype=torch.int32)  # rows 0-1 and 7-9 belong to nobody
    out = torch.full((10, 8), 7.0)
    for tma in (False, True):  # TMA reads rows 7-9 as the last expert's tile; the store must not write them
        out = torch.full((10, 8), 7.0)
        gg.grouped_gemm(x, w, offsets, out=out, block_m=BM, block_n=BN, block_k=BK, num_programs=1, tma=tma)
        assert torch.equal(out[:2], torch.full((2, 8), 7.0)) and torch.equal(out[7:], torch.full((3, 8), 7.0))
        assert rel_err(out[2:7], gg.reference(x, w, offsets)[2:7]) < 1e-5


MAX_SHARED_SM = 233472  # bytes of shared memory per SM on Hopper (228 KiB), shared by its programs
TOKENS_PER_EXPERT = [1, 2, 3, 8, 16, 31, 32, 33, 64, 128, 1024, 8192]


@pytest.mark.parametrize("K", [None, 64, 2048, 4096, 7168, 16384])
def test_choose_config_properties(K):
    """Whatever the boundaries: tiles that are tl.dot operands, a pipeline that fits in the SM's shared
    memory for 2-byte inputs (with as many programs per SM as the config asks), an accumulator that fits
    in registers, row tiles never much taller than an expert's rows, taller tiles and fewer programs
    per SM as the tokens per expert grow, and the largest tile for experts of a real matrix product."""
    configs = [gg.choose_config(n * 64, 64, K) for n in TOKENS_PER_EXPERT]
    for n, c in zip(TOKENS_PER_EXPERT, configs):
        for b in ("block_m", "block_n", "block_k"):
            assert c[b] >= 16 and c[b] & (c[b] - 1) == 0, (n, b, c[b])
        assert c["num_warps"] in (4, 8) and c["num_stages"] >= 2 and c["programs_per_sm"] in (1, 2)
        assert c["order"] in gg.ORDERS and isinstance(c["flatten"], bool) and isinstance(c["half_tail"], bool)
        ring = c["num_stages"] * (c["block_m"] * c["block_k"] + c["block_k"] * c["block_n"]) * 2
        assert c["programs_per_sm"] * ring <= MAX_SHARED_SM, (n, c)
        assert c["block_m"] * c["block_n"] <= 128 * c["num_warps"] * 32, "at most 128 fp32 accumulators a thread"
        assert c["block_m"] <= max(64, 8 * n), "a row tile is never much taller than the expert's rows"
    assert [c["block_m"] for c in configs] == sorted(c["block_m"] for c in configs)
    assert [c["programs_per_sm"] for c in configs] == sorted((c["programs_per_sm"] for c in configs), reverse=True)
    big = configs[TOKENS_PER_EXPERT.index(1024)]
    assert big["block_m"] * big["block_n"] >= 128 * 128 and big["programs_per_sm"] == 1


def test_choose_config_stages_never_grow_with_K():
    for T in (64, 1024, 8192):
        stages = [gg.choose_config(T, 8, K)["num_stages"] for K in (64, 1024, 4096, 7168, 16384)]
        assert stages == sorted(stages, reverse=True) and gg.choose_config(T, 8)["num_stages"] == stages[-1]


def test_plans_take_choose_config_and_flatten_only_tma():
    x, w = torch.zeros(64, 16), torch.zeros(1, 16, 8)
    offsets = torch.tensor([0, 64], dtype=torch.int32)
    cfg = gg.choose_config(64, 1, 16)
    plan = gg.GroupedGemm(x, w, offsets)
    assert all(plan.config[k] == cfg[k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "order"))
    assert plan.config["programs"] == cfg["programs_per_sm"] * launch.CPU_SMS and plan.tma
    assert plan.config["flatten"] is cfg["flatten"]
    assert gg.GroupedGemm(x, w, offsets, flatten=True, tma=False).config["flatten"] is False  # only TMA flattens


def test_tile_schedule_of_the_seed():
    """Seed: A (64, 128, 256) and B (192, 128, 256), 64x64 tiles: 2 + 6 = 8 tiles; 4 workers take 0-3, then 4-7."""
    rows = gg.tile_schedule([64, 192], 128, 64, 64, workers=4)
    assert len(rows) == 8
    assert [r["problem"] for r in rows] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert [r["worker"] for r in rows] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r["round"] for r in rows] == [0] * 4 + [1] * 4
    assert {(r["tm"], r["tn"]) for r in rows if r["problem"] == 1} == {(m, n) for m in range(3) for n in range(2)}


def test_bad_input_is_rejected():
    gen = torch.Generator().manual_seed(5)
    x, w, offsets = case([3, 4], 16, 8, torch.float32, gen)
    with pytest.raises(ValueError, match="K=16 columns"):
        gg.grouped_gemm(x, w.transpose(1, 2), offsets)
    with pytest.raises(TypeError, match="share one of"):
        gg.grouped_gemm(x.half(), w, offsets)
    with pytest.raises(ValueError, match="int32 of shape"):
        gg.grouped_gemm(x, w, offsets.long())
    with pytest.raises(ValueError, match="non-decreasing"):
        gg.grouped_gemm(x, w, torch.tensor([0, 5, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="out must be"):
        gg.grouped_gemm(x, w, offsets, out=torch.empty(7, 9))
