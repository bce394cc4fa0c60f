"""What a GPU kernel is, from its name as the profiler lists it: a GEMM (cuBLAS's nvjet, gemv and split-K
reduction kernels, CUTLASS, the book's skinny GEMM and its sum of splits), one of the book's attention
kernels, or something else.

Chapter: 7.
"""

from __future__ import annotations

GEMM_WORDS = ("nvjet", "gemm", "gemv", "splitkreduce", "cutlass", "xmma", "_skinny_kernel", "_sum_splits_kernel")
ATTENTION_WORDS = ("_decode_kernel", "_combine_kernel")


def kind(name: str) -> str:
    """"gemm", "attention" or "other" for a kernel's name."""
    if any(w in name.lower() for w in GEMM_WORDS):
        return "gemm"
    if any(w in name for w in ATTENTION_WORDS):
        return "attention"
    return "other"
