"""Triton kernels of the book. On a machine without a CUDA GPU they run in Triton's interpreter
(TRITON_INTERPRET=1, set here before any kernel is defined), which is how CI tests them; there,
use fp16 or fp32 (the interpreter computes bf16 wrongly).

- ``lib.kernels.decode_attention``: paged, GQA-aware, split-KV decode attention (chapter 3).
- ``lib.kernels.stream``: a kernel that only reads, the floor for any kernel reading the same bytes (chapter 3).
- ``lib.kernels.grouped_gemm``: one persistent launch for every expert's GEMM of an MoE layer (chapter 4).
- ``lib.kernels.launch``: the planned launch the kernels share (public path first, then straight to the
  compiled kernel), the SM count, the current stream, the TMA descriptors' memory (chapters 0, 3, 4).

Variants of these kernels kept for tuning sweeps live in ``tools/tuning``; nothing here imports them.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
