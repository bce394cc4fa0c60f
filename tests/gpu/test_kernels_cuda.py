"""The book's kernels compiled on a CUDA GPU: bf16 against a float32 reference, the planned direct launch
against Triton's public launch, and CUDA-graph capture. Skipped without CUDA; run it on the GPU before
measuring (under a minute on an H200):

    python -m pytest -q -p no:cacheprovider -o addopts="" tests/gpu

The CPU tests run the same kernels in Triton's interpreter, in fp16 and fp32 only (the interpreter
computes bf16 wrongly); here bf16 runs compiled, with tails, ragged lengths, empty experts and guard
regions around every output (NaN-poisoned: a write outside the output, or a cell left unwritten, shows).
"""

from __future__ import annotations

import pytest
import torch

from lib.kernels import decode_attention as da
from lib.kernels import grouped_gemm as gg
from lib.kernels import launch, stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEV = "cuda"
BF16_TOL = 2e-2  # relative error against float32: bf16 keeps 8 bits of mantissa


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------------------ decode attention
def decode_case(lens, H_kv, G, D, page, gen, dtype=torch.bfloat16):
    """Random q and a K/V cache laid out in pages of ``page`` tokens in a random order (0: contiguous)."""
    B, L = len(lens), max(lens)
    q = torch.randn(B, G * H_kv, D, device=DEV, generator=gen).to(dtype)
    k = torch.randn(B, H_kv, L, D, device=DEV, generator=gen).to(dtype)
    v = torch.randn(B, H_kv, L, D, device=DEV, generator=gen).to(dtype)
    if page:
        kc, bt = da.paginate(k, page, generator=torch.Generator().manual_seed(len(lens) + page))
        vc, _ = da.paginate(v, page, block_table=bt)
    else:
        (kc, bt), vc = da.dense_as_paged(k), v
    return q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32, device=DEV)


def guarded_out(q):
    """An output view with a NaN guard row on each side, and the buffer to check."""
    buf = torch.full((q.shape[0] + 2, *q.shape[1:]), float("nan"), dtype=q.dtype, device=DEV)
    return buf[1:-1], buf


def check_guarded(out, buf):
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all(), "wrote outside the output"
    assert not torch.isnan(out).any(), "left part of the output unwritten"


CHAPTER_3_PATHS = ({}, dict(combine="inline"), dict(combine="kernel"), dict(prefetch=False), dict(num_warps=4))


@pytest.mark.parametrize("page,H_kv,G,paths", [
    (16, 8, 4, CHAPTER_3_PATHS), (0, 8, 4, CHAPTER_3_PATHS), (16, 1, 32, CHAPTER_3_PATHS), (16, 32, 1, ({},)),
    (1, 2, 16, ({},)), (64, 8, 4, ({},)), (256, 1, 32, ({}, dict(num_splits=32, combine="kernel"))),
])
def test_decode_attention_bf16(page, H_kv, G, paths):
    """Ragged lengths (1, a page and a tile off, long); the default plans, and at pages of 16 and the
    contiguous cache the paths chapter 3 times."""
    gen = torch.Generator(device=DEV).manual_seed(page * 100 + G)
    lens = [1, 17, 255, 1000, 4097]
    q, kc, vc, bt, sl = decode_case(lens, H_kv, G, 128, page, gen)
    ref = da.reference(q, kc, vc, bt, sl)
    for kw in paths:
        out, buf = guarded_out(q)
        da.DecodeAttention(q, kc, vc, bt, sl, **kw)(q, kc, vc, bt, sl, out=out)
        check_guarded(out, buf)
        assert rel_err(out, ref) < BF16_TOL, (page, H_kv, G, kw)


def test_decode_attention_short_mqa_blocks_of_heads():
    """Groups of 32 over short contexts with many requests: blocks of 16 heads, one program per block."""
    gen = torch.Generator(device=DEV).manual_seed(5)
    q, kc, vc, bt, sl = decode_case([512] * 63 + [3], 1, 32, 128, 16, gen)
    plan = da.DecodeAttention(q, kc, vc, bt, sl)
    assert plan.meta["HEAD_BLOCKS"] > 1 or launch.sm_count(DEV) // 4 > 64  # the rule's regime on this GPU
    out, buf = guarded_out(q)
    plan(q, kc, vc, bt, sl, out=out)
    check_guarded(out, buf)
    assert rel_err(out, da.reference(q, kc, vc, bt, sl)) < BF16_TOL


def test_decode_attention_direct_launch_equals_public_launch():
    """The first call compiles through kernel[grid]; the next ones go straight to the compiled kernel
    (on the releases in launch.DIRECT_VERSIONS) and give the same bits; new data, right answers."""
    gen = torch.Generator(device=DEV).manual_seed(6)
    for combine in ("inline", "kernel"):
        q, kc, vc, bt, sl = decode_case([300, 4096, 77], 8, 4, 128, 16, gen)
        plan = da.DecodeAttention(q, kc, vc, bt, sl, combine=combine, num_splits=16)
        public = plan(q, kc, vc, bt, sl).clone()
        assert (plan.split_launch.compiled is not None) == launch.DIRECT
        direct = plan(q, kc, vc, bt, sl)
        assert torch.equal(public, direct), combine
        assert plan.tiles_in_flight() is None or plan.tiles_in_flight() >= 1
        q2, kc2, vc2, _, _ = decode_case([300, 4096, 77], 8, 4, 128, 16, gen)
        assert rel_err(plan(q2, kc2, vc2, bt, sl), da.reference(q2, kc2, vc2, bt, sl)) < BF16_TOL
        unaligned = torch.empty(q.numel() + 8, dtype=q.dtype, device=DEV)[8:].view_as(q)  # 16 bytes off
        unaligned.copy_(q)  # takes the public path, whose kernel specializes on alignment: still right
        assert torch.equal(plan(unaligned, kc, vc, bt, sl), public)


