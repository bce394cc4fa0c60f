"""Weight quantizers (lib.quant) and the GEMMs that read their formats (lib.kernels.quant_gemm, in Triton's
interpreter): hand-worked packing, round trips within half a scale, bad input refused, and the kernels
against float64 products of the dequantized weights."""

import pytest
import torch

from lib import quant
from lib.kernels import quant_gemm as qg

# ---------------------------------------------------------------------------- formats by hand

def test_int4_packing_by_hand():
    # rows 0 and 1 of a column share a byte: row 0 low, row 1 high; -1 is 0xF, -8 is 0x8
    q = torch.tensor([[1, -1], [2, 7], [-8, 0], [-1, 3]], dtype=torch.int8)
    p = quant.pack_int4(q)
    assert p.dtype == torch.uint8 and p.tolist() == [[0x21, 0x7F], [0xF8, 0x30]]
    assert torch.equal(quant.unpack_int4(p), q)


def test_int8_by_hand():
    # column 0: max |w| = 2.54 -> scale 0.02, q = 127, -64 (-1.28 / 0.02), 0; an all-zero column gets scale 1
    w = torch.tensor([[2.54, 0.0], [-1.28, 0.0], [0.0, 0.0]])
    qw = quant.quantize_int8(w)
    assert qw.scale.tolist() == pytest.approx([0.02, 1.0])
    assert qw.q[:, 0].tolist() == [127, -64, 0] and qw.q[:, 1].tolist() == [0, 0, 0]


def test_int4_groups_by_hand():
    # one column, two groups of 32: the first holds 0.7 (scale 0.1: q 7) and -0.35 (q -4 after ties-to-even
    # of -3.5), the second is zero (scale 1)
    w = torch.zeros(64, 1)
    w[0, 0], w[5, 0] = 0.7, -0.35
    qw = quant.quantize_int4(w, group=32)
    assert qw.scale[:, 0].tolist() == pytest.approx([0.1, 1.0])
    v = qw.values()[:, 0]
    assert int(v[0]) == 7 and int(v[5]) == -4 and int(v.abs().sum()) == 11


@pytest.mark.parametrize("fmt,group,expected", [("bf16", None, 2.0), ("int8", None, 1 + 4 / 4096),
                                                ("int4", 128, 0.5 + 4 / 128), ("int4", 32, 0.5 + 4 / 32),
                                                ("fp8", None, 1.0)])
def test_bytes_per_weight(fmt, group, expected):
    assert quant.bytes_per_weight(fmt, group) == pytest.approx(expected)


# ---------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("group", quant.GROUPS)
def test_int4_round_trip_within_half_a_scale(group):
    g = torch.Generator().manual_seed(group)
    w = torch.randn(512, 48, generator=g) * 0.02
    w[:, 3] *= 40  # an outlier channel: its own scales, the others' unaffected
    qw = quant.quantize_int4(w, group)
    s = qw.scale.repeat_interleave(group, 0)
    err = (qw.dequantize() - w).abs()
    assert bool((err <= s / 2 + 1e-7).all())
    assert int(qw.values().min()) >= -7 and int(qw.values().max()) <= 7
    # the largest weight of each group is represented exactly (it sets the scale: q = +-7)
    assert bool(((qw.values().abs() == 7).reshape(-1, group, 48).any(dim=1)).all())


def test_int8_round_trip_within_half_a_scale():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 40, generator=g) * 0.02).to(torch.bfloat16)
    qw = quant.quantize_int8(w)
    err = (qw.dequantize() - w.float()).abs()
    assert bool((err <= qw.scale[None, :] / 2 + 1e-7).all())


