"""How an int4 weight matrix is stored, drawn from the book's own quantized weights.

Chapter 9 explains it. Three panels, left to right, for one ``lib.kernels.quant_gemm.Int4Weight``:

1. The integers q [K, N] the quantizer chose (``Int4Weight.values``), each cell shaded by its group of
   ``group`` rows along K: a column's rows in one group share one scale.
2. The bytes as stored (``Int4Weight.packed``, [K / 2, N]): byte row i holds row 2i of w in its low four
   bits and row 2i + 1 in its high four, both in two's complement, printed in hexadecimal.
3. The scales [K / group, N] (``Int4Weight.scale``), one per group and column.

A weight costs half a byte plus its share of a scale: the line under the panels counts the object's own
bytes. Nothing is typed in: quantize other weights and the figure follows (``example`` makes a small one,
with a group of 4 rows so that two groups fit on the page; the book's kernels take groups of 32 to 256).

Chapters: 9.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

from lib import quant
from lib.bench import plots  # the book's figure style

FONT = 10  # points, as rendered at the column's width
SHADES = ("#DCE6F2", "#F6E0C8")  # alternate groups
MAX_CELLS = 16  # rows or columns a panel can print legibly


def _grid(ax, x0: float, cells, shade, title: str, *, ncols: int, cell_h: float = 1.0) -> None:
    """Cells [rows][cols] of text at x0, each shaded by ``shade(row)``, with a title above."""
    for r, row in enumerate(cells):
        for c, text in enumerate(row):
            y = -(r + 1) * cell_h
            ax.add_patch(Rectangle((x0 + c, y), 1, cell_h, facecolor=shade(r), edgecolor="0.35", lw=0.6))
            ax.text(x0 + c + 0.5, y + cell_h / 2, text, ha="center", va="center", fontsize=FONT, family="monospace")
    ax.text(x0 + ncols / 2, 0.5, title, ha="center", va="bottom", fontsize=FONT + 1)


def example(K: int = 8, N: int = 3, group: int = 4, seed: int = 0) -> quant.Int4Weight:
    """A small int4 weight to draw: random weights quantized in groups of ``group`` rows, as
    ``lib.quant.quantize_int4`` does (absmax / 7 per group, round to nearest, packed two per byte)."""
    if K % group or K % 2:
        raise ValueError(f"K = {K} must be even and a multiple of the group ({group})")
    w = torch.randn(K, N, generator=torch.Generator().manual_seed(seed))
    s = (w.reshape(K // group, group, N).abs().amax(1) / 7).clamp(min=1e-12)
    q = torch.round(w / s.repeat_interleave(group, 0)).clamp(-7, 7).to(torch.int8)
    return quant.Int4Weight(quant.pack_int4(q), s, group)


def storage_figure(w: quant.Int4Weight, title: str):
    """The three panels of the module for ``w`` (at most ``MAX_CELLS`` rows and columns of w)."""
    if not isinstance(w, quant.Int4Weight):
        raise TypeError(f"w must be an Int4Weight (lib.quant.quantize_int4), got {type(w).__name__}")
    q = w.values()
    K, N = q.shape
    if K > MAX_CELLS or N > MAX_CELLS:
        raise ValueError(f"a {K} x {N} weight is too large to print: quantize at most {MAX_CELLS} x {MAX_CELLS}")
    g = w.group
    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 0.32 * K + 1.3))
    _grid(ax, 0, [[f"{int(v):d}" for v in row] for row in q], lambda r: SHADES[(r // g) % 2],
          f"q [{K} x {N}], groups of {g}", ncols=N)
    x1 = N + 1.5
    _grid(ax, x1, [[f"{int(b):02X}" for b in row] for row in w.packed], lambda r: SHADES[(2 * r // g) % 2],
          f"bytes [{K // 2} x {N}]", ncols=N, cell_h=2.0)
    x2 = x1 + N + 1.5
    _grid(ax, x2, [[f"{float(s):.3f}" for s in row] for row in w.scale], lambda r: SHADES[r % 2],
          f"scales [{K // g} x {N}]", ncols=N, cell_h=float(g))
    # the scales' cells print three decimals: give them room by widening the panel's unit cells
    ax.set_xlim(-0.2, x2 + N + 0.2)
    ax.set_ylim(-K - 0.2, 1.6)
    ax.set_aspect("auto")
    ax.axis("off")
    nbytes = w.packed.numel() * w.packed.element_size() + w.scale.numel() * w.scale.element_size()
    bpw = nbytes / (K * N)
    ax.text(0, -K - 0.1, f"{nbytes} bytes for {K * N} weights: {bpw:.4f} a weight ({2 / bpw:.2f} times fewer than "
            f"bf16's 2);\nin groups of 128, {quant.bytes_per_weight('int4', 128):.4f} "
            f"({quant.speedup_bound('int4', 128):.2f} times fewer)", ha="left", va="top", fontsize=FONT)
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
