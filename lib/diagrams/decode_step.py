"""One layer of a decode step, kernel by kernel, drawn from the profiler's list of a measured step.

Chapter 7 explains it. One row per path (the unfused step, the fused one, ...), one box per kernel of one
layer in launch order, all boxes the same width so that the number of launches shows; each box's colour is
its part of the step (``lib.experiments.decode_step.kernel_parts``: the layer's weight GEMMs, attention,
small operators) and it is labelled with its device time in microseconds. A layer is taken as the kernels
from one attention kernel up to the next layer's: a whole period of the step, whatever the path.

Chapter: 7.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from lib.bench import kernel_kinds, plots  # plots: the book's figure style

COLOURS = {"layer weights": "#4C72B0", "attention (K/V)": "#C44E52", "small operators": "#DDAA33"}
FONT = 9  # points, as rendered at the column's width
ATTENTION = "_decode_kernel"


def one_layer(kernels: list[dict], layer: int = 1) -> list[dict]:
    """The kernels of one period of the step: from the ``layer``-th attention kernel (0-based) up to, not
    including, the next one."""
    at = [i for i, k in enumerate(kernels) if k["name"] == ATTENTION]
    if len(at) < layer + 2:
        raise ValueError(f"the step lists {len(at)} attention kernels; layer {layer} needs {layer + 2}")
    return kernels[at[layer]: at[layer + 1]]


def part_of(name: str) -> str:
    """The part of the step a kernel of one layer belongs to, by its name."""
    return {"gemm": "layer weights", "attention": "attention (K/V)", "other": "small operators"}[kernel_kinds.kind(name)]


def figure(paths: dict[str, list[dict]], title: str, layer: int = 1):
    """The strip of one layer's kernels for each path of ``paths`` ({name: profiled kernels of one step})."""
    if not paths:
        raise ValueError("no paths to draw")
    rows = {name: one_layer(ks, layer) for name, ks in paths.items()}
    width = max(len(r) for r in rows.values())
    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 0.75 * len(rows) + 1.4))
    for y, (name, ks) in enumerate(reversed(list(rows.items()))):
        for x, k in enumerate(ks):
            ax.add_patch(Rectangle((x, y + 0.1), 0.92, 0.8, facecolor=COLOURS[part_of(k["name"])], edgecolor="0.2", lw=0.5))
            us = k["us"]
            ax.text(x + 0.46, y + 0.5, f"{us:.0f}" if us >= 9.5 else f"{us:.1f}", ha="center", va="center",
                    fontsize=FONT, rotation=90, color="white" if part_of(k["name"]) != "small operators" else "black")
        ax.text(-0.3, y + 0.5, f"{name}\n{len(ks)} kernels", ha="right", va="center", fontsize=FONT + 1)
    ax.set_xlim(-0.1, width)
    ax.set_ylim(0, len(rows))
    ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="0.2", lw=0.5) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=FONT + 0.5,
              frameon=False)
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig
