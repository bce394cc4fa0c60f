"""Chapter 7's fused kernels and steps compiled on a CUDA GPU in bf16: against the unfused PyTorch step, and
captured in a CUDA graph. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lib import models
from lib.kernels import fused

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_kernels_in_bf16():
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(64, 4096, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    w = torch.rand(4096, device="cuda", generator=g, dtype=torch.bfloat16) + 0.5
    out, h = fused.rmsnorm(x, w, 1e-5, residual=r)
    assert torch.equal(h, x + r)
    ref = F.rms_norm((x + r).float(), (4096,), w.float(), 1e-5)
    assert float((out.float() - ref).abs().max()) < 0.05
    gu = torch.randn(64, 2 * 14336, device="cuda", generator=g, dtype=torch.bfloat16)
    ref = F.silu(gu[:, :14336].float()) * gu[:, 14336:].float()
    assert float((fused.silu_mul(gu).float() - ref).abs().max()) < 0.05


@pytest.mark.parametrize("B,L", [(1, 100), (8, 300)])
def test_steps_match_the_unfused_step_in_a_cuda_graph(B, L):
    cfg = models.ModelConfig(vocab=1000, hidden=512, layers=3, heads=8, kv_heads=2, head_dim=128, mlp=1024, rope_theta=500000.0)
    m = models.Llama.random(cfg, seed=1)
    gen = torch.Generator(device="cuda").manual_seed(2)
    pages = -(-L // 16)
    pool = m.new_pool(B * pages, 16)
    pool.k.normal_(generator=gen), pool.v.normal_(generator=gen)
    table = torch.randperm(B * pages, device="cuda", generator=gen).reshape(B, pages).to(torch.int32)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    tokens = torch.randint(0, cfg.vocab, (B,), device="cuda", generator=gen)
    ref = m.decode(tokens, pool, table, lens, check=False).float()
    for step in (m.with_parts(models.FUSED), m.with_parts(models.compiled())):
        eager = step(tokens, pool, table, lens).float()
        assert float((eager - ref).abs().max()) <= 0.05 * float(ref.abs().max())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(tokens, pool, table, lens)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(captured.float(), eager, atol=1e-2, rtol=1e-2)
        if step.parts is models.FUSED:  # greedy sampling fused into the head picks the argmax of the logits
            assert torch.equal(step.greedy(tokens, pool, table, lens), step(tokens, pool, table, lens).argmax(-1))


@pytest.mark.parametrize("M,K,N", [(1, 4096, 6144), (1, 14336, 4096), (64, 4096, 28672), (7, 4096, 1000)])
def test_skinny_gemm_in_bf16(M, K, N):
    from lib.kernels import skinny_gemm

    g = torch.Generator(device="cuda").manual_seed(M + N)
    x = torch.randn(M, K, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(K, N, device="cuda", generator=g, dtype=torch.bfloat16)
    ref = x.float() @ w.float()
    y = skinny_gemm.skinny_mm(x, w)
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-2


def test_skinny_argmax_at_the_vocabulary_in_bf16():
    from lib.kernels import skinny_gemm

    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4, 4096, device="cuda", generator=g, dtype=torch.bfloat16)
    w = torch.randn(4096, 128256, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02
    assert torch.equal(skinny_gemm.skinny_argmax(x, w), skinny_gemm.skinny_mm(x, w).argmax(-1))


@pytest.mark.parametrize("B", [1, 64])
def test_top_p_at_the_vocabulary_in_bf16(B):
    from lib.kernels import sampling

    g = torch.Generator(device="cuda").manual_seed(B)
    logits = (torch.randn(B, 128256, device="cuda", generator=g) * 2).bfloat16()
    p, T = torch.full((B,), 0.9, device="cuda"), torch.full((B,), 0.8, device="cuda")
    x = logits.double() / 0.8
    srt, order = x.softmax(-1).sort(-1, descending=True)

    def sorted_set(q):  # the smallest set of the most probable with probability >= q, by sorting in float64
        k = (srt.cumsum(-1) < q).sum(-1)
        return logits >= logits.gather(-1, order.gather(-1, k[:, None]))

    # the kernels add in float32: where a row's mass at a candidate lies within 1e-5 of p, either side is right
    kept = sampling.top_p_mask(logits, p, T)
    assert bool((kept >= sorted_set(0.9 - 1e-5)).all()) and bool((kept <= sorted_set(0.9 + 1e-5)).all())
    u = torch.rand(B, 128256, device="cuda", generator=g)
    assert torch.equal(sampling.top_p_sample(logits, p, T, uniform=u), sampling.top_p_reference(logits, p, T, u))
    # captured in a CUDA graph: each replay reads the seed's current value
    seed = torch.tensor([1], device="cuda", dtype=torch.int64)
    eager = sampling.top_p_sample(logits, p, T, seed=seed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        drawn = sampling.top_p_sample(logits, p, T, seed=seed)
    graph.replay()
    assert torch.equal(drawn, eager)
    seed.fill_(2)
    graph.replay()
    assert torch.equal(drawn, sampling.top_p_sample(logits, p, T, seed=seed))
    assert B == 1 or not torch.equal(drawn, eager)