@pytest.mark.parametrize("call,err,words", [
    (lambda: quant.quantize_int4(torch.randn(100, 8), 32), ValueError, "multiple of the group"),
    (lambda: quant.quantize_int4(torch.randn(128, 8), 48), ValueError, "group must be one of"),
    (lambda: quant.quantize_int8(torch.tensor([[1.0, float("nan")]])), ValueError, "NaN"),
    (lambda: quant.quantize_int8(torch.ones(4, 4, dtype=torch.int32)), TypeError, "floating point"),
    (lambda: quant.quantize_int8(torch.ones(4)), ValueError, "2-D"),
    (lambda: quant.pack_int4(torch.full((2, 2), 9, dtype=torch.int8)), ValueError, "-8..7"),
    (lambda: quant.pack_int4(torch.zeros(3, 2, dtype=torch.int8)), ValueError, "K even"),
    (lambda: quant.bytes_per_weight("int3"), ValueError, "unknown format"),
])
def test_bad_input_is_refused(call, err, words):
    with pytest.raises(err, match=words):
        call()


# ---------------------------------------------------------------------------- the kernels

def _rel_err(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,splits", [(1, 256, 200, 1), (3, 512, 96, 2), (17, 256, 64, 1), (70, 128, 130, 2),
                                          (2, 100, 64, 1)])  # K = 100: the last tile masked
def test_w8_matches_float64(dtype, M, K, N, splits, swap):
    g = torch.Generator().manual_seed(M * 7 + K)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g) * 0.02
    qw = quant.quantize_int8(w)
    y = qg.w8_mm(x, qw, splits=splits, swap=swap)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert y.dtype == dtype and y.shape == (M, N)
    assert _rel_err(y, ref) < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,group,splits", [(1, 256, 200, 128, 1), (2, 512, 64, 32, 2), (5, 256, 96, 64, 1),
                                                (20, 512, 64, 256, 2), (65, 256, 70, 128, 1)])
def test_w4_matches_float64(dtype, M, K, N, group, splits, swap):
    g = torch.Generator().manual_seed(M * 11 + group)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g) * 0.02
    qw = quant.quantize_int4(w, group)
    y = qg.w4_mm(x, qw, splits=splits, swap=swap)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert y.dtype == dtype and y.shape == (M, N)
    assert _rel_err(y, ref) < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,splits,rows", [(1, 256, 200, 1, 32), (3, 512, 96, 2, 16), (2, 100, 64, 1, 32),
                                               (1, 96, 130, 1, 64)])  # K = 100, 96: the last tile masked
def test_w8_gemv_matches_float64(dtype, M, K, N, splits, rows):
    g = torch.Generator().manual_seed(M * 5 + K)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g) * 0.02
    w[0, :2] = torch.tensor([-1.0, 1.0])  # column 0 holds -127, column 1 holds 127
    qw = quant.quantize_int8(w)
    assert int(qw.q.min()) == -127 and int(qw.q.max()) == 127  # both ends of the range pass through the kernel
    y = qg.w8_gemv(x, qw, splits=splits, rows=rows)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert y.dtype == dtype and y.shape == (M, N)
    assert _rel_err(y, ref) < (1e-6 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,group,splits,rows", [(1, 256, 200, 128, 1, 32), (2, 512, 64, 32, 2, 16),
                                                     (4, 256, 96, 64, 1, 8), (1, 512, 72, 256, 2, 32)])
def test_w4_gemv_matches_float64(dtype, M, K, N, group, splits, rows):
    g = torch.Generator().manual_seed(M * 13 + group)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g) * 0.02
    qw = quant.quantize_int4(w, group)
    assert int(qw.values().min()) == -8 or int(qw.values().max()) == 7
    y = qg.w4_gemv(x, qw, splits=splits, rows=rows)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert y.dtype == dtype and y.shape == (M, N)
    assert _rel_err(y, ref) < (1e-6 if dtype == torch.float32 else 2e-3)


