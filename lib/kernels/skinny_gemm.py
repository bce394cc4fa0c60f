"""y = x @ w for the few rows of a decode step: x [M, K] with M at most 64, w [K, N] (chapter 7).

At decode the activation has one row per request, so the product reads the whole matrix w for a few
rows of work: its time is w's bytes over the read rate, and the kernel's only job is to keep enough loads
of w in flight to reach that rate. The kernel splits the work two ways:

- by columns: program (n, s) owns the ``block_n`` columns n * block_n .. and reads w's rows in tiles of
  ``block_k``, loading the matching slice of x (a few hundred bytes) beside each tile; the rows of x are
  padded to 16 or 64 so that each tile is one tensor-core product, which costs nothing that matters here;
- by K (split-K): with ``splits`` > 1, program (n, s) covers only rows s * K/splits .. of w, so that a
  narrow matrix still puts enough programs on the GPU; each writes its float32 partial sums, and a second
  small kernel adds the ``splits`` partials and casts them.

``choose_config(M, N, K, sms)`` picks the tile and the split and ``use_for`` says where the kernel beats
cuBLAS (chapter 7's tuning sweep, ``tools/tuning/skinny_sweep.py``, records why).
Accumulation is in fp32; inputs fp16, bf16 or fp32. In Triton's interpreter (CPU) it runs in fp16 and
fp32: the interpreter computes ``tl.dot`` of bf16 operands wrongly, so bf16 is refused there.

Chapter: 7.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lib.kernels import interpreter, launch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_M = 64


@triton.jit
def _block_product(X, W, M, N, K, pid_n, k_lo, k_hi, stride_xm, stride_wk, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x[:, k_lo:k_hi] @ w[k_lo:k_hi, the columns of block pid_n] in float32, tile by tile of BLOCK_K rows of
    w (x's rows padded to BLOCK_M); returns it with its rows, columns and their masks."""
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = rm < M
    nmask = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(W + rk[:, None] * stride_wk + rn[None, :], mask=kmask[:, None] & nmask[None, :], other=0.0)
        acc += tl.dot(x, w)
    return acc, rm, rn, mmask, nmask


