"""Chapter 7's fused kernels (lib.kernels.fused) in Triton's interpreter, fp32 and fp16, against the PyTorch
operators they replace; and the model under the fused and compiled parts (lib.models) against its eager
parts."""

import pytest
import torch
import torch.nn.functional as F

from lib import models
from lib.kernels import fused
from lib.kv_pool import KVPool
from lib.models import layers

TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("N", [64, 100])
def test_rmsnorm_with_and_without_residual(dtype, N):
    g = torch.Generator().manual_seed(N)
    x, r = torch.randn(3, N, generator=g).to(dtype), torch.randn(3, N, generator=g).to(dtype)
    w = (torch.rand(N, generator=g) + 0.5).to(dtype)
    out, h = fused.rmsnorm(x, w, 1e-5)
    assert h is x
    ref = F.rms_norm(x.float(), (N,), w.float(), 1e-5)
    assert torch.allclose(out.float(), ref, atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)
    out, h = fused.rmsnorm(x, w, 1e-5, residual=r)
    s = (x + r)  # the sum in the input dtype, as the unfused step stores it
    assert torch.equal(h, s)
    assert torch.allclose(out.float(), F.rms_norm(s.float(), (N,), w.float(), 1e-5), atol=TOL[dtype] * 10,
                          rtol=TOL[dtype] * 10)


