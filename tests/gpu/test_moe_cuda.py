"""The MoE layer's routing steps (lib.moe) on a CUDA GPU: with chapter 4's grouped GEMM, bf16 against the
float64 oracle, and the whole layer captured in a CUDA graph (no step reads a value back to the host).
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from lib import moe
from lib.kernels import grouped_gemm as gg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("n,E,k", [(8, 8, 2), (300, 64, 6)])
def test_layer_in_a_cuda_graph_matches_the_oracle(n, E, k):
    g = torch.Generator(device="cuda").manual_seed(n)
    K, N = 256, 192
    x = torch.randn(n, K, device="cuda", generator=g, dtype=torch.bfloat16)
    router = torch.randn(K, E, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
    w = torch.randn(E, K, N, device="cuda", generator=g, dtype=torch.bfloat16) / K ** 0.5
    weights, ids = moe.top_k(x @ router, k)
    xs, offsets, order = moe.permute(x, ids, E)
    ys = torch.empty(n * k, N, device="cuda", dtype=torch.bfloat16)
    plan = gg.GroupedGemm(xs, w, offsets, out=ys, check=False)

    def layer():
        wt, i = moe.top_k(x @ router, k)
        xs_, offs, order_ = moe.permute(x, i, E)
        return moe.unpermute(plan(xs_, w, offs, out=ys), order_, wt)

    eager = layer()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    ref = moe.moe_reference(x, lambda xt, e: xt @ w[e].double(), ids, weights)
    err = float((eager.double() - ref).norm() / ref.norm())
    assert err < 2e-2
