"""Static, dynamic and continuous batching side by side, drawn from the serving simulator's own step trace.

``lib.simulator.simulate(..., trace=[])`` records every engine step: its start and end on the simulated
clock, the requests it prefilled (and how many prompt tokens each) and the requests it decoded. Read back
per request (``occupancy``), that trace says in which steps each request ran and doing what; with the
simulated results (arrival, first admission, last token) it gives each request's life: queued from
arrival to admission, then a prefill or decode segment per step until its last token. ``policy_timelines``
draws that life for the same few requests under several policies, one panel per policy sharing the time
axis, so that what a policy does is visible: a static batch starts only once it is full and nobody joins
it until all of it has finished; a dynamic batch also starts when its oldest request has waited the
window; continuous batching lets a request join at the next step and leave at its last token.

Chapters: 6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lib.bench import plots

_COLOURS = {"prefill": "C1", "decode": "C0"}
_HATCH = {"prefill": "//", "decode": None}


def occupancy(trace: Sequence[Mapping]) -> dict[int, list[tuple[float, float, str]]]:
    """Per request id, the steps it ran in, in order: (start, end, "prefill" or "decode"), from a trace of
    ``lib.simulator.simulate`` (records with "start", "end", "prefill" {id: tokens} and "decode" [ids]). A
    request prefilled and decoded in one step (it cannot be) would be an error in the trace."""
    out: dict[int, list[tuple[float, float, str]]] = {}
    for i, step in enumerate(trace):
        missing = {"start", "end", "prefill", "decode"} - set(step)
        if missing:
            raise ValueError(f"trace record {i} lacks {sorted(missing)}: pass the list that simulate(..., trace=[]) "
                             f"filled")
        both = set(step["prefill"]) & set(step["decode"])
        if both:
            raise ValueError(f"trace record {i} both prefills and decodes requests {sorted(both)}: not a trace of "
                             f"lib.simulator.simulate")
        for rid in step["prefill"]:
            out.setdefault(rid, []).append((step["start"], step["end"], "prefill"))
        for rid in step["decode"]:
            out.setdefault(rid, []).append((step["start"], step["end"], "decode"))
    return out


def policy_timelines(runs: Mapping[str, tuple[Sequence[Mapping], Sequence[Mapping]]], *, title: str):
    """One panel per policy (``runs``: name -> (simulated results, step trace)), the same requests in each:
    a row per request (its id), a dot at its arrival, a thin line while it is queued, then one box per step
    it runs in (hatched orange: prefill; blue: decode), and a bar at its last token. Times in ms on a
    shared axis."""
    if not runs:
        raise ValueError("runs is empty: give at least one policy's (results, trace)")
    ids = None
    for name, (res, trace) in runs.items():
        these = sorted(r["id"] for r in res)
        if ids is not None and these != ids:
            raise ValueError(f"policy {name!r} ran requests {these}, another ran {ids}: the panels must show the "
                             f"same requests")
        ids = these
        if not trace:
            raise ValueError(f"policy {name!r} has an empty trace: pass trace=[] to simulate and give that list")
    fig, axes = plots.figure(title, "time (ms)", "request (id)", panels=len(runs), sharex=True)
    axes = axes if isinstance(axes, list) else [axes]
    h = 0.6
    for ax, (name, (res, trace)) in zip(axes, runs.items(), strict=True):
        occ = occupancy(trace)
        for r in res:
            y = r["id"]
            arrival, admitted, done = r["arrival"], r["arrival"] + r["queue"], r["arrival"] + r["e2e"]
            ax.plot([arrival * 1e3], [y], "o", ms=4, mfc="white", mec="0.2", zorder=3)
            ax.plot([arrival * 1e3, admitted * 1e3], [y, y], "-", color="0.55", lw=1.0, zorder=1)
            for kind in ("prefill", "decode"):
                spans = [(s * 1e3, (e - s) * 1e3) for s, e, k in occ.get(y, []) if k == kind]
                if spans:
                    ax.broken_barh(spans, (y - h / 2, h), facecolors=_COLOURS[kind], edgecolors="white",
                                   hatch=_HATCH[kind], linewidth=0.4, zorder=2)
            ax.plot([done * 1e3, done * 1e3], [y - h / 2 - 0.1, y + h / 2 + 0.1], "-", color="k", lw=1.2, zorder=3)
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_yticks(ids)
        ax.set_ylim(max(ids) + 0.8, min(ids) - 0.8)
        ax.grid(False, axis="y")
    handles = [plots.plt.Rectangle((0, 0), 1, 1, facecolor=_COLOURS["prefill"], hatch="//", edgecolor="white"),
               plots.plt.Rectangle((0, 0), 1, 1, facecolor=_COLOURS["decode"]),
               plots.plt.Line2D([], [], color="0.55", lw=1.0, marker="o", mfc="white", mec="0.2", ms=4),
               plots.plt.Line2D([], [], color="k", lw=1.2, marker="|", ms=10, ls="none")]
    fig.legend(handles, ["prefill step", "decode step", "arrived, queued", "last token"], loc="lower center",
               ncol=4, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
