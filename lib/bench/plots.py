"""One plotting style for the whole book.

Every figure: the same size and fonts, log axes where sizes span decades, units in the axis labels,
and a caption line that says what was measured, on which device, on which date, and how.

Chapters: all.
"""

from __future__ import annotations

import matplotlib

matplotlib.rcParams.update(
    {
        "figure.figsize": (7.0, 4.2),
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.labelsize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "grid.linestyle": "-",
        "legend.fontsize": 9,
        "legend.frameon": False,
        "lines.linewidth": 1.6,
        "lines.markersize": 4.5,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)

import matplotlib.pyplot as plt  # noqa: E402  (after the style is set)
from matplotlib.ticker import FuncFormatter  # noqa: E402

UNITS = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")]


def human_bytes(n: float) -> str:
    """1048576 -> '1 MiB', 1610612736 -> '1.5 GiB'."""
    for scale, unit in UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"


def bytes_axis(ax, which: str = "x") -> None:
    """A log2 axis of byte sizes, labelled in KiB/MiB/GiB."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))


def figure(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, ncols: int = 1):
    """A styled figure; labels must carry units, e.g. 'time per call (us)'."""
    for label in (xlabel, ylabel):
        if "(" not in label:
            raise ValueError(f"axis label {label!r} has no unit in parentheses, e.g. 'bandwidth (GB/s)'")
    fig, axes = plt.subplots(1, ncols, figsize=(7.0 if ncols == 1 else 11.0, 4.2), squeeze=False)
    for ax in axes[0]:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
    fig.suptitle(title)
    return fig, (axes[0][0] if ncols == 1 else list(axes[0]))


def caption(result, how: str) -> str:
    """'NVIDIA H200, 2026-11-30, torch 2.11.0: <how>' from a Result's provenance."""
    p = result.provenance
    return f"{p['name']}, {p['date'][:10]}, torch {p['torch']}: {how}"


def finish(fig, result, how: str):
    """Add the caption line under the axes and tidy the layout."""
    fig.text(0.01, 0.005, caption(result, how), fontsize=8, color="0.35", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
