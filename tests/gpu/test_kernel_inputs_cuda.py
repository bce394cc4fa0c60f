"""The kernels' guards compiled on a CUDA GPU: RoPE + the K/V write skips any row whose slot lies outside the
cache (checked or not, eager or replayed from a CUDA graph), value checks read nothing on the GPU unless asked
and are refused inside a capture, and bf16 runs where the kernels are compiled. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from lib.kernels import fused, sampling, skinny_gemm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GUARD, BLOCKS, PAGE, H, HKV, D = 2, 6, 16, 8, 2, 128


def case():
    """Two rows in bf16; a pool of BLOCKS blocks inside a buffer with GUARD blocks on each side; a block table
    [2, 3] whose rows are followed by an entry 0 (a read past a row finds a block of the pool)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(2, (H + 2 * HKV) * D, device="cuda", generator=g, dtype=torch.bfloat16)
    inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D)
    kbuf, vbuf = torch.randn(2, BLOCKS + 2 * GUARD, HKV, PAGE, D, device="cuda", generator=g, dtype=torch.bfloat16)
    tbuf = torch.tensor([[4, 1, 0, 0], [2, 3, 5, 0]], dtype=torch.int32, device="cuda")
    return qkv, inv, kbuf, vbuf, tbuf


def caches(kbuf, vbuf):
    return kbuf[GUARD:GUARD + BLOCKS], vbuf[GUARD:GUARD + BLOCKS]


BAD = [([-1, 3, 5], 7), ([BLOCKS, 3, 5], 7), ([2, 3, 5], -1), ([2, 3, 5], 3 * PAGE), ([2, 3, 5], 2**40)]


@pytest.mark.parametrize("row,pos", BAD)
def test_rope_write_skips_rows_without_a_slot(row, pos):
    qkv, inv, kbuf, vbuf, tbuf = case()
    tbuf[1, :3] = torch.tensor(row, dtype=torch.int32)
    table, p = tbuf[:, :3], torch.tensor([20, pos], device="cuda")
    kref, vref = kbuf.clone(), vbuf.clone()
    alone = fused.rope_write(qkv[:1], p[:1], inv, *caches(kref, vref), table[:1], H)
    with pytest.raises(ValueError, match="table|pos"):
        fused.rope_write(qkv, p, inv, *caches(kbuf.clone(), vbuf.clone()), table, H, check=True)
    q = fused.rope_write(qkv, p, inv, *caches(kbuf, vbuf), table, H)  # the GPU's default: values not read
    torch.cuda.synchronize()
    assert torch.equal(kbuf, kref) and torch.equal(vbuf, vref) and torch.equal(q[0], alone[0])


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the capture refused before anything was captured
def test_rope_write_in_a_cuda_graph_reads_nothing_and_writes_no_bad_slot():
    qkv, inv, kbuf, vbuf, tbuf = case()
    table, p = tbuf[:, :3].contiguous(), torch.tensor([20, 7], device="cuda")
    kc, vc = caches(kbuf, vbuf)
    fused.rope_write(qkv, p, inv, *caches(kbuf.clone(), vbuf.clone()), table, H)  # compiled outside the capture
    with pytest.raises(ValueError, match="capturing a graph"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fused.rope_write(qkv, p, inv, kc, vc, table, H, check=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused.rope_write(qkv, p, inv, kc, vc, table, H)
    table[1, 0] = -1  # after the capture: the replay reads it
    before = kbuf.clone(), vbuf.clone()
    kref, vref = kbuf.clone(), vbuf.clone()
    fused.rope_write(qkv[:1], p[:1], inv, *caches(kref, vref), table[:1], H)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(kbuf, kref) and torch.equal(vbuf, vref)
    assert not torch.equal(kbuf, before[0])  # row 0 was written


def test_sampling_reads_values_on_the_gpu_only_when_asked(monkeypatch):
    logits = torch.randn(2, 1000, device="cuda").bfloat16()
    temp = torch.tensor([1.0, 0.0], device="cuda")
    seen = []
    monkeypatch.setattr(sampling, "_check_values", lambda *a: seen.append(a))
    sampling.top_p_sample(logits, 0.9, temp)
    assert seen == []  # no synchronisation by default on the GPU
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"temperature\[1\] = 0.0"):
        sampling.top_p_sample(logits, 0.9, temp, check=True)


def test_bf16_runs_where_the_kernels_are_compiled():
    assert not skinny_gemm.INTERPRETED
    x = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float()
    assert float((skinny_gemm.skinny_mm(x, w).float() - ref).norm() / ref.norm()) < 1e-2