def test_gemv_every_int4_value_by_hand():
    # K = 32 (one group), four columns (one word): column j holds q = (k + 5j) mod 16 - 8, every value -8..7,
    # with scale j + 1; x picks rows 0, 17 (a high nibble) and 31 with weights 1, 2, -1
    q = torch.tensor([[(k + 5 * j) % 16 - 8 for j in range(4)] for k in range(32)], dtype=torch.int8)
    qw = quant.Int4Weight(qg.pack_int4(q), torch.tensor([[1.0, 2.0, 3.0, 4.0]]), 32)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 17], x[0, 31] = 1.0, 2.0, -1.0
    expect = [(j + 1) * (((0 + 5 * j) % 16 - 8) + 2 * ((17 + 5 * j) % 16 - 8) - ((31 + 5 * j) % 16 - 8)) for j in range(4)]
    assert qg.w4_gemv(x, qw)[0].tolist() == expect  # [-29, -6, 21, -60], exact in float32
    assert qg.w4_gemv(torch.ones(1, 32), qw)[0].tolist() == [-16.0 * (j + 1) for j in range(4)]


@pytest.mark.parametrize("magnitude", [1e-6, 1.0, 3e4, 1e9])
def test_w4_gemv_holds_its_precision_over_the_range_of_activations(magnitude):
    # the kernel scales x by powers of two up to 2^85 before the products: no overflow up to 2^42, no
    # underflow of the products for any activation that matters
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 256, generator=g) * magnitude
    qw = quant.quantize_int4(torch.randn(256, 64, generator=g) * 0.02, 128)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert _rel_err(qg.w4_gemv(x, qw), ref) < 1e-6


def test_gemv_refuses_bad_launches():
    qw = quant.quantize_int4(torch.randn(128, 8), 32)
    with pytest.raises(ValueError, match="dividing the group"):
        qg.w4_gemv(torch.randn(1, 128), qw, rows=32)  # 64 rows of w per tile, groups of 32
    with pytest.raises(ValueError, match="whole tiles"):
        qg.w8_gemv(torch.randn(1, 100), quant.quantize_int8(torch.randn(100, 8)), splits=2, rows=32)
    with pytest.raises(TypeError, match="Int4Weight"):
        qg.w4_gemv(torch.randn(1, 128), quant.quantize_int8(torch.randn(128, 8)))
    with pytest.raises(ValueError, match="multiples of 4"):
        qg.w4_gemv(torch.randn(1, 128), quant.quantize_int4(torch.randn(128, 6), 32), rows=16)


def test_w4_by_hand():
    # K = 32 (one group), N = 1: w = 0.1 at row 0 and -0.2 at row 1 (scale 0.2 / 7), x = 1 at rows 0 and 1
    w = torch.zeros(32, 1)
    w[0, 0], w[1, 0] = 0.1, -0.2
    qw = quant.quantize_int4(w, 32)
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 1.0, 1.0
    expect = float(qw.dequantize()[0, 0] + qw.dequantize()[1, 0])  # 0.2/7 * (round(3.5) = 4) - 0.2
    assert float(qg.w4_mm(x, qw)[0, 0]) == pytest.approx(expect, rel=1e-6)


def test_kernels_refuse_bad_input():
    qw = quant.quantize_int4(torch.randn(64, 8), 32)
    with pytest.raises(ValueError, match="K = 64"):
        qg.w4_mm(torch.randn(1, 32), qw)
    with pytest.raises(TypeError, match="Int4Weight"):
        qg.w4_mm(torch.randn(1, 64), quant.quantize_int8(torch.randn(64, 8)))
    with pytest.raises(ValueError, match="divide the group"):
        qg.w4_mm(torch.randn(1, 64), qw, block_k=48)
    with pytest.raises(TypeError, match="fp16, bf16 or fp32"):
        qg.w8_mm(torch.ones(1, 64, dtype=torch.int32), quant.quantize_int8(torch.randn(64, 8)))


# ---------------------------------------------------------------------------- the prediction

