"""A kernel that only reads: the fastest any kernel can consume a given set of bytes.

``read_sum(a, b)`` reads two tensors once, in large contiguous pieces, and writes one partial sum per
program (so the loads cannot be dropped). Its time for the bytes of a KV cache is the best that a
decode-attention kernel reading those bytes could do on this machine at this size: the kernel's
arithmetic, its page lookups and its reduction come on top. Chapter 3 sets every path against it.

Chapters: 3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _read_sum_kernel(A, B, OUT, n, n_per, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_per, BLOCK):
        off = base + i + tl.arange(0, BLOCK)
        mask = off < n
        acc += tl.load(A + off, mask=mask, other=0.0).to(tl.float32)
        acc += tl.load(B + off, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))


def read_sum(a: torch.Tensor, b: torch.Tensor, *, programs: int = 1024, block: int = 4096, num_warps: int = 4,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Read ``a`` and ``b`` (contiguous, same number of elements) once; return float32 partial sums, one
    per program, whose total is a.sum() + b.sum(). ``programs`` pieces of ``block``-element steps."""
    if not (a.is_contiguous() and b.is_contiguous()) or a.numel() != b.numel() or a.device != b.device:
        raise ValueError(f"a and b must be contiguous tensors of one size on one device; got {tuple(a.shape)} "
                         f"{a.device}, {tuple(b.shape)} {b.device}")
    if programs < 1 or block < 16 or block & (block - 1):
        raise ValueError(f"programs must be >= 1 and block a power of two >= 16; got {programs}, {block}")
    n = a.numel()
    n_per = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = max(1, triton.cdiv(n, n_per))
    if out is None:
        out = torch.empty(grid, device=a.device, dtype=torch.float32)
    elif out.shape != (grid,) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 of shape ({grid},) for these arguments")
    _read_sum_kernel[(grid,)](a, b, out, n, n_per, BLOCK=block, num_warps=num_warps)
    return out
