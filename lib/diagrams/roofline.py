"""Chapter 2's diagram: every operator of the chapter placed on this device's roofline by the intensity its
formulas give, before anything is timed.

``operators`` takes chapter 0's ceilings (the dict ``lib.bench.ceilings.from_data`` returns: ``bf16_tflops``,
``read_bw_GBps``, ``copy_bw_GBps``) and the chapter's operator list with its counts
(``lib.experiments.roofline.intensities``: one row per operator and size with ``family``, ``F``, ``Q``,
``I (FLOP/byte)`` and ``rate``). It draws the two roofs ``min(P, BW * I)``, one with the streaming read
rate (work that mostly reads) and one with the copy rate (work that writes as much as it reads), marks
their ridges ``I* = P / BW``, and puts each operator at ``(I, min(P, BW * I))`` under the roof its traffic
uses, one marker shape per operator, its sizes joined by a line. An operator with no arithmetic (the
embedding gather, F = 0) has I = 0 and no place on a log axis: the caption of the figure says so, and the
function lists it in ``fig.book_left_out``.

Chapter: 2 (the roofline).
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from lib.bench import plots

# one marker and colour per operator family; no two share a marker, none is grey
STYLE = {
    "linear": ("o", "C0"),
    "add": ("s", "C1"),
    "rmsnorm": ("D", "C2"),
    "softmax": ("v", "C3"),
    "prefill attention": ("^", "C4"),
    "decode attention": ("P", "C5"),
    "embedding": ("X", "C6"),
}
NEEDS = ("bf16_tflops", "read_bw_GBps", "copy_bw_GBps")
COLUMNS = ("family", "F", "Q", "I (FLOP/byte)", "rate")


def attainable(intensity, p_tflops: float, bw_GBps: float):
    """The roof in TFLOP/s at ``intensity`` (FLOP/byte): ``min(P, BW * I)``, P in TFLOP/s, BW in GB/s."""
    if not (p_tflops > 0 and bw_GBps > 0):
        raise ValueError(f"the roof needs a positive rate and bandwidth, got P={p_tflops} TFLOP/s, BW={bw_GBps} GB/s")
    return np.minimum(p_tflops, bw_GBps * np.asarray(intensity, dtype=float) / 1e3)


def style(family: str) -> tuple[str, str]:
    """(marker, colour) of an operator family."""
    if family not in STYLE:
        raise ValueError(f"no style for operator family {family!r}; known: {sorted(STYLE)}")
    return STYLE[family]


def operators(c: dict, ops, *, device: str):
    """The roofline of ``device`` with each operator of ``ops`` at its intensity (see the module)."""
    bad = [k for k in NEEDS if not (isinstance(c.get(k), Real) and math.isfinite(c[k]) and c[k] > 0)]
    if bad:
        raise ValueError(f"the ceilings lack positive values for {bad}: pass lib.bench.ceilings.load(...)")
    missing = [k for k in COLUMNS if k not in ops.columns]
    if missing:
        raise KeyError(f"the operator table lacks {missing}: pass lib.experiments.roofline.intensities(...)")
    P, rates = c["bf16_tflops"], {"read": c["read_bw_GBps"], "copy": c["copy_bw_GBps"]}
    placed = ops[ops["I (FLOP/byte)"] > 0]
    if placed.empty:
        raise ValueError("no operator has I > 0: nothing to place on a log axis")
    lo = 2.0 ** math.floor(math.log2(placed["I (FLOP/byte)"].min()))
    hi = 2.0 ** math.ceil(math.log2(max(placed["I (FLOP/byte)"].max(), 2 * P * 1e3 / rates["copy"])) + 1)
    fig, ax = plots.figure(f"Where each operator sits on the {device}'s roofline", "arithmetic intensity I (FLOP/byte)",
                           "attainable rate (TFLOP/s)", logx=True, logy=True)
    ax.set_xscale("log", base=2)
    xs = np.geomspace(lo, hi, 400)
    ridges = {}
    for rate, ls in (("read", "-"), ("copy", "--")):
        bw = rates[rate]
        ridges[rate] = P * 1e3 / bw
        ax.plot(xs, attainable(xs, P, bw), ls, color="0.15", lw=1.3, zorder=1, label=f"roof, {rate} rate {bw:.0f} GB/s")
        ax.axvline(ridges[rate], color="0.45", ls=":" if rate == "read" else "-.", lw=1.0, zorder=0)
    ax.annotate(f"ridges I* = P/BW:\n{ridges['read']:.0f} FLOP/byte (read)\n{ridges['copy']:.0f} FLOP/byte (copy)",
                (max(ridges.values()), P / 200), xytext=(6, 0), textcoords="offset points", ha="left", va="center",
                fontsize=9.5, color="0.2")
    for family, g in placed.groupby("family", sort=False):
        label = "linear layers" if family == "linear" else family
        marker, color = style(family)
        g = g.sort_values("I (FLOP/byte)")
        y = [attainable(i, P, rates[r]) for i, r in zip(g["I (FLOP/byte)"], g["rate"])]
        big = family != "linear"  # the many linear points go underneath, smaller, so the operators stay visible
        ax.plot(g["I (FLOP/byte)"], y, "-", color=color, lw=0.8, alpha=0.6, zorder=2)
        ax.plot(g["I (FLOP/byte)"], y, marker, color=color, mec="black", mew=0.5, ms=8 if big else 5,
                zorder=4 if big else 3, label=label, ls="none")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(attainable(placed["I (FLOP/byte)"].min(), P, rates["copy"]) / 2, P / 1e3), P * 2)
    ax.legend(loc="upper left", fontsize=9.5)
    plots.plain_axes(fig)
    fig.tight_layout()
    fig.book_left_out = sorted(set(ops[ops["I (FLOP/byte)"] <= 0]["family"]))
    return fig