def test_decode_attention_in_a_cuda_graph():
    """Captured once, replayed on new data copied into the captured tensors (counters reset each call)."""
    gen = torch.Generator(device=DEV).manual_seed(7)
    q, kc, vc, bt, sl = decode_case([2000, 31, 4096, 5], 8, 4, 128, 16, gen)
    for combine in ("inline", "kernel"):
        plan = da.DecodeAttention(q, kc, vc, bt, sl, combine=combine, num_splits=8)
        out = torch.empty_like(q)
        plan(q, kc, vc, bt, sl, out=out)  # compile before capturing
        plan(q, kc, vc, bt, sl, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan(q, kc, vc, bt, sl, out=out)
        for _ in range(3):
            q.copy_(torch.randn(q.shape, device=DEV, generator=gen))
            kc.copy_(torch.randn(kc.shape, device=DEV, generator=gen))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(out, da.reference(q, kc, vc, bt, sl)) < BF16_TOL, combine


# ------------------------------------------------------------------------------------------------ grouped GEMM
def gemm_case(Ms, K, N, gen, pad_k=0, pad_n=0):
    T = sum(Ms)
    x = torch.randn(T, K + pad_k, device=DEV, generator=gen).to(torch.bfloat16)[:, :K]
    w = (torch.randn(len(Ms), K, N + pad_n, device=DEV, generator=gen) * K ** -0.5).to(torch.bfloat16)[:, :, :N]
    offsets = torch.tensor([0] + torch.tensor(Ms).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    return x, w, offsets


def guarded_gemm(plan_or_fn, x, w, offsets, N):
    """Output in a NaN-poisoned buffer with guard columns and rows; rows no expert owns zeroed first."""
    T = x.shape[0]
    buf = torch.full((T + 3, N + 8), float("nan"), dtype=x.dtype, device=DEV)
    out = buf[:T, :N]
    out.zero_()
    plan_or_fn(x, w, offsets, out=out)
    assert torch.isnan(buf[:, N:]).all() and torch.isnan(buf[T:]).all(), "wrote outside the output"
    assert not torch.isnan(out).any()
    return out


@pytest.mark.parametrize("tma", [True, False])
@pytest.mark.parametrize("Ms,K,N", [
    ([127, 129, 1, 0, 255, 33], 4096 + 64, 1408),     # tails of every tile, an empty expert
    ([0, 0, 3, 0], 2048, 2048 + 8),                   # empties around one small expert, N past a tile
    ([2] * 64, 7168, 2048),                           # many tiny experts (the small tiles)
    ([1024, 0, 1000, 1100], 4096, 1024),              # real matrix products (the large tile)
])
def test_grouped_gemm_bf16(Ms, K, N, tma):
    gen = torch.Generator(device=DEV).manual_seed(sum(Ms) + K + N)
    x, w, offsets = gemm_case(Ms, K, N, gen, pad_k=0 if tma else 1, pad_n=0 if tma else 3)
    assert gg.tma_applies(x, w) == tma
    ref = gg.reference(x, w, offsets)
    for kw in ({}, dict(half_tail=True)) + ((dict(order="heavy_first", num_programs=7),) if Ms[0] == 127 else ()):
        out = guarded_gemm(gg.GroupedGemm(x, w, offsets, **kw), x, w, offsets, N)
        assert rel_err(out, ref) < BF16_TOL, (Ms, K, N, tma, kw)


def test_grouped_gemm_direct_launch_equals_public_launch():
    gen = torch.Generator(device=DEV).manual_seed(8)
    for Ms in ([40, 0, 7, 300], [600] * 8):
        x, w, offsets = gemm_case(Ms, 2048, 1408, gen)
        plan = gg.GroupedGemm(x, w, offsets)
        public = plan(x, w, offsets).clone()
        assert (plan.launch.compiled is not None) == launch.DIRECT
        assert torch.equal(plan(x, w, offsets), public)
        other = torch.linspace(0, x.shape[0], len(Ms) + 1, device=DEV).to(torch.int32)  # new counts, same plan
        assert rel_err(plan(x, w, other), gg.reference(x, w, other)) < BF16_TOL


def test_grouped_gemm_in_a_cuda_graph():
    gen = torch.Generator(device=DEV).manual_seed(9)
    x, w, offsets = gemm_case([100, 0, 31, 500, 1], 2048, 1408, gen)
    for tma in (True, False):
        plan = gg.GroupedGemm(x, w, offsets, tma=tma)
        out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype, device=DEV)
        plan(x, w, offsets, out=out)
        plan(x, w, offsets, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan(x, w, offsets, out=out)
        for _ in range(2):
            x.copy_(torch.randn(x.shape, device=DEV, generator=gen))
            graph.replay()
            torch.cuda.synchronize()
            assert rel_err(out, gg.reference(x, w, offsets)) < BF16_TOL, tma


# ------------------------------------------------------------------------------------------------------ stream
@pytest.mark.parametrize("evict,cache", [("", ""), ("evict_first", ""), ("evict_last", ""), ("", ".cg"), ("", ".cv")])
def test_read_kernels_bf16(evict, cache):
    gen = torch.Generator(device=DEV).manual_seed(10)
    k = torch.randn(97, 8, 16, 128, device=DEV, generator=gen).to(torch.bfloat16)
    v = torch.randn(97, 8, 16, 128, device=DEV, generator=gen).to(torch.bfloat16)
    want = k.double().sum() + v.double().sum()
    got = stream.read_sum(k, v, programs=264, block=2048, evict=evict, cache=cache).double().sum()
    assert abs(got - want) < 1e-3 * k.numel() ** 0.5
    pages = torch.randperm(97, generator=torch.Generator().manual_seed(1))[:60].to(torch.int32).to(DEV)
    want = k[pages.long()].double().sum() + v[pages.long()].double().sum()
    got = stream.read_pages_sum(k, v, pages, programs=64, block=4096, evict=evict, cache=cache).double().sum()
    assert abs(got - want) < 1e-3 * k.numel() ** 0.5
