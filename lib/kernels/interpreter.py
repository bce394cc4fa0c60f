"""Triton's interpreter (TRITON_INTERPRET=1): how the book's kernels run without a GPU, and the one thing it
computes wrongly.

The interpreter runs each program of a kernel in numpy. It holds bfloat16 values as raw 16-bit integers, so
``tl.dot`` of bfloat16 operands gives garbage (relative errors near 1e9), while elementwise bfloat16
arithmetic, converted to float32 first, is right to one bfloat16 rounding. The kernels that multiply with
``tl.dot`` (decode attention, the grouped GEMM, the skinny GEMM, the quantized tensor-core GEMMs) refuse
bfloat16 there; float16 and float32 run right.

Chapters: 3, 4, 7 and 9 (the CPU tier of their kernels' tests).
"""

from __future__ import annotations

import torch
import triton


def interpreted(kernel) -> bool:
    """Whether ``kernel`` (a ``@triton.jit`` function) was defined for the interpreter: no GPU."""
    return not isinstance(kernel, triton.JITFunction)


def refuse_bf16(interpreted: bool, dtype: torch.dtype, operands: str) -> None:
    """A TypeError for bfloat16 ``operands`` ("x and w are") of a ``tl.dot`` kernel run in the interpreter."""
    if dtype == torch.bfloat16 and interpreted:
        raise TypeError(f"{operands} bfloat16, but the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, no "
                        "GPU), which computes tl.dot of bfloat16 operands wrongly (relative errors near 1e9): pass "
                        "float16 or float32 tensors on the CPU (.to(torch.float16)), or run on a GPU")