def test_prediction_by_hand():
    # 1,000 x 1,000 weights; read 1,000 GB/s, 100 TFLOP/s, 10 tera-instructions/s
    kw = dict(read_GBps=1000.0, mma_TFLOPs=100.0, alu_Tops=10.0)
    p = quant.predict_us("bf16", 1, 1000, 1000, **kw)
    assert p["memory"] == pytest.approx(2.0) and p["mma"] == pytest.approx(0.02) and p["alu"] == 0.0
    assert p["bound"] == "memory" and p["time"] == pytest.approx(2.0)
    # int4 in groups of 128 over K = 1024: 0.5 + 4/128 bytes a weight
    p = quant.predict_us("int4", 1, 1024, 1000, group=128, **kw)
    assert p["memory"] == pytest.approx(1024 * 1000 * (0.5 + 4 / 128) / 1e6)
    assert p["alu"] == pytest.approx(1024 * 1000 * 2.5 / 1e7) and p["bound"] == "memory"  # 0.256 < 0.544
    # past 64 rows each block of rows converts the weights again
    p65 = quant.predict_us("int4", 65, 1024, 1000, group=128, **kw)
    assert p65["alu"] == pytest.approx(2 * p["alu"])
    # 500 rows: 2 x 500 x 1e6 FLOPs at 100 TFLOP/s = 10 us, more than bf16's 2 us read
    assert quant.predict_us("bf16", 500, 1000, 1000, **kw)["bound"] == "mma"


def test_speedup_bound_and_crossover():
    assert quant.speedup_bound("int8", K=4096) == pytest.approx(2 / (1 + 4 / 4096))
    assert quant.speedup_bound("int4", 128) == pytest.approx(2 / (0.5 + 4 / 128))
    # bf16 at 4,000 GB/s and 800 TFLOP/s: 2 bytes a weight, 2 FLOPs a row: M* = 2 x 800e12 / (2 x 4e12) = 200
    assert quant.crossover_rows("bf16", read_GBps=4000.0, mma_TFLOPs=800.0) == pytest.approx(200.0)
    assert quant.crossover_rows("int4", 128, read_GBps=4000.0, mma_TFLOPs=800.0) == pytest.approx(53.125)


# ---------------------------------------------------------------------------- the quantized decode step

@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_step_equals_the_fused_step_on_its_dequantized_weights(fmt):
    """The quantized step's logits are the fused step's on a model holding the weights it effectively uses (the same
    K/V written too); and they differ from the unquantized model's, so the check is not vacuous."""
    from lib import models

    m = models.Llama.random(models.CONFIGS["tiny"], dtype=torch.float32, device="cpu")
    step = m.with_parts(models.quantized(fmt, 32))
    ref_m = models.dequantized(m, fmt, 32)

    def case():
        pool = m.new_pool(16, 4)
        pool.k.normal_(generator=torch.Generator().manual_seed(3)), pool.v.normal_(generator=torch.Generator().manual_seed(4))
        return pool, torch.arange(8, dtype=torch.int32).flip(0).reshape(2, 4).contiguous()

    lens, tokens = torch.tensor([7, 3], dtype=torch.int32), torch.tensor([5, 90])
    (p1, t1), (p2, t2), (p3, t3) = case(), case(), case()
    got = step(tokens, p1, t1, lens)
    ref = ref_m.with_parts(models.FUSED)(tokens, p2, t2, lens)
    plain = m.with_parts(models.FUSED)(tokens, p3, t3, lens)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)
    assert torch.allclose(p1.k, p2.k, atol=1e-5) and torch.allclose(p1.v, p2.v, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(step.greedy(tokens, case()[0], case()[1], lens), got.argmax(-1))
    c = models.CONFIGS["tiny"]
    weights = c.layers * (c.hidden * (c.heads + 2 * c.kv_heads) * c.head_dim + c.heads * c.head_dim * c.hidden
                          + c.hidden * 2 * c.mlp + c.mlp * c.hidden)
    per = 1.0 if fmt == "int8" else 0.5
    assert step.layer_weight_bytes() > weights * per and step.layer_weight_bytes() < weights * (per + 0.2)


def test_quantized_step_refuses_an_unknown_format():
    from lib import models

    with pytest.raises(ValueError, match="fmt must be"):
        models.quantized("int3")


def test_one_row_goes_to_the_gemv_and_more_rows_to_the_tensor_core_kernel():
    g = torch.Generator().manual_seed(9)
    w4, w8 = quant.quantize_int4(torch.randn(256, 64, generator=g), 64), quant.quantize_int8(torch.randn(256, 64, generator=g))
    x1, x3 = torch.randn(1, 256, generator=g), torch.randn(3, 256, generator=g)
    assert qg.gemv_rows(1) and not qg.gemv_rows(3)
    assert torch.equal(qg.w4_mm(x1, w4), qg.w4_gemv(x1, w4)) and torch.equal(qg.w8_mm(x1, w8), qg.w8_gemv(x1, w8))
    assert torch.equal(qg.w4_mm(x3, w4), qg.w4_mm(x3, w4, gemv=False))
    assert torch.equal(qg.w8_mm(x3, w8), qg.w8_mm(x3, w8, gemv=False))
    # a tensor-core launch parameter keeps one row on the tensor-core kernel
    assert torch.equal(qg.w4_mm(x1, w4, splits=2), qg.w4_mm(x1, w4, splits=2, gemv=False))


# ---------------------------------------------------------------------------- scales interleaved with the weights

def test_interleaved_layout_by_hand():
    # K = 64 in groups of 32, N = 4 (one word per row): group 0's 16 rows of words, then its 4 scales (one
    # per column, one row each), then group 1's
    q = torch.tensor([[(k + j) % 16 - 8 for j in range(4)] for k in range(64)], dtype=torch.int8)
    scale = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    iw = quant.interleave_scales(quant.Int4Weight(qg.pack_int4(q), scale, 32))
    assert iw.words.shape == (2, 20, 1) and iw.K == 64 and iw.N == 4
    assert iw.words[1, 16:, 0].view(torch.float32).tolist() == [5.0, 6.0, 7.0, 8.0]
    assert iw.words[1, :16].contiguous().view(torch.uint8).tolist() == qg.pack_int4(q[32:]).tolist()
    back = iw.separate()
    assert torch.equal(back.packed, qg.pack_int4(q)) and torch.equal(back.scale, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,group,splits,rows", [(1, 256, 200, 128, 1, 32), (2, 512, 64, 32, 2, 16),
                                                     (1, 512, 72, 256, 2, 64)])
