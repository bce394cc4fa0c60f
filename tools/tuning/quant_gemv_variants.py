"""A variant of the book's int4 GEMV for the tuning sweeps: ``w4_gemv_rows``, several rows of x per program.

``lib.kernels.quant_gemm.w4_gemv`` gives each row of x its own programs, so M rows read the weights M times
(from the L2 after the first, when their programs run close together). Here a program multiplies
``block_m`` rows by its tile of weights: each word is loaded and converted once, and only the fused
multiply-adds repeat per row. Built from the book's pieces (``_denormal``, ``_w4_pair``); the accumulators
are [block_m, rows, columns] tiles, so ``rows`` must shrink as ``block_m`` grows to fit the registers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lib.kernels import quant_gemm as qg  # noqa: E402
from lib.kernels.skinny_gemm import _sum_splits_kernel  # noqa: E402


@triton.jit
def _w4_gemv_rows_kernel(X, Q, S, P, M, N4, K_SPLIT, stride_xm, stride_qk, stride_sg, stride_ps, stride_pm,
                         BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, ROWS: tl.constexpr, GROUP: tl.constexpr):
    """Rows [BLOCK_M program_id(2), + BLOCK_M) of x times 4 * BLOCK_W columns of w over slice program_id(1)
    of K: ``quant_gemm._w4_gemv_kernel``'s arithmetic with a leading axis of rows of x."""
    rm = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = rm < M
    rw = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    wmask = rw < N4
    k_lo = tl.program_id(1) * K_SPLIT
    xrows = X + rm[:, None, None] * stride_xm
    acc0 = tl.zeros((BLOCK_M, ROWS, BLOCK_W), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, ROWS, BLOCK_W), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, ROWS, BLOCK_W), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, ROWS, BLOCK_W), dtype=tl.float32)
    for k in range(k_lo, k_lo + K_SPLIT, 2 * ROWS):
        rb = k // 2 + tl.arange(0, ROWS)
        w = tl.load(Q + rb[:, None] * stride_qk + rw[None, :], mask=wmask[None, :], other=0) ^ -0x77777778
        w2 = w >> 16
        kk = k + 2 * tl.arange(0, ROWS)[None, :, None]
        xe = tl.load(xrows + kk, mask=mmask[:, None, None], other=0.0).to(tl.float32)
        xo = tl.load(xrows + kk + 1, mask=mmask[:, None, None], other=0.0).to(tl.float32)
        c = (xe + xo) * 4.336808689942018e-19  # 8 * 2^-64
        xe0, xo0 = xe * 3.8685626227668134e+25, xo * 2.4178516392292583e+24  # 2^85, 2^81
        xe1, xo1 = xe * 1.5111572745182865e+23, xo * 9.44473296573929e+21  # 2^77, 2^73
        srow = S + (k // GROUP) * stride_sg + 4 * rw[None, None, :]
        acc0 = qg._w4_pair(qg._denormal(w, 0xF)[None, :, :], qg._denormal(w, 0xF0)[None, :, :], xe0, xo0, c,
                           tl.load(srow, mask=wmask[None, None, :], other=0.0), acc0)
        acc1 = qg._w4_pair(qg._denormal(w, 0xF00)[None, :, :], qg._denormal(w, 0xF000)[None, :, :], xe1, xo1, c,
                           tl.load(srow + 1, mask=wmask[None, None, :], other=0.0), acc1)
        acc2 = qg._w4_pair(qg._denormal(w2, 0xF)[None, :, :], qg._denormal(w2, 0xF0)[None, :, :], xe0, xo0, c,
                           tl.load(srow + 2, mask=wmask[None, None, :], other=0.0), acc2)
        acc3 = qg._w4_pair(qg._denormal(w2, 0xF00)[None, :, :], qg._denormal(w2, 0xF000)[None, :, :], xe1, xo1, c,
                           tl.load(srow + 3, mask=wmask[None, None, :], other=0.0), acc3)
    out = P + tl.program_id(1) * stride_ps + rm[:, None] * stride_pm + 4 * rw[None, :]
    omask = mmask[:, None] & wmask[None, :]
    ty = P.dtype.element_ty
    tl.store(out, (tl.sum(acc0, axis=1) * 18446744073709551616.0).to(ty), mask=omask)  # 2^64
    tl.store(out + 1, (tl.sum(acc1, axis=1) * 18446744073709551616.0).to(ty), mask=omask)
    tl.store(out + 2, (tl.sum(acc2, axis=1) * 18446744073709551616.0).to(ty), mask=omask)
    tl.store(out + 3, (tl.sum(acc3, axis=1) * 18446744073709551616.0).to(ty), mask=omask)


def w4_gemv_rows(x: torch.Tensor, w: qg.Int4Weight, *, block_m: int = 4, rows: int = 16, block_n: int = 128,
                 splits: int = 1, num_warps: int = 4, num_stages: int = 1) -> torch.Tensor:
    """x [M, K] @ the int4 weights, ``block_m`` rows of x per program (see the module): [M, N] in x's dtype."""
    M, K = x.shape
    N, group = w.packed.shape[1], w.group
    if K != w.K or N % 4 or block_n % 4 or group % (2 * rows) or K % (splits * 2 * rows):
        raise ValueError(f"unsupported launch: K={K} (w: {w.K}), N={N}, block_n={block_n}, rows={rows}, "
                         f"group={group}, splits={splits}")
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = out if splits == 1 else torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, block_n), splits, triton.cdiv(M, block_m))
    _w4_gemv_rows_kernel[grid](x, w.packed.view(torch.int32), w.scale, part, M, N // 4, K // splits, x.stride(0),
                               N // 4, w.scale.stride(0), M * N if splits > 1 else 0, N, BLOCK_M=block_m,
                               BLOCK_W=block_n // 4, ROWS=rows, GROUP=group, num_warps=num_warps,
                               num_stages=num_stages)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](part, out, M * N, SPLITS=splits, BLOCK=1024)
    return out
