"""The tuning folder's GEMV variant of several rows per program (tools/tuning/quant_gemv_variants.py), in
Triton's interpreter: the same product as the book's GEMV, within float32 rounding, at ragged row counts,
split K and groups of every size, and bad launches refused."""

import sys
from pathlib import Path

import pytest
import torch

from lib import quant
from lib.kernels import quant_gemm as qg  # first: on a machine without a GPU it sets Triton's interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "tuning"))

import quant_gemv_variants as variants  # noqa: E402


@pytest.mark.parametrize("M,block_m,group,splits,rows", [(1, 2, 128, 1, 16), (3, 2, 32, 2, 16), (5, 4, 64, 1, 8),
                                                         (8, 8, 256, 2, 32)])
def test_rows_per_program_equal_the_books_gemv(M, block_m, group, splits, rows):
    g = torch.Generator().manual_seed(M * 7 + group)
    x, w = torch.randn(M, 512, generator=g), torch.randn(512, 72, generator=g) * 0.02
    qw = quant.quantize_int4(w, group)
    y = variants.w4_gemv_rows(x, qw, block_m=block_m, rows=rows, block_n=32, splits=splits)
    ref = x.double() @ qw.dequantize(torch.float64)
    assert y.shape == (M, 72)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-6
    assert torch.allclose(y, qg.w4_gemv(x, qw), rtol=1e-5, atol=1e-6)


def test_bad_launches_are_refused():
    qw = quant.quantize_int4(torch.randn(128, 8), 32)
    with pytest.raises(ValueError, match="unsupported launch"):
        variants.w4_gemv_rows(torch.randn(2, 128), qw, rows=32)  # 64 rows of w per tile, groups of 32