@triton.jit
def _skinny_kernel(X, W, P, M, N, K, K_SPLIT, stride_xm, stride_wk, stride_ps, stride_pm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    k_lo = pid_s * K_SPLIT
    acc, rm, rn, mmask, nmask = _block_product(X, W, M, N, K, pid_n, k_lo, k_lo + K_SPLIT, stride_xm, stride_wk,
                                               BLOCK_M, BLOCK_N, BLOCK_K)
    out = P + pid_s * stride_ps + rm[:, None] * stride_pm + rn[None, :]
    tl.store(out, acc.to(P.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _sum_splits_kernel(P, Y, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLITS):
        acc += tl.load(P + s * MN + offs, mask=mask, other=0.0)
    tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _skinny_argmax_kernel(X, W, VAL, IDX, M, N, K, stride_xm, stride_wk, BLOCKS,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The products of one block of columns, as ``_skinny_kernel`` computes them (whole K), rounded to w's
    dtype as stored logits are; then, per row, their largest value and its column (the first on a tie)."""
    pid_n = tl.program_id(0)
    acc, rm, rn, mmask, nmask = _block_product(X, W, M, N, K, pid_n, 0, K, stride_xm, stride_wk, BLOCK_M, BLOCK_N,
                                               BLOCK_K)
    acc = acc.to(W.dtype.element_ty).to(tl.float32)
    acc = tl.where(nmask[None, :], acc, float("-inf"))
    best, at = tl.max(acc, axis=1, return_indices=True, return_indices_tie_break_left=True)
    tl.store(VAL + rm * BLOCKS + pid_n, best, mask=mmask)
    tl.store(IDX + rm * BLOCKS + pid_n, pid_n * BLOCK_N + at, mask=mmask)


@triton.jit
def _argmax_blocks_kernel(VAL, IDX, OUT, BLOCKS, BLOCK: tl.constexpr):
    """Per row, the largest of the blocks' maxima and its column (the first block on a tie)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < BLOCKS
    v = tl.load(VAL + row * BLOCKS + offs, mask=mask, other=float("-inf"))
    _, at = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(OUT + row, tl.load(IDX + row * BLOCKS + at))


INTERPRETED = interpreter.interpreted(_skinny_kernel)  # no GPU: see lib.kernels.interpreter


def _check_operands(x, w) -> None:
    """x [M, K] and w [K, N]: 2-D, fp16, bf16 or fp32 (not bf16 in the interpreter), contiguous in their last
    dimension, one K, dtype and device."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be fp16, bf16 or fp32, got {t.dtype}")
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}: pass "
                             f"{name}.contiguous()")
    if w.shape[0] != x.shape[1] or w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and w {tuple(w.shape)} {w.dtype} must share K, dtype and device")
    interpreter.refuse_bf16(INTERPRETED, x.dtype, "x and w are")


def _power_of_two(name: str, value, least: int, why: str) -> int:
    """``value`` if it is an integer power of two of at least ``least``; otherwise a ValueError naming it."""
    if not launch.whole(value) or value < least or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {least} ({why}), got {value!r}")
    return value


def choose_config(M: int, N: int, K: int, sms: int) -> dict:
    """The launch for x [M, K] @ w [K, N] on a GPU of ``sms`` SMs: tiles of 64 rows of w (``block_k``),
    columns in blocks of 128 for wide matrices (N >= 16384) and of 64 otherwise, and the fewest splits of K
    (powers of two, slices of at least four tiles) that launch 1.5 programs per SM; four warps, a pipeline of
    four stages. On the H200 this takes at most 1.03 times the best launch of a sweep of 120 at Llama-3-8B's
    five products at 1 row, and 1.05 times at 64 rows where the kernel is used (``use_for``)."""
    block_n = 128 if N >= 16384 else 64
    block_k = 64
    col_blocks = triton.cdiv(N, block_n)
    splits = 1
    while col_blocks * splits < 1.5 * sms and K % (2 * splits) == 0 and K // (2 * splits) >= 4 * block_k \
            and (K // (2 * splits)) % block_k == 0:
        splits *= 2
    return {"block_m": 16 if M <= 16 else 64, "block_n": block_n, "block_k": block_k, "splits": splits,
            "num_warps": 4, "num_stages": 4}


def use_for(M: int, N: int, K: int) -> bool:
    """Whether to use this kernel rather than cuBLAS for x [M, K] @ w [K, N] (chapter 7's sweep on the H200):
    at up to 16 rows it matched or beat cuBLAS at every product (the QKV product within 1%); at up to 64
    rows only the large matrices (N >= 16384 or K >= 8192) gained; never beyond 64 rows."""
    return M <= 16 or (M <= MAX_M and (N >= 16384 or K >= 8192))


def skinny_mm(x: torch.Tensor, w: torch.Tensor, *, out: torch.Tensor | None = None, block_n: int | None = None,
              block_k: int | None = None, splits: int | None = None, num_warps: int | None = None,
              num_stages: int | None = None, reduce: bool = True) -> torch.Tensor:
    """x [M, K] @ w [K, N] for M <= 64 (both contiguous in their last dimension, one dtype, one device):
    [M, N] in x's dtype. Launch parameters left as None come from ``choose_config``; given ones are checked,
    not replaced: ``block_n`` and ``block_k`` powers of two >= 16 (tl.dot's smallest), ``splits`` a whole
    number >= 1 that cuts K into slices of whole tiles, ``num_warps`` a power of two, ``num_stages`` >= 1.
    ``out``: a contiguous [M, N] tensor of x's dtype on x's device that shares no memory with x or w. With
    ``reduce=False`` a split launch returns its float32 partial sums [splits, M, N] unreduced, for a next
    kernel that adds them as it loads them (``lib.kernels.fused``); a launch without a split returns [M, N]
    as always."""
    _check_operands(x, w)
    M, K = x.shape
    if not 1 <= M <= MAX_M:
        raise ValueError(f"skinny_mm takes 1 to {MAX_M} rows, got {M}: use torch.mm for more")
    N = w.shape[1]
    cfg = choose_config(M, N, K, launch.sm_count(x.device))
    block_n = cfg["block_n"] if block_n is None else _power_of_two("block_n", block_n, 16, "the smallest tl.dot")
    block_k = cfg["block_k"] if block_k is None else _power_of_two("block_k", block_k, 16, "the smallest tl.dot")
    if splits is None:
        splits = cfg["splits"]
    elif not launch.whole(splits) or splits < 1:
        raise ValueError(f"splits must be a whole number >= 1 (the slices of K, each a program's; None: "
                         f"choose_config's), got {splits!r}")
    num_warps = cfg["num_warps"] if num_warps is None else _power_of_two("num_warps", num_warps, 1,
                                                                          "Triton's warps per program")
    if num_stages is None:
        num_stages = cfg["num_stages"]
    elif not launch.whole(num_stages) or num_stages < 1:
        raise ValueError(f"num_stages must be a whole number >= 1 (the software pipeline's depth), got {num_stages!r}")
    if K % splits or (K // splits) % block_k and splits > 1:
        raise ValueError(f"splits={splits} must cut K={K} into slices that are whole tiles of {block_k}")
    k_split = K // splits if splits > 1 else triton.cdiv(K, block_k) * block_k
    if out is None:
        out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    else:
        launch.tensors(out=(out, f"[{M}, {N}] {x.dtype}"))
        if out.shape != (M, N) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous [{M}, {N}] tensor of {x.dtype} on {x.device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device} with strides {out.stride()}")
        launch.overlap(out, dict(x=x, w=w))
    part = out if splits == 1 else torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, block_n), splits)
    _skinny_kernel[grid](x, w, part, M, N, K, k_split, x.stride(0), w.stride(0), M * N if splits > 1 else 0, N,
                         BLOCK_M=cfg["block_m"], BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                         num_stages=num_stages)
    if splits > 1 and not reduce:
        return part
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](part, out, M * N, SPLITS=splits, BLOCK=1024)
    return out


def skinny_argmax(x: torch.Tensor, w: torch.Tensor, *, block_n: int = 128, block_k: int = 64) -> torch.Tensor:
    """Greedy sampling fused into the output head: the column of the largest value of each row of x @ w
    ([M] int64), the products rounded to w's dtype first, as logits stored in it would be, and the first
    column on a tie, as ``torch.argmax`` picks. The logits are never written: each block of columns keeps
    its rows' maxima, and a second small kernel picks among the blocks. x [M, K] with M <= 64, w [K, N] with
    N >= 1; ``block_n`` and ``block_k`` powers of two >= 16."""
    _check_operands(x, w)
    M, K = x.shape
    N = w.shape[1]
    if not 1 <= M <= MAX_M or N < 1:
        raise ValueError(f"need x [M, K] with 1 <= M <= {MAX_M} and w [K, N] with N >= 1 (a column to pick), got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    _power_of_two("block_n", block_n, 16, "the smallest tl.dot")
    _power_of_two("block_k", block_k, 16, "the smallest tl.dot")
    blocks = triton.cdiv(N, block_n)
    val = torch.empty(M, blocks, device=x.device, dtype=torch.float32)
    idx = torch.empty(M, blocks, device=x.device, dtype=torch.int64)
    out = torch.empty(M, device=x.device, dtype=torch.int64)
    _skinny_argmax_kernel[(blocks,)](x, w, val, idx, M, N, K, x.stride(0), w.stride(0), blocks,
                                     BLOCK_M=16 if M <= 16 else 64, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
                                     num_stages=4)
    _argmax_blocks_kernel[(M,)](val, idx, out, blocks, BLOCK=triton.next_power_of_2(blocks))
    return out
