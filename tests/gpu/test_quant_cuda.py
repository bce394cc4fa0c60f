"""Chapter 9's kernels compiled on a CUDA GPU, in bf16: the quantized products (GEMVs, tensor-core kernels)
against float64 products of the dequantized weights, and decode attention over an FP8 cache against
float64 attention over its dequantized values, each output surrounded by NaN guards, and the FP8 plan
captured in a CUDA graph. Skipped without CUDA (the CPU tests run the same kernels in Triton's
interpreter, in fp16 and fp32)."""

from __future__ import annotations

import pytest
import torch

from lib import quant
from lib.kernels import decode_attention as da
from lib.kernels import decode_attention_fp8 as da8
from lib.kernels import quant_gemm as qg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEV = "cuda"
BF16_TOL = 2e-2  # relative error: bf16 activations and outputs keep 8 bits of mantissa


def rel_err(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def case(M, K, N, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, generator=g, device=DEV).to(torch.bfloat16)
    w = torch.randn(K, N, generator=g, device=DEV) * 0.02
    return x, w


@pytest.mark.parametrize("M", [1, 2, 16, 64])
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096), (512, 200)])  # 200: a masked column block
def test_quantized_products_in_bf16(M, K, N):
    x, w = case(M, K, N, seed=M + K)
    q8 = quant.quantize_int8(w)
    assert rel_err(qg.w8_mm(x, q8), x.double() @ q8.dequantize(torch.float64)) < BF16_TOL
    for group in quant.GROUPS:
        q4 = quant.quantize_int4(w, group)
        ref = x.double() @ q4.dequantize(torch.float64)
        if N % 4 == 0:
            assert rel_err(qg.w4_mm(x, q4), ref) < BF16_TOL
        assert rel_err(qg.w4_mm(x, q4, gemv=False), ref) < BF16_TOL  # the tensor-core kernel at every M


@pytest.mark.parametrize("group", quant.GROUPS)
def test_gemvs_with_guards_and_both_scale_layouts(group):
    x, w = case(1, 4096, 4096, seed=group)
    q4 = quant.quantize_int4(w, group)
    ref = x.double() @ q4.dequantize(torch.float64)
    separate = qg.w4_gemv(x, q4)
    assert rel_err(separate, ref) < BF16_TOL
    assert torch.equal(qg.w4_gemv(x, quant.interleave_scales(q4)), separate)  # the same arithmetic, other bytes
    q8 = quant.quantize_int8(w)
    assert rel_err(qg.w8_gemv(x, q8), x.double() @ q8.dequantize(torch.float64)) < BF16_TOL


@pytest.mark.parametrize("B,L", [(1, 1024), (1, 65536), (16, 4096), (3, 777)])
def test_fp8_decode_attention_in_bf16(B, L):
    g = torch.Generator(device=DEV).manual_seed(B * L)
    q = torch.randn(B, 32, 128, generator=g, device=DEV).to(torch.bfloat16)
    kv = [torch.randn(B, 8, L, 128, generator=g, device=DEV).to(torch.bfloat16) for _ in "kv"]
    kc, bt = da.paginate(kv[0], 16, generator=torch.Generator().manual_seed(L))
    vc, _ = da.paginate(kv[1], 16, block_table=bt)
    lens = torch.full((B,), L, dtype=torch.int32, device=DEV)
    lens[-1] = max(1, L - 5)  # a ragged last request
    (k8, ks), (v8, vs) = quant.quantize_kv_fp8(kc), quant.quantize_kv_fp8(vc)
    plan = da8.DecodeAttentionFP8(q, k8, v8, bt, lens, k_scale=ks, v_scale=vs)
    buf = torch.full((B + 2, 32, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    out = plan(q, k8, v8, bt, lens, out=buf[1:-1])
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all() and not torch.isnan(out).any()
    ref = da.reference(q, k8.double() * ks, v8.double() * vs, bt, lens, dtype=torch.float64)
    assert rel_err(out, ref) < BF16_TOL
    # replayed from a CUDA graph: the same output
    graph_out = torch.empty_like(out)
    plan(q, k8, v8, bt, lens, out=graph_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(q, k8, v8, bt, lens, out=graph_out)
    graph_out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, out)
