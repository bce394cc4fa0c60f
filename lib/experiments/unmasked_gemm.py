"""Chapter 4, why a grouped GEMM needs its masks: ``unmasked_tile`` is a grouped GEMM as a first attempt
often writes it, one program per output tile and no masks; ``masks_demo`` runs it on buffers padded with
other data and counts the cells it writes past its output and the cells it computes wrongly
(``masks_table`` is the chapter's table of them). It runs compiled on a GPU and in Triton's interpreter on a
CPU (``lib.kernels`` picks), with the same counts. A teaching kernel: nothing else runs it.

Chapter: 4 (grouped GEMM).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from lib.kernels import grouped_gemm as gg

# isort: split
# triton after lib.kernels, which selects Triton's interpreter when torch sees no GPU: triton.language defines
# functions of its own (tl.cumsum) when first imported, compiled or interpreted by that choice
import triton
import triton.language as tl


@triton.jit
def unmasked_tile(X, W, Y, OFFS, K, stride_xm, stride_we, stride_wk, stride_ym,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile (program (e, tm, tn): expert e, row tile tm, column tile tn) with no masks at all:
    its rows run past the expert's tokens, its columns past N, its last step along K past K."""
    e, tm, tn = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row0 = tl.load(OFFS + e)
    if tm * BLOCK_M < tl.load(OFFS + e + 1) - row0:  # tiles past the expert's tokens do nothing
        rows = row0 + tm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(X + rows[:, None] * stride_xm + kk[None, :])
            b = tl.load(W + e * stride_we + kk[:, None] * stride_wk + cols[None, :])
            acc = tl.dot(a, b, acc, input_precision="ieee")  # float32 products, as the interpreter's
        tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc)


SENTINEL = -7.0  # what the output buffer holds where nothing was written


def _demo_device() -> str:
    """Where ``unmasked_tile`` runs: the CPU when lib.kernels chose Triton's interpreter, else the GPU."""
    if isinstance(unmasked_tile, triton.JITFunction):  # compiled: lib.kernels saw a GPU
        return "cuda"
    versions = [tuple(int(v) for v in m.__version__.split(".")[:2]) for m in (np, triton)]
    if versions[1] <= (3, 6) and versions[0] >= (2, 4):
        raise RuntimeError(f"numpy {np.__version__} with triton {triton.__version__}: the unmasked kernel runs in "
                           "Triton's interpreter here (no GPU), which needs numpy < 2.4 with this Triton (newer numpy "
                           "refuses its conversions of one-element arrays). Install numpy<2.4, run the book's pinned "
                           "environment, or run it on a GPU.")
    return "cpu"


def run_unmasked(Ms, K: int, N: int, experts: int | None = None, tile: int = 16, pad: int = 32, seed: int = 0):
    """``unmasked_tile`` over experts of Ms tokens, tiles of ``tile`` cubed: x [T, K] and w [E, K, N] inside
    buffers ``pad`` rows and columns larger holding other data (10 times standard normal values), the output
    inside a [T + pad, N + pad] buffer of ``SENTINEL``; ``experts`` runs only the first few experts' tiles.
    Every read and write of the kernel stays inside these buffers (rows and columns past the views by less
    than a tile). The data is drawn on the CPU and moved to where the kernel runs. Returns (x, w, offsets,
    the output buffer)."""
    device = _demo_device()
    gen = torch.Generator().manual_seed(seed)
    E, T = len(Ms), sum(Ms)
    xbuf = 10 * torch.randn(T + pad, K + pad, generator=gen)
    xbuf[:T, :K] = torch.randn(T, K, generator=gen)
    wbuf = 10 * torch.randn(E + 1, K + pad, N + pad, generator=gen)
    wbuf[:E, :K, :N] = torch.randn(E, K, N, generator=gen)
    xbuf, wbuf = xbuf.to(device), wbuf.to(device)
    x, w = xbuf[:T, :K], wbuf[:E, :K, :N]
    offsets = torch.tensor([0, *torch.tensor(Ms).cumsum(0).tolist()], dtype=torch.int32, device=device)
    ybuf = torch.full((T + pad, N + pad), SENTINEL, device=device)
    grid = (experts or E, max(-(-m // tile) for m in Ms), -(-N // tile))
    unmasked_tile[grid](x, w, ybuf, offsets, K, x.stride(0), w.stride(0), w.stride(1), ybuf.stride(0),
                        BLOCK_M=tile, BLOCK_N=tile, BLOCK_K=tile)
    return x, w, offsets, ybuf


def masks_demo(Ms=(5, 3), N: int = 24, K_whole: int = 32, K_tail: int = 20) -> dict:
    """What the unmasked kernel does: run over the first expert alone with K a tile multiple (``K_whole``),
    the cells it writes past the output [T, N] and into the next expert's rows; run over every expert with
    ``K_tail``, the output cells that differ from a float32 reference (relative and absolute 1e-3)."""
    Ms = list(Ms)
    T = sum(Ms)
    _, _, _, ybuf = run_unmasked(Ms, K_whole, N, experts=1)
    written = ybuf != SENTINEL
    next_cells = int(written[Ms[0]:T, :N].sum())
    written[:T, :N] = False
    outside_cells = int(written.sum())
    x, w, offsets, ybuf = run_unmasked(Ms, K_tail, N)
    y, ref = ybuf[:T, :N], gg.reference(x, w, offsets)
    wrong = int((~torch.isclose(y, ref, rtol=1e-3, atol=1e-3)).sum())
    return {"Ms": Ms, "N": N, "K_whole": K_whole, "K_tail": K_tail, "outside_cells": outside_cells,
            "next_cells": next_cells, "wrong_cells": wrong, "cells": T * N, "device": str(ybuf.device.type)}


def masks_table(m: dict) -> pd.DataFrame:
    """``masks_demo``'s counts as the chapter's table."""
    return pd.DataFrame([
        {"unmasked kernel": f"cells written past the output (first expert alone, K = {m['K_whole']})",
         "cells": m["outside_cells"]},
        {"unmasked kernel": "cells of the second expert's rows written by the first's tile", "cells": m["next_cells"]},
        {"unmasked kernel": f"output cells wrong, K = {m['K_tail']} (reads past K)", "cells": m["wrong_cells"]},
        {"unmasked kernel": "output cells in all", "cells": m["cells"]},
    ]).set_index("unmasked kernel")

