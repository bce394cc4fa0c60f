"""One plotting style for the whole book.

Every figure: the same width as the page column and fonts that stay at least 9 pt as shown there
(``glue.figure`` refuses smaller ones), panels stacked one per row, log axes where sizes span decades
with plain tick labels (1, 4, 16, 1k, 4k; 16 MiB), units in the axis labels, and a caption line that says
what was measured, on which device, on which date, and how.

Chapters: all.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.rcParams.update(
    {
        "figure.figsize": (6.6, 4.2),
        "figure.dpi": 110,
        "savefig.dpi": 110,
        "font.size": 10,
        "axes.titlesize": 11,
        "axes.labelsize": 10,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "grid.linestyle": "-",
        "legend.fontsize": 9,
        "xtick.labelsize": 9.5,
        "ytick.labelsize": 9.5,
        "legend.frameon": False,
        "lines.linewidth": 1.6,
        "lines.markersize": 4.5,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)

import matplotlib.pyplot as plt  # noqa: E402  (after the style is set)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from lib.bench.units import UNITS, human_bytes  # noqa: E402, F401  (plots.human_bytes, as the figures name it)

# the width of a figure, in inches: a figure's image is shown at most ``glue.COLUMN_PX`` CSS pixels wide
# (7 inches at 96 pixels per inch), so one drawn a little narrower, with room for what a tight crop
# adds (a legend outside the axes, the caption line), shows its text at least at its own size
WIDTH_IN = 6.6
PANEL_HEIGHT_IN = 2.7


def bytes_axis(ax, which: str = "x") -> None:
    """A log2 axis of byte sizes, labelled in KiB/MiB/GiB."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v)))


def plain_number(v: float, base: int = 10) -> str:
    """A tick label without exponents: 4 -> '4', 4096 -> '4k' (base 2: thousands are 1024), 0.25 -> '0.25'."""
    step = 1024 if base == 2 else 1000
    for scale, suffix in ((step**3, "G"), (step**2, "M"), (step, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def plain_log(ax, which: str = "x") -> None:
    """Label a log axis with plain numbers (1, 2, 5, 10, ... or 1, 4, 16, 64, 1k) instead of 10^3 or 4x10^3.

    Within two decades the 2s and 5s (base 10) or every power (base 2) are labelled, so a short axis
    still carries several labels; minor ticks are never labelled.
    """
    axis = ax.xaxis if which == "x" else ax.yaxis
    base = int(round(getattr(axis.get_transform(), "base", 10)))
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    decades = (math.log10(hi / lo) if lo > 0 and hi > 0 else 3.0)
    subs = (1.0, 2.0, 5.0) if base == 10 and decades <= 2.2 else (1.0,)
    axis.set_major_locator(LogLocator(base=base, subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _: plain_number(v, base)))
    axis.set_minor_formatter(NullFormatter())


def figure(title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False, panels: int = 1,
           ncols: int | None = None, sharex: bool = False):
    """A styled figure; labels must carry units, e.g. 'time per call (us)'.

    ``panels`` (or its old name ``ncols``) stacks that many axes one per row, so that each keeps the
    column's full width; returns one axis, or the list of them.
    """
    for label in (xlabel, ylabel):
        if "(" not in label:
            raise ValueError(f"axis label {label!r} has no unit in parentheses, e.g. 'bandwidth (GB/s)'")
    n = int(ncols if ncols is not None else panels)
    if n < 1:
        raise ValueError(f"a figure needs at least one panel, got {n}")
    height = 4.2 if n == 1 else PANEL_HEIGHT_IN * n + 0.6
    fig, axes = plt.subplots(n, 1, figsize=(WIDTH_IN, height), squeeze=False, sharex=sharex)
    axes = [row[0] for row in axes]
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
    fig.suptitle(title)
    return fig, (axes[0] if n == 1 else axes)


def legend_outside(ax, **kwargs) -> None:
    """A legend to the right of the axes, off the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def caption(result, how: str) -> str:
    """'NVIDIA H200, 2026-11-30, torch 2.11.0: <how>' from a Result's provenance."""
    p = result.provenance
    return f"{p['name']}, {p['date'][:10]}, torch {p['torch']}: {how}"


def finish(fig, result, how: str):
    """Add the caption line under the axes, label every log axis plainly and tidy the layout."""
    plain_axes(fig)
    lines = max(1, len(caption(result, how)) // 95 + 1)
    fig.text(0.01, 0.005, caption(result, how), fontsize=9, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, min(0.2, 0.22 * lines / fig.get_figheight()), 1, 1))
    return fig


def plain_axes(fig) -> None:
    """Give every log axis of ``fig`` plain tick labels, unless it already has its own (bytes_axis)."""
    for ax in fig.axes:
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if axis.get_scale() == "log" and not isinstance(axis.get_major_formatter(), FuncFormatter):
                plain_log(ax, which)
