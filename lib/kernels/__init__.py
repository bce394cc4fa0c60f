"""Triton kernels of the book. On a machine without a CUDA GPU they run in Triton's interpreter
(TRITON_INTERPRET=1, set here before any kernel is defined), which is how CI tests them; there, the kernels
that multiply with ``tl.dot`` refuse bf16, which the interpreter computes wrongly (``interpreter``).

- ``lib.kernels.decode_attention``: paged, GQA-aware, split-KV decode attention (chapter 3).
- ``lib.kernels.stream``: a kernel that only reads, the floor for any kernel reading the same bytes (chapter 3).
- ``lib.kernels.grouped_gemm``: one persistent launch for every expert's GEMM of an MoE layer (chapter 4).
- ``lib.kernels.fused``: a decode step's small operators fused: RMSNorm with the residual, rotary embedding
  with the KV-cache write (``rope_write``, masked so that no slot outside the cache is written), SiLU-and-multiply
  (chapter 7).
- ``lib.kernels.skinny_gemm``: products of a few rows by a weight, split along K, and the greedy head's
  product with its argmax (chapter 7).
- ``lib.kernels.sampling``: top-p sampling without a sort (chapter 7).
- ``lib.kernels.quant_gemm``: int8 and int4 weight-only products, the GEMVs and the tensor-core paths (chapter 9).
- ``lib.kernels.decode_attention_fp8``: decode attention over an e4m3 KV cache (chapter 9).
- ``lib.kernels.launch``: the planned launch the kernels share (public path first, then straight to the
  compiled kernel), the SM count, the current stream, the TMA descriptors' memory (chapters 0, 3, 4).
- ``lib.kernels.interpreter``: whether a kernel runs in the interpreter, and the bf16 refusal there.

Variants of these kernels kept for tuning sweeps live in ``tools/tuning``; nothing here imports them.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