def test_w4_gemv_interleaved_equals_separate(dtype, M, K, N, group, splits, rows):
    g = torch.Generator().manual_seed(K + group)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g) * 0.02
    qw = quant.quantize_int4(w, group)
    iw = quant.interleave_scales(qw)
    y = qg.w4_gemv(x, iw, splits=splits, rows=rows)
    # the same arithmetic on the same values in another order of bytes: equal, bit for bit
    assert torch.equal(y, qg.w4_gemv(x, qw, splits=splits, rows=rows))
    assert _rel_err(y, x.double() @ iw.dequantize(torch.float64)) < (1e-6 if dtype == torch.float32 else 2e-3)


def test_interleaving_refuses_what_it_cannot_store():
    with pytest.raises(ValueError, match="multiple of 4"):
        quant.interleave_scales(quant.quantize_int4(torch.randn(64, 6), 32))
    with pytest.raises(TypeError, match="Int4Weight"):
        quant.interleave_scales(quant.quantize_int8(torch.randn(64, 8)))
    with pytest.raises(TypeError, match="Int4Interleaved"):
        qg.w4_gemv(torch.randn(1, 64), torch.randn(64, 8))


# ---------------------------------------------------------------------------- many rows: dequantize, then the 16-bit product

@pytest.mark.parametrize("group", [32, 128])
def test_dequantize_kernel_equals_the_containers(group):
    g = torch.Generator().manual_seed(group)
    w = torch.randn(256, 200, generator=g) * 0.02  # N = 200: the last column block masked
    q4, q8 = quant.quantize_int4(w, group), quant.quantize_int8(w)
    for qw in (q4, q8):
        assert torch.equal(qg.dequantize(qw, torch.float32), qw.dequantize(torch.float32))  # exact in float32
        assert torch.equal(qg.dequantize(qw, torch.float16), qw.dequantize(torch.float16))
    with pytest.raises(TypeError, match="Int8Weight or an Int4Weight"):
        qg.dequantize(w, torch.float16)


