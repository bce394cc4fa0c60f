"""Chapter 0's diagrams: the memory hierarchy with the device's measured numbers, and the roofline's two ceilings.

Both take the ceilings as ``lib.bench.ceilings.from_data`` returns them (a dict with ``read_bw_GBps``,
``copy_bw_GBps``, ``bf16_tflops``, ``launch_eager_us``, ``launch_graph_us`` and ``l2_bytes``), so every
number they draw is the number the book measured; nothing is typed in.

- ``hierarchy``: the path a byte takes, from HBM through the L2 to the SMs, with the host that launches
  the kernels above them. Each level is a box labelled with its size and the rate measured at it: HBM's
  capacity with the streaming read and copy rates (footprints of at least four times the L2), the L2's
  size with the best hot copy whose working set fits in it, the SMs' count with the dense bf16 rate,
  and the host's cost of one launch, eager and inside a CUDA graph.
- ``roofline``: the time bound of chapter 0 drawn as a rate. An operation of intensity $I = F/Q$
  (FLOP per byte of HBM traffic) cannot run faster than ``min(P, BW * I)`` (``roof``), with $P$ the
  bf16 rate and $BW$ the bandwidth of the traffic it does: the read rate for read-dominated work, the
  copy rate for work that writes as much as it reads. The two roofs bend at their ridges
  $I^\\ast = P / BW$ (``ridge``), which the figure marks.

Chapter: 0 (the machine); chapters 1 and 2 place operators under the same roofline.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from lib.bench import plots

NEEDS = ("read_bw_GBps", "copy_bw_GBps", "bf16_tflops", "launch_eager_us", "launch_graph_us", "l2_bytes")
TEXT_PT = 10  # the smallest text these diagrams draw, in points


def _check(c: dict, needs=NEEDS) -> None:
    absent = [k for k in needs if k not in c]
    if absent:
        raise KeyError(f"the ceilings lack {absent}: pass the dict lib.bench.ceilings.from_data (or .load) returns")
    bad = [k for k in needs if not (isinstance(c[k], Real) and math.isfinite(c[k]) and c[k] > 0)]
    if bad:
        raise ValueError(
            f"ceilings {bad} must be positive finite numbers, got {[c[k] for k in bad]}: pass the ceilings of a "
            "results set that measured them (a CPU run has no L2 to take a bandwidth ceiling from)"
        )


def ridge(p_tflops: float, bw_GBps: float) -> float:
    """The ridge $I^\\ast = P / BW$ in FLOP per byte: TFLOP/s over GB/s, times 1000."""
    if not (p_tflops > 0 and bw_GBps > 0):
        raise ValueError(f"the ridge needs a positive rate and bandwidth, got P={p_tflops} TFLOP/s, BW={bw_GBps} GB/s")
    return p_tflops * 1e3 / bw_GBps


def roof(intensity, p_tflops: float, bw_GBps: float):
    """The attainable rate in TFLOP/s at intensity ``intensity`` (FLOP/byte): ``min(P, BW * I)``."""
    ridge(p_tflops, bw_GBps)  # checks the arguments
    return np.minimum(p_tflops, bw_GBps * np.asarray(intensity, dtype=float) / 1e3)


def _box(ax, x, y, w, h, title, lines, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01,rounding_size=0.02", fc=color, ec="0.25", lw=1.2))
    ax.text(x + 0.02, y + h / 2, title, ha="left", va="center", fontsize=TEXT_PT + 1, weight="bold")
    ax.text(x + 0.25, y + h / 2, "\n".join(lines), ha="left", va="center", fontsize=TEXT_PT, linespacing=1.35)


def _arrow(ax, x, y0, y1, label):
    ax.add_patch(FancyArrowPatch((x, y0), (x, y1), arrowstyle="<|-|>", mutation_scale=12, lw=1.4, color="0.2"))
    ax.text(x + 0.02, (y0 + y1) / 2, label, ha="left", va="center", fontsize=TEXT_PT, color="0.15")


def hierarchy(c: dict, *, sms: int, memory_bytes: int, l2_hot_GBps: float, device: str):
    """The memory hierarchy of ``device`` as boxes, each with its size and measured rate (see the module).

    ``sms`` and ``memory_bytes`` come from the results' provenance; ``l2_hot_GBps`` is the best hot copy
    whose footprint is at most half the L2. A device without an L2 in its data (a CPU run) gets an L2 box
    that says so.
    """
    _check(c, tuple(k for k in NEEDS if k != "l2_bytes"))
    for name, v in (("sms", sms), ("memory_bytes", memory_bytes)):
        if not (isinstance(v, Real) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}: take it from the results' provenance")
    has_l2 = c.get("l2_bytes", 0) > 0  # a CPU run has no L2 to measure
    if has_l2 and not (isinstance(l2_hot_GBps, Real) and math.isfinite(l2_hot_GBps) and l2_hot_GBps > 0):
        raise ValueError(f"l2_hot_GBps must be a positive number when the device has an L2, got {l2_hot_GBps!r}: "
                         "take it from chapter 0's findings (the best hot copy within half the L2)")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 5.0))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    h = 0.14
    ys = {"host": 0.83, "sm": 0.55, "l2": 0.31, "hbm": 0.07}
    _box(ax, 0.02, ys["host"], 0.96, h, "Host (CPU)", [
        "launches every kernel",
        f"{c['launch_eager_us']:.1f} us a launch eagerly, {c['launch_graph_us']:.2f} us in a CUDA graph",
    ], "#f2f2f2")
    _box(ax, 0.02, ys["sm"], 0.96, h, f"{sms} SMs", [
        "tensor cores: where the FLOPs happen",
        f"dense bf16: {c['bf16_tflops']:.0f} TFLOP/s (best product measured)",
    ], "#dbe9f6")
    if has_l2:
        _box(ax, 0.02, ys["l2"], 0.96, h, f"L2 {plots.human_bytes(c['l2_bytes'])}", [
            "shared by all SMs; holds a working set",
            "of up to about half its size",
            f"hot copies: up to {l2_hot_GBps:.0f} GB/s",
        ], "#e3f1df")
    else:
        _box(ax, 0.02, ys["l2"], 0.96, h, "L2", ["not measured on this device"], "#e3f1df")
    _box(ax, 0.02, ys["hbm"], 0.96, h, f"HBM {plots.human_bytes(memory_bytes)}", [
        "weights, KV cache, activations",
        f"read {c['read_bw_GBps']:.0f} GB/s, copy {c['copy_bw_GBps']:.0f} GB/s",
    ], "#fbe5d6")
    _arrow(ax, 0.5, ys["host"], ys["sm"] + h, "launch")
    _arrow(ax, 0.5, ys["sm"], ys["l2"] + h, "every byte the SMs touch passes the L2")
    _arrow(ax, 0.5, ys["l2"], ys["hbm"] + h, "misses go to HBM")
    fig.suptitle(f"The memory hierarchy of the {device}, with its measured rates")
    fig.tight_layout()
    return fig


def roofline(c: dict, *, device: str, sheet: dict | None = None, intensity=(1, 4096)):
    """The bf16 roofline against the read rate and against the copy rate, ridges marked (see the module).

    ``sheet``: the datasheet's ``bf16_tflops`` and ``hbm_GBps``, drawn dotted when given.
    """
    _check(c, ("read_bw_GBps", "copy_bw_GBps", "bf16_tflops"))
    lo, hi = intensity
    if not (0 < lo < hi):
        raise ValueError(f"intensity range {intensity!r} must be (low, high) with 0 < low < high, in FLOP/byte")
    fig, ax = plots.figure(f"The bf16 roofline of the {device}", "arithmetic intensity I (FLOP/byte)",
                           "attainable rate (TFLOP/s)", logx=True, logy=True)
    xs = np.geomspace(lo, hi, 400)
    P = c["bf16_tflops"]
    for bw, label, style in ((c["read_bw_GBps"], "read", "-"), (c["copy_bw_GBps"], "copy", "--")):
        r = ridge(P, bw)
        ax.plot(xs, roof(xs, P, bw), style, color="C0" if label == "read" else "C1", zorder=3,
                label=f"min(P, BW·I), {label} {bw:.0f} GB/s")
        ax.axvline(r, color="C0" if label == "read" else "C1", ls=":", lw=1.0)
        ax.annotate(f"ridge ({label})\n{r:.0f} FLOP/byte", (r, P * (0.05 if label == "read" else 0.012)),
                    xytext=(6 if label == "read" else -6, 0), textcoords="offset points",
                    ha="left" if label == "read" else "right", fontsize=TEXT_PT)
    if sheet:
        ax.plot(xs, roof(xs, sheet["bf16_tflops"], sheet["hbm_GBps"]), ":", color="0.45", zorder=2,
                label=f"datasheet: {sheet['bf16_tflops']:.0f} TFLOP/s, {sheet['hbm_GBps']:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo, hi)
    plots.plain_log(ax, "x")  # 1, 4, 16, ..., 1k, 4k: no 4x10^3, no labelled minor ticks
    plots.plain_log(ax, "y")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig
