"""The decode step's skinny GEMM (lib.kernels.skinny_gemm) in Triton's interpreter, against torch.mm in
float64: every split of K, tails in N and K, one row and many."""

import pytest
import torch

from lib.kernels import skinny_gemm as sk


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N,splits,block_n,block_k", [
    (1, 256, 200, 1, 64, 64),    # N not a multiple of the tile
    (1, 256, 128, 2, 64, 64),
    (3, 512, 96, 4, 64, 64),
    (17, 100, 64, 1, 64, 64),    # 17 rows: the 64-row tile; K not a multiple of the tile
    (64, 256, 130, 2, 64, 64),
])
def test_matches_float64(dtype, M, K, N, splits, block_n, block_k):
    g = torch.Generator().manual_seed(M * 1000 + K)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)
    y = sk.skinny_mm(x, w, splits=splits, block_n=block_n, block_k=block_k)
    ref = x.double() @ w.double()
    assert y.dtype == dtype and y.shape == (M, N)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < (1e-5 if dtype == torch.float32 else 2e-3)


def test_hand_worked():
    # x = [1, 2], w = [[1, 0, 3], [0, 1, 4]]: y = [1, 2, 11]
    y = sk.skinny_mm(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0, 3.0], [0.0, 1.0, 4.0]]))
    assert y.tolist() == [[1.0, 2.0, 11.0]]


def test_choose_config_by_hand():
    # N = 4096 in columns of 64: 64 programs; splits double while under 1.5 x 132 = 198 programs and each slice
    # keeps four tiles of 64: 2 (128 programs), 4 (256)
    c = sk.choose_config(1, 4096, 4096, 132)
    assert (c["block_m"], c["block_n"], c["block_k"], c["splits"]) == (16, 64, 64, 4)
    assert sk.choose_config(1, 6144, 4096, 132)["splits"] == 4  # 96 -> 192 -> 384 programs
    assert sk.choose_config(1, 28672, 4096, 132)["splits"] == 1  # 224 column blocks of 128: no split
    assert sk.choose_config(64, 128256, 4096, 132)["block_m"] == 64
    assert sk.choose_config(1, 64, 512, 132)["splits"] == 2  # slices of 256 rows: no further


def test_use_for():
    assert sk.use_for(1, 4096, 4096) and sk.use_for(16, 6144, 4096)
    assert not sk.use_for(64, 4096, 4096) and sk.use_for(64, 28672, 4096) and sk.use_for(64, 4096, 14336)
    assert not sk.use_for(65, 128256, 4096)


def test_bad_inputs():
    with pytest.raises(ValueError, match="rows"):
        sk.skinny_mm(torch.zeros(65, 8), torch.zeros(8, 4))
    with pytest.raises(ValueError, match="share K"):
        sk.skinny_mm(torch.zeros(2, 8), torch.zeros(9, 4))
    with pytest.raises(ValueError, match="whole tiles"):
        sk.skinny_mm(torch.zeros(1, 192), torch.zeros(192, 4), splits=2, block_k=64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M,K,N", [(1, 64, 300), (5, 100, 1000), (20, 64, 129)])
def test_skinny_argmax_matches_argmax_of_the_product(dtype, M, K, N):
    g = torch.Generator().manual_seed(M + N)
    x, w = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)
    logits = sk.skinny_mm(x, w)  # the same products, rounded to the dtype
    assert torch.equal(sk.skinny_argmax(x, w), logits.argmax(-1))


def test_skinny_argmax_takes_the_first_of_a_tie():
    # columns 1, 5 and 17 tie at the largest value (two of them in the first block of 16, one in the second):
    # the first wins, as with torch.argmax
    x = torch.ones(1, 2)
    w = torch.zeros(2, 32)
    w[0, [1, 5, 17]], w[1, [1, 5, 17]], w[0, 3] = 2.0, 1.0, 2.5
    assert sk.skinny_argmax(x, w, block_n=16).tolist() == [1]
    with pytest.raises(ValueError, match="need x"):
        sk.skinny_argmax(torch.zeros(65, 2), w)


def test_an_output_sharing_memory_with_an_input_is_refused():
    """out laid over x (or w) would be written while other programs still read it (the fault sweep's
    out-over-x gave errors of 197): refused, and halves of one buffer are fine."""
    g = torch.Generator().manual_seed(3)
    buf = torch.randn(4 * 64, generator=g)
    x, w = buf[:128].view(2, 64), torch.randn(64, 64, generator=g)
    with pytest.raises(ValueError, match=r"out shares memory with x.*pass a separate tensor"):
        sk.skinny_mm(x, w, out=buf[64:192].view(2, 64))  # over x's second row
    with pytest.raises(ValueError, match="out shares memory with w"):
        sk.skinny_mm(x, w, out=w[:2])
    with pytest.raises(ValueError, match=r"out must be a contiguous \[2, 64\] tensor of torch.float32 on cpu"):
        sk.skinny_mm(x, w, out=torch.empty(2, 64, device="meta"))
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        sk.skinny_mm(x, w, out=[[0.0] * 64] * 2)
    out = sk.skinny_mm(x, w, out=buf[128:].view(2, 64))  # the buffer's other half: disjoint
    assert torch.allclose(out, x @ w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw,shown", [
    (dict(splits=-1), r"splits must be a whole number >= 1.*got -1"),
    (dict(splits=0), r"splits must be a whole number >= 1.*got 0"),
    (dict(splits=2.0), r"splits must be a whole number >= 1"),
    (dict(block_n=24), r"block_n must be a power of two >= 16 \(the smallest tl.dot\), got 24"),
    (dict(block_n=0), r"block_n must be a power of two >= 16"),
    (dict(block_n=8), r"block_n must be a power of two >= 16"),
    (dict(block_k=48), r"block_k must be a power of two >= 16"),
    (dict(num_warps=3), r"num_warps must be a power of two >= 1"),
    (dict(num_stages=0), r"num_stages must be a whole number >= 1"),
])
def test_launch_parameters_are_checked_not_replaced(kw, shown):
    with pytest.raises(ValueError, match=shown):
        sk.skinny_mm(torch.zeros(1, 256), torch.zeros(256, 64), **kw)


def test_skinny_argmax_refuses_no_columns_and_odd_blocks():
    x = torch.zeros(2, 64)
    with pytest.raises(ValueError, match=r"w \[K, N\] with N >= 1 \(a column to pick\)"):
        sk.skinny_argmax(x, torch.zeros(64, 0))
    for name in ("block_n", "block_k"):
        with pytest.raises(ValueError, match=rf"{name} must be a power of two >= 16.*got 24"):
            sk.skinny_argmax(x, torch.zeros(64, 8), **{name: 24})