def test_many_rows_go_to_the_dequantized_product():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(qg.DEQUANT_ROWS, 128, generator=g), torch.randn(128, 64, generator=g) * 0.02
    q4 = quant.quantize_int4(w, 32)
    assert qg.dequant_rows(qg.DEQUANT_ROWS) and not qg.dequant_rows(qg.DEQUANT_ROWS - 1)
    ref = x.double() @ q4.dequantize(torch.float64)
    assert _rel_err(qg.w4_mm(x, q4), ref) < 1e-6
    assert torch.equal(qg.w4_mm(x, q4), x @ q4.dequantize(torch.float32))  # the same product, cuBLAS's (here torch's)
    q8 = quant.quantize_int8(w)
    assert torch.equal(qg.w8_mm(x, q8), x @ q8.dequantize(torch.float32))
    # a launch parameter keeps the fused kernel
    assert _rel_err(qg.w4_mm(x, q4, block_n=32), ref) < 1e-5


@pytest.mark.parametrize("splits", [2, 4])
def test_inline_sum_of_the_slices_equals_the_second_launch(splits):
    # the last slice of each block of columns adds the slices' sums in the same order as _sum_splits_kernel:
    # the same bits; a second call finds every count back at zero
    g = torch.Generator().manual_seed(splits)
    x, w = torch.randn(2, 512, generator=g), torch.randn(512, 200, generator=g) * 0.02
    qw = quant.quantize_int4(w, 64)
    two = qg.w4_gemv(x, qw, splits=splits, rows=16, block_n=64, inline_sum=False)
    for _ in range(2):
        assert torch.equal(qg.w4_gemv(x, qw, splits=splits, rows=16, block_n=64, inline_sum=True), two)
    assert all(int(c.abs().sum()) == 0 for c in qg._COUNTERS.values())


def test_gemv_launch_by_hand():
    # int4 at one row on 132 SMs: QKV (K 4096, N 6144) has 48 blocks of 128 columns; 1.5 programs per SM
    # (198) and slices of at most 1,024 rows take 8 splits (384 programs), added by the last slice; gate-up
    # (N 28672: 224 blocks) needs only the 1,024-row rule: 4 splits, added by a second launch
    qkv = qg.choose_gemv_config(1, 6144, 4096, 132, bits=4)
    assert (qkv["rows"], qkv["block_n"], qkv["splits"], qkv["inline_sum"]) == (64, 128, 8, True)
    gate_up = qg.choose_gemv_config(1, 28672, 4096, 132, bits=4)
    assert (gate_up["splits"], gate_up["inline_sum"]) == (4, False)
    assert not qg.choose_gemv_config(1, 6144, 4096, 132, bits=8)["inline_sum"]


def test_int4_launch_at_decodes_rows_by_hand():
    # int4 at up to 16 rows: blocks of 256 columns, the weights as the first operand, and the fewest splits
    # (slices of at least four tiles) that launch 1.5 programs per SM: O (4096 x 4096) on 132 SMs has 16
    # blocks of columns and takes 16 splits (256 programs); gate-up (N = 28672) 112 blocks and 2 splits
    o = qg.choose_config(16, 4096, 4096, 132, int4=True)
    assert (o["block_n"], o["swap"], o["splits"]) == (256, True, 16)
    assert qg.choose_config(16, 28672, 4096, 132, int4=True)["splits"] == 2
    assert not qg.choose_config(17, 4096, 4096, 132, int4=True)["swap"]  # past 16 rows: the general launch
    assert not qg.choose_config(16, 4096, 4096, 132)["swap"]  # int8 keeps it
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 256, generator=g), torch.randn(256, 64, generator=g) * 0.02
    q4 = quant.quantize_int4(w, 64)
    ref = x.double() @ q4.dequantize(torch.float64)
    assert _rel_err(qg.w4_mm(x, q4), ref) < 1e-6  # the swapped default, checked
    assert torch.allclose(qg.w4_mm(x, q4), qg.w4_mm(x, q4, swap=False), rtol=1e-5, atol=1e-6)