def test_rmsnorm_hand_worked():
    # row [3, 4]: mean square 12.5, rms 3.5355; weight [1, 2] -> [0.8485, 2.2627]
    out, _ = fused.rmsnorm(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), 0.0)
    assert out[0].tolist() == pytest.approx([3 / 12.5 ** 0.5, 8 / 12.5 ** 0.5], rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul(dtype):
    g = torch.Generator().manual_seed(1)
    gu = torch.randn(2, 2 * 1500, generator=g).to(dtype)  # I = 1500: a tail past the block of 1024
    ref = F.silu(gu[:, :1500].float()) * gu[:, 1500:].float()
    assert torch.allclose(fused.silu_mul(gu).float(), ref, atol=TOL[dtype] * 10, rtol=TOL[dtype] * 10)


def test_silu_mul_hand_worked():
    # gate 0 -> 0; gate 2 -> 2 / (1 + e^-2) = 1.7616; times up 3
    out = fused.silu_mul(torch.tensor([[0.0, 2.0, 5.0, 3.0]]))
    assert out[0].tolist() == pytest.approx([0.0, 3 * 2 / (1 + 2.718281828 ** -2)], rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_write_matches_the_model(dtype):
    cfg = models.CONFIGS["tiny"]
    m = models.Llama.random(cfg, seed=0, dtype=dtype)
    B, page = 3, 4
    pool = KVPool(12, page, layers=1, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, dtype=dtype)
    pool.k.normal_(), pool.v.normal_()
    table = torch.tensor([[5, 2, 7], [0, 9, 1], [11, 3, 4]], dtype=torch.int32)
    lens = torch.tensor([6, 12, 1], dtype=torch.int32)
    pos = lens.long() - 1
    qkv = torch.randn(B, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    k_before, v_before = pool.k[0].clone(), pool.v[0].clone()
    q = fused.rope_write(qkv, pos, m.inv_freq.float(), pool.k[0], pool.v[0], table, cfg.heads)
    # the model's way: RoPE with its tables, then the rows of the pool
    cos, sin = layers.rope_tables(pos, m.inv_freq, m.dtype)
    h = qkv.view(B, -1, cfg.head_dim)
    qk = layers.rope(h[:, : cfg.heads + cfg.kv_heads].float(), cos.float(), sin.float())
    assert torch.allclose(q.float(), qk[:, : cfg.heads], atol=TOL[dtype] * 20, rtol=TOL[dtype] * 20)
    for b in range(B):
        blk, slot = int(table[b, pos[b] // page]), int(pos[b] % page)
        assert torch.allclose(pool.k[0][blk, :, slot].float(), qk[b, cfg.heads:], atol=TOL[dtype] * 20, rtol=TOL[dtype] * 20)
        assert torch.equal(pool.v[0][blk, :, slot], h[b, cfg.heads + cfg.kv_heads:])
        k_before[blk, :, slot], v_before[blk, :, slot] = pool.k[0][blk, :, slot], pool.v[0][blk, :, slot]
    assert torch.equal(pool.k[0], k_before) and torch.equal(pool.v[0], v_before)  # nothing else written


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="partial sums"):
        fused.rmsnorm(torch.zeros(2, 3, 4, dtype=torch.float16), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        fused.rmsnorm(torch.zeros(2, 4), torch.ones(4), 1e-5, residual=torch.zeros(3, 4))
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        fused.silu_mul(torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="2 I"):
        fused.silu_mul(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="columns"):
        fused.rope_write(torch.zeros(1, 10), torch.zeros(1, dtype=torch.long), torch.zeros(8), torch.zeros(2, 2, 4, 16),
                         torch.zeros(2, 2, 4, 16), torch.zeros(1, 2, dtype=torch.int32), heads=4)


def decode_case(m, B=2, page=4, lens=(7, 3)):
    pool = m.new_pool(16, page)
    pool.k.normal_(generator=torch.Generator().manual_seed(3)), pool.v.normal_(generator=torch.Generator().manual_seed(4))
    table = torch.arange(B * 4, dtype=torch.int32).flip(0).reshape(B, 4).contiguous()
    return pool, table, torch.tensor(lens, dtype=torch.int32), torch.tensor([5, 90][:B])


@pytest.mark.parametrize("step", ["fused", "compiled"])
def test_steps_match_the_model_decode(step):
    m = models.Llama.random(models.CONFIGS["tiny"], dtype=torch.float32, device="cpu")
    pool, table, lens, tokens = decode_case(m)
    pool2 = m.new_pool(16, 4)
    pool2.k.copy_(pool.k), pool2.v.copy_(pool.v)
    ref = m.decode(tokens, pool, table, lens, check=False)
    fn = m.with_parts(models.FUSED) if step == "fused" else m.with_parts(models.compiled(backend="aot_eager"))
    got = fn(tokens, pool2, table, lens)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    assert torch.allclose(pool2.k, pool.k, atol=1e-5) and torch.allclose(pool2.v, pool.v, atol=1e-5)  # the same K/V


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_partial_sums_give_the_reduced_products_values(dtype):
    # a split-K product's float32 pieces, added by the norm and the RoPE kernel as they load them, give exactly
    # what the product reduced and stored in dtype gives
    from lib.kernels import skinny_gemm

    g = torch.Generator().manual_seed(5)
    cfg = models.CONFIGS["tiny"]
    width = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
    x = torch.randn(3, 512, generator=g).to(dtype)
    for n, consumer in ((cfg.hidden, "rmsnorm"), (width, "rope")):
        w = (torch.randn(512, n, generator=g) * 0.05).to(dtype)
        parts = skinny_gemm.skinny_mm(x, w, splits=4, reduce=False)
        reduced = skinny_gemm.skinny_mm(x, w, splits=4)
        assert parts.shape == (4, 3, n) and parts.dtype == torch.float32
        assert torch.equal(((parts[0] + parts[1]) + parts[2] + parts[3]).to(dtype), reduced)
        if consumer == "rmsnorm":
            res = torch.randn(3, n, generator=g).to(dtype)
            wn = torch.rand(n, generator=g).to(dtype) + 0.5
            for r in (res, None):
                a, b = fused.rmsnorm(parts, wn, 1e-5, residual=r), fused.rmsnorm(reduced, wn, 1e-5, residual=r)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].dtype == dtype
        else:
            pools = [KVPool(12, 4, layers=1, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim, dtype=dtype) for _ in range(2)]
            table = torch.tensor([[5, 2, 7], [0, 9, 1], [11, 3, 4]], dtype=torch.int32)
            pos = torch.tensor([5, 11, 0])
            inv = models.Llama.random(cfg, dtype=torch.float32, device="cpu").inv_freq.float()
            qa = fused.rope_write(parts, pos, inv, pools[0].k[0], pools[0].v[0], table, cfg.heads)
            qb = fused.rope_write(reduced, pos, inv, pools[1].k[0], pools[1].v[0], table, cfg.heads)
            assert torch.equal(qa, qb) and torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)


# ------------------------------------------------------------------ RoPE + K/V write: no write outside the cache
GUARD = 2  # blocks of guard on each side of the caches


def guarded_rope_case():
    """Two rows, H_q = 2, H_kv = 1, d = 16, pages of 4, a pool of 3 blocks laid inside a buffer with GUARD
    blocks on each side; row 0 writes block 0 slot 1 (position 5). The block table [2, 2] is a view whose
    rows are followed by an entry 0, so that a read past a row finds a block of the pool."""
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(2, 4 * 16, generator=g)
    inv = torch.rand(8, generator=g)
    kbuf, vbuf = torch.randn(2, 3 + 2 * GUARD, 1, 4, 16, generator=g)
    tbuf = torch.tensor([[2, 0, 0], [1, 2, 0]], dtype=torch.int32)
    return qkv, torch.tensor([5, 6]), inv, kbuf, vbuf, tbuf


def caches(kbuf, vbuf):
    return kbuf[GUARD:GUARD + 3], vbuf[GUARD:GUARD + 3]


@pytest.mark.parametrize("row,pos,shown", [
    ([-1, 2], 1, r"table\[1, 0\] = -1 names no block of the cache \(k_cache has 3 blocks, 0 .. 2\), and pos\[1\] = 1"),
    ([3, 2], 1, r"table\[1, 0\] = 3 names no block of the cache"),
    ([-2, 2], 1, r"table\[1, 0\] = -2 names no block"),
    ([1, 4], 6, r"table\[1, 1\] = 4 names no block"),
    ([1, 2], -1, r"pos\[1\] = -1 is negative"),
    ([1, 2], 8, r"pos\[1\] = 8 is past what table's row holds \(2 blocks of 4 = 8 positions, 0 .. 7\)"),
    ([1, 2], 11, r"pos\[1\] = 11 is past what table's row holds"),
])
def test_rope_write_never_writes_outside_its_cache(row, pos, shown):
    """A slot outside the cache (an entry past the pool or below 0, a position below 0 or past the table's row)
    is refused where values are read (the CPU by default, check=True), and with check=False (as inside a CUDA
    graph) the kernel skips that row's K and V: the guard around the cache and every other slot keep their
    values, and the good row is written as alone."""
    qkv, good_pos, inv, kbuf, vbuf, tbuf = guarded_rope_case()
    tbuf[1, :2] = torch.tensor(row, dtype=torch.int32)
    table, bad_pos = tbuf[:, :2], torch.tensor([5, pos])
    kref, vref = kbuf.clone(), vbuf.clone()
    q_alone = fused.rope_write(qkv[:1], good_pos[:1], inv, *caches(kref, vref), table[:1], 2)  # row 0 alone
    k0, v0 = kbuf.clone(), vbuf.clone()
    for check in (None, True):
        with pytest.raises(ValueError, match=shown):
            fused.rope_write(qkv, bad_pos, inv, *caches(kbuf, vbuf), table, 2, check=check)
        assert torch.equal(kbuf, k0) and torch.equal(vbuf, v0)  # refused before anything was written
    q = fused.rope_write(qkv, bad_pos, inv, *caches(kbuf, vbuf), table, 2, check=False)
    assert torch.equal(kbuf, kref) and torch.equal(vbuf, vref)  # row 0's slot only: no guard, no other slot
    assert torch.equal(q[0], q_alone[0]) and bool(torch.isfinite(q).all())  # the queries still come back


def test_rope_write_arguments_are_named_with_their_fix():
    qkv, pos, inv, kbuf, vbuf, tbuf = guarded_rope_case()
    kc, vc = caches(kbuf, vbuf)
    table = tbuf[:, :2]
    with pytest.raises(TypeError, match=r"pos must hold integer positions \(int64 or int32\), got torch.float32.*"
                                        r"pos.long\(\)"):
        fused.rope_write(qkv, pos.float(), inv, kc, vc, table, 2)
    with pytest.raises(TypeError, match=r"pos must be a torch.Tensor.*got list"):
        fused.rope_write(qkv, pos.tolist(), inv, kc, vc, table, 2)
    with pytest.raises(TypeError, match=r"table must hold integer block numbers.*table.to\(torch.int32\)"):
        fused.rope_write(qkv, pos, inv, kc, vc, table.float(), 2)
    with pytest.raises(ValueError, match=r"table's rows must be contiguous.*table.contiguous\(\)"):
        fused.rope_write(qkv, pos, inv, kc, vc, torch.tensor([[2, 1], [0, 2]], dtype=torch.int32).t(), 2)
    with pytest.raises(ValueError, match=r"pos must be contiguous.*pos.contiguous\(\)"):
        fused.rope_write(qkv, torch.tensor([5, 0, 6, 0])[::2], inv, kc, vc, table, 2)
    with pytest.raises(ValueError, match="k_cache and v_cache must have one shape and dtype"):
        fused.rope_write(qkv, pos, inv, kc, vc[:2], table, 2)
    with pytest.raises(ValueError, match="v_cache is on meta but qkv on cpu"):
        fused.rope_write(qkv, pos, inv, kc, vc.to("meta"), table, 2)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match=rf"heads must be a whole number >= 1.*got {bad!r}"):
            fused.rope_write(qkv, pos, inv, kc, vc, table, bad)
    with pytest.raises(TypeError, match="inv_freq must be a float tensor"):
        fused.rope_write(qkv, pos, inv.long(), kc, vc, table, 2)
    with pytest.raises(ValueError, match="check=True.*meta tensors hold no values"):
        fused.rope_write(*(t.to("meta") for t in (qkv, pos, inv, kc, vc, table)), 2, check=True)


def test_silu_mul_block_is_a_power_of_two():
    gu = torch.randn(2, 40, generator=torch.Generator().manual_seed(0))
    for bad in (0, -4, 24, True, 16.0):
        with pytest.raises(ValueError, match=rf"block must be a power of two >= 1.*got {bad!r}"):
            fused.silu_mul(gu, block=bad)
    assert torch.equal(fused.silu_mul(gu, block=8), fused.silu_mul(gu))  # a tail past blocks of 8: the same


def test_rows_of_no_columns_give_empty_results():
    assert fused.silu_mul(torch.zeros(3, 0)).shape == (3, 0)
    out, h = fused.rmsnorm(torch.zeros(3, 0), torch.zeros(0), 1e-5, residual=torch.zeros(3, 0))
    assert out.shape == h.shape == (3, 0)
    assert fused.rmsnorm(torch.zeros(0, 8), torch.ones(8), 1e-5)[0].shape == (0, 8)
