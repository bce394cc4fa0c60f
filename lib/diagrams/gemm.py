"""Chapter 1's figures drawn from the model's own layer shapes and the chapter's measured step times.

- ``gemm``: one linear layer $Y = XW$, $X$ $[M, K]$, $W$ $[K, N]$, drawn to scale for a few $M$ in the
  classic layout ($X$ left of $Y$, $W$ above it), each matrix labelled with its bytes and the product
  with its intensity $I = F/Q$ (``lib.costs``); below, the bytes a block of the model's linear layers
  moves as $M$ grows: the weights $b \\sum KN$, the same at every $M$, against the activations
  $b \\sum (MK + MN)$, which grow with $M$ and overtake the weights at $M = \\sum KN / \\sum (K + N)$
  (``crossover_M``). The ridge $M \\approx bP/(2\\,BW)$ is marked where it is given: it comes long
  before the crossover, which is why $I \\approx 2M/b$ holds up to it.
- ``step_and_cost``: the linear layers of a decode step of $B$ requests (its time, TPOT's share from
  them) above their time per token, over $B$, from ``lib.experiments.matrix_shapes.decode_steps``;
  the floor (the weights' read at the read rate), the measured knee and the predicted ridge are marked.

Every size is read from the shapes the chapter measures (``lib.costs.LLAMA3_8B``); nothing is typed in.

Chapter: 1 (matrix shapes).
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Rectangle
from matplotlib.ticker import LogLocator

from lib import costs
from lib.bench import plots
from lib.models.config import crossover_M

TEXT_PT = 9.5  # the smallest text these figures draw, in points
COLORS = {"X": "C0", "W": "C1", "Y": "C2"}


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return int(v)


def block_bytes(shapes: dict, M, b: int = 2) -> tuple[float, np.ndarray]:
    """(weight bytes, activation bytes at each M) of a set of linear layers: b sum KN and b sum (MK + MN)."""
    crossover_M(shapes)  # checks the shapes
    M = np.asarray(M, dtype=float)
    return float(b * sum(K * N for K, N in shapes.values())), b * M * sum(K + N for K, N in shapes.values())


def _label(ax, x, y, text, **kw):
    ax.text(x, y, text, fontsize=TEXT_PT, **kw)


def _draw_one(ax, K: int, N: int, M: int, b: int, gap: float, extent: float, title: str) -> dict:
    """Draw X, W and Y to scale on ``ax``; return the rectangles by name (tests read their sizes)."""
    # Y at the origin, growing downwards by M; W above Y; X to the left of Y
    rects = {
        "W": Rectangle((0, gap), N, K, facecolor=COLORS["W"], alpha=0.35, edgecolor=COLORS["W"], lw=1.2),
        "X": Rectangle((-gap - K, -M), K, M, facecolor=COLORS["X"], alpha=0.5, edgecolor=COLORS["X"], lw=1.2),
        "Y": Rectangle((0, -M), N, M, facecolor=COLORS["Y"], alpha=0.5, edgecolor=COLORS["Y"], lw=1.2,
                       hatch="//"),
    }
    for r in rects.values():
        ax.add_patch(r)
    F, Q = costs.linear_flops(M, K, N), costs.linear_bytes(M, K, N, b)
    _label(ax, N / 2, gap + K / 2, f"W\n{plots.human_bytes(b * K * N)}", ha="center", va="center")
    below = -max(M, 0.04 * extent) - 0.03 * extent
    _label(ax, -gap - K / 2, below, f"X\n{plots.human_bytes(b * M * K)}", ha="center", va="top")
    _label(ax, N / 2, below, f"Y\n{plots.human_bytes(b * M * N)}", ha="center", va="top")
    i = F / Q
    _label(ax, -gap - K / 2, gap + K / 2, f"I = {i:,.0f}" if i >= 10 else f"I = {i:.2g}", ha="center", va="center")
    ax.set_title(title, fontsize=TEXT_PT + 0.5)
    ax.set_xlim(-gap - K - 0.02 * extent, N + 0.02 * extent)
    ax.set_ylim(-extent, gap + K + 0.02 * extent)
    ax.set_aspect("equal")
    ax.axis("off")
    return rects


def gemm(shapes: dict, layer: str, Ms, ridge_M: float | None = None, b: int = 2):
    """The diagram of chapter 1: ``layer`` of ``shapes`` (name -> (K, N)) drawn to scale at each M of
    ``Ms`` (at most three), and below it the bytes of all of ``shapes`` over M, with the crossover and,
    when given, the ridge. Returns the figure; ``fig.rects`` holds each drawing's rectangles."""
    if layer not in shapes:
        raise KeyError(f"layer {layer!r} is not one of {list(shapes)}")
    Ms = [_positive_int("M", m) for m in Ms]
    if not 1 <= len(Ms) <= 3:
        raise ValueError(f"draw one to three sizes of M (the column fits three), got {len(Ms)}")
    if ridge_M is not None and not (isinstance(ridge_M, int | float) and math.isfinite(ridge_M) and ridge_M > 0):
        raise ValueError(f"the ridge must be a positive finite M, got {ridge_M!r}")
    K, N = shapes[layer]
    crossover = crossover_M(shapes)
    fig = plots.plt.figure(figsize=(plots.WIDTH_IN, 6.4))
    grid = fig.add_gridspec(2, len(Ms), height_ratios=[1.25, 1.0], hspace=0.35)
    gap = 0.06 * max(K, N)
    extent = max(max(Ms), 0.25 * K) + 0.22 * max(K, N)  # room below Y for the labels
    fig.rects = []
    for i, m in enumerate(Ms):
        ax = fig.add_subplot(grid[0, i])
        note = " (the ridge)" if ridge_M is not None and abs(m - ridge_M) <= 0.5 else ""
        fig.rects.append(_draw_one(ax, K, N, m, b, gap, extent, f"M = {m}{note}"))
    ax = fig.add_subplot(grid[1, :])
    m = np.unique(np.geomspace(1, 16 * max(crossover, max(Ms)), 200).round())
    w, act = block_bytes(shapes, m, b)
    ax.plot(m, np.full_like(m, w), "-", color=COLORS["W"], label="weights: b ΣKN")
    ax.plot(m, act, "--", color=COLORS["X"], label="activations: b Σ(MK + MN)")
    ax.set_xscale("log")
    plots.bytes_axis(ax, "y")
    ax.yaxis.set_major_locator(LogLocator(base=32))  # 1 KiB, 32 KiB, 1 MiB, 32 MiB, 1 GiB
    ax.axvline(crossover, color="0.3", ls=":", lw=1.0)
    _label(ax, crossover * 1.08, w * 6, f"equal bytes\nM = {crossover:,.0f}", color="0.2", va="center")
    if ridge_M is not None:
        ax.axvline(ridge_M, color="0.3", ls="--", lw=1.0)
        _label(ax, ridge_M / 1.08, w * 6, f"ridge\nM = {ridge_M:.0f}", color="0.2", ha="right", va="center")
    ax.set_xlabel("M (tokens in the step)")
    ax.set_ylabel("bytes (bf16)" if b == 2 else f"bytes ({b}-byte elements)")
    ax.set_title(f"bytes moved by the {len(shapes)} linear layers of a block", fontsize=TEXT_PT + 0.5)
    ax.legend(loc="lower right", fontsize=TEXT_PT)
    plots.plain_log(ax, "x")
    fig.suptitle(f"Y = XW to scale, the {layer} layer: X [M, {K}], W [{K}, {N}], Y [M, {N}]; I in FLOP/byte")
    fig.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.08)
    return fig


def step_and_cost(decode, knee_B: float, ridge_B: float, floor_us: float, target_us: float | None = None):
    """Two panels over the batch B, sharing the axis: the linear layers' step time in ms (the share of
    TPOT they set) with the floor ``floor_us`` (their weights read once), and the time per token in us.
    Both mark the measured knee ``knee_B`` (NaN: none, not drawn) and the predicted ridge ``ridge_B``; the upper one the TPOT
    target ``target_us`` when given. ``decode`` is ``matrix_shapes.decode_steps``'s table."""
    for name in ("step (us)", "per token (us)"):
        if name not in decode.columns:
            raise KeyError(f"the decode table lacks {name!r}: pass matrix_shapes.decode_steps(...)")
    for name, v in (("knee_B", knee_B), ("ridge_B", ridge_B), ("floor_us", floor_us)):
        if name == "knee_B" and isinstance(v, float) and math.isnan(v):
            continue  # a sweep without large M (a smoke run) has no knee: it is not drawn
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    fig, (top, bottom) = plots.figure("Decode: the linear layers of a step over the batch", "batch B (requests per step)",
                                      "time (ms)", logx=True, logy=True, panels=2, sharex=True)
    B = decode.index.to_numpy()
    top.plot(B, decode["step (us)"] / 1e3, "o-", color="C0", label="step (measured layers, summed)")
    top.axhline(floor_us / 1e3, color="C1", ls="-.", lw=1.2, label="floor: weights / read rate")
    if target_us is not None:
        top.axhline(target_us / 1e3, color="C3", ls=":", lw=1.2, label="TPOT target")
    top.set_ylabel("step time, TPOT (ms)")
    low = min(floor_us, float(decode["step (us)"].min())) / 1e3
    top.set_ylim(bottom=low / 1.7)  # room below the floor, so that a tick label sits under it
    top.set_xlabel("")
    bottom.plot(B, decode["per token (us)"], "s-", color="C2", label="time per token")
    bottom.set_ylabel("per token (us)")
    has_knee = not math.isnan(knee_B)
    for ax in (top, bottom):
        if has_knee:
            ax.axvline(knee_B, color="0.2", ls="--", lw=1.0)
        ax.axvline(ridge_B, color="0.55", ls=":", lw=1.2)
    y_top = top.get_ylim()[1]
    if has_knee:
        _label(top, knee_B * 1.1, y_top, f"knee B = {knee_B:.0f}", va="top", color="0.2")
    _label(top, ridge_B / 1.1, y_top, f"ridge {ridge_B:.0f}", va="top", ha="right", color="0.4")
    top.legend(loc="center left", fontsize=TEXT_PT)
    bottom.legend(loc="upper right", fontsize=TEXT_PT)
    plots.plain_axes(fig)
    return fig
