"""Chapter 4's diagram of the grouped GEMM kernel's tile schedule, drawn from the kernel's own schedule.

``tile_schedule`` takes one routing (the tokens each expert received), the layer's $N$ and the kernel's
configuration (``lib.kernels.grouped_gemm.choose_config``: row and column tile, tile order, programs per
SM) and asks the kernel module's own plain-Python schedule (``lib.kernels.grouped_gemm.tile_schedule``)
which program computes which (expert, output tile) in which round. Program $j$ takes the $j$-th,
$(j + n_\\text{prog})$-th, ... tile of the order, so the figure is a grid: one column per program, one row
per round, each cell coloured by the expert whose tile it computes, white where the program is idle.

Experts with more than one row tile (the heavy ones, which the ``heavy_first`` order starts first) each
get a colour of their own, named with their tokens in the legend (the largest few; any others share one
colour); experts with one row tile alternate between two greys, so that the boundary between two
neighbours shows. Nothing is typed in: change the routing and the figure follows.

Chapter: 4 (grouped GEMM).
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from lib.bench import plots
from lib.kernels import grouped_gemm as gg

HEAVY_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")
OTHER_HEAVY = "#DA8BC3"  # heavy experts beyond the named ones
LIGHT = ("#BDBDBD", "#8C8C8C")  # one-row-tile experts, alternating
IDLE = "#FFFFFF"


def schedule_grid(counts, N: int, config: dict, programs: int) -> tuple[np.ndarray, list[dict]]:
    """(grid, rows): ``grid[round, program]`` is the expert whose tile that program computes in that round,
    -1 where it is idle; ``rows`` is the kernel's schedule (``gg.tile_schedule``) with each row's expert.

    ``counts``: tokens per expert (zeros allowed: an empty expert has no tiles); ``config``: the kernel's
    ``block_m``, ``block_n``, ``order`` and ``half_tail``; ``programs``: the programs launched."""
    counts = [int(m) for m in counts]
    if not counts or any(m < 0 for m in counts):
        raise ValueError(f"counts must be a non-empty list of tokens per expert, none negative; got {counts!r}")
    if isinstance(programs, bool) or int(programs) != programs or programs < 1:
        raise ValueError(f"programs must be a positive int (SMs x programs per SM), got {programs!r}")
    if N < 1:
        raise ValueError(f"N must be a positive int (the layer's output columns), got {N!r}")
    missing = [k for k in ("block_m", "block_n") if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}: pass lib.kernels.grouped_gemm.choose_config(T, E)")
    # the kernel's schedule runs over the non-empty experts only; keep each tile's expert id
    experts = [e for e, m in enumerate(counts) if m > 0]
    rows = gg.tile_schedule([counts[e] for e in experts], N, config["block_m"], config["block_n"], int(programs),
                            half_tail=bool(config.get("half_tail", False)), order=config.get("order", "experts"))
    rows = [{**r, "expert": experts[r["problem"]]} for r in rows]
    rounds = max(r["round"] for r in rows) + 1 if rows else 1
    grid = np.full((rounds, int(programs)), -1, dtype=int)
    for r in rows:
        grid[r["round"], r["worker"]] = r["expert"]
    return grid, rows


def tile_schedule(counts, N: int, config: dict, programs: int, title: str, named: int = 6):
    """The schedule of one routing as a grid of programs (x) by rounds (y), coloured by expert; returns the
    figure with ``fig.grid`` (``schedule_grid``) and ``fig.heavy`` (the heavy experts, most tokens first)."""
    grid, rows = schedule_grid(counts, N, config, programs)
    bm = config["block_m"]
    heavy = sorted({r["expert"] for r in rows if counts[r["expert"]] > bm}, key=lambda e: (-counts[e], e))
    named_heavy = heavy[:named]
    light = sorted({r["expert"] for r in rows} - set(heavy))
    # colour index per cell: 0 idle, 1 and 2 the light greys, 3.. the named heavy experts, then the other heavy
    colour_of = {e: 1 + i % 2 for i, e in enumerate(light)}
    colour_of.update({e: 3 + i for i, e in enumerate(named_heavy)})
    colour_of.update({e: 3 + len(named_heavy) for e in heavy[named:]})
    idx = np.vectorize(lambda e: 0 if e < 0 else colour_of[e])(grid)
    colours = [IDLE, *LIGHT, *HEAVY_COLOURS[:len(named_heavy)], OTHER_HEAVY]
    fig, ax = plots.figure(title, "program (-)", "round (-)")
    fig.set_figheight(2.2 + 0.45 * grid.shape[0])
    ax.imshow(idx, aspect="auto", interpolation="nearest", cmap=ListedColormap(colours), vmin=0,
              vmax=len(colours) - 1, extent=(-0.5, grid.shape[1] - 0.5, grid.shape[0] - 0.5, -0.5))
    ax.grid(False)
    ax.set_yticks(range(grid.shape[0]))
    for y in range(grid.shape[0] - 1):
        ax.axhline(y + 0.5, color="k", lw=0.6)
    handles = [Patch(facecolor=HEAVY_COLOURS[i], edgecolor="k", lw=0.4,
                     label=f"expert {e}: {counts[e]} tokens") for i, e in enumerate(named_heavy)]
    if heavy[named:]:
        handles.append(Patch(facecolor=OTHER_HEAVY, edgecolor="k", lw=0.4,
                             label=f"{len(heavy) - named} other experts > {bm} tokens"))
    if light:
        handles.append(Patch(facecolor=LIGHT[0], edgecolor="k", lw=0.4, label=f"{len(light)} experts, <= {bm} tokens"))
    handles.append(Patch(facecolor=IDLE, edgecolor="k", lw=0.4, label="idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=2, frameon=False)
    fig.tight_layout()
    fig.grid, fig.heavy = grid, heavy
    return fig
