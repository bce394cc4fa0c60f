"""One request's timeline, from the serving simulator: where its latency goes, and TTFT and TPOT on it.

A request's latency as a user sees it decomposes into stages,

    T_total = T_queue + T_prefill + T_decode + T_post + T_network,

and the two numbers a serving engine reports are marked on that line: the time to first token (TTFT,
arrival to the first token) and the time per output token (TPOT, the mean gap between two tokens after
the first, (last token - first token) / (output tokens - 1)).

``request_timeline`` reads one request back out of a run of ``lib.simulator.simulate``: its result (arrival,
time queued) and the run's step trace (each step's start and end, the requests it prefilled, those it gave
a token). The request's stages follow from them: queued from arrival to its first admission, prefilling
in the steps that prefilled it, decoding from its first token to its last; a token arrives at the end of
the step that yields it. ``latency_figure`` draws that timeline twice, the whole request and the first
tokens enlarged, with the stages as bands, every token as a tick, and TTFT and TPOT as brackets. The
simulator models the engine's steps only: post-processing (detokenizing, tool calls) and the network are
drawn as hatched bands of a width the caller chooses, labelled as not simulated.

Chapters: the introduction (the figure), 6 (the simulator it reads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lib.bench import plots

# relative tolerance, in seconds of simulated clock, between what the result says and the trace shows
_TOL = 1e-9


@dataclass(frozen=True)
class Timeline:
    """One request on the simulator's clock (seconds): when it arrived, was first admitted, the steps that
    prefilled it (start, end), and the time of each of its tokens."""

    id: int
    arrival: float
    admitted: float
    prefill_steps: tuple[tuple[float, float], ...]
    token_times: tuple[float, ...]

    @property
    def first_token(self) -> float:
        return self.token_times[0]

    @property
    def last_token(self) -> float:
        return self.token_times[-1]

    @property
    def ttft(self) -> float:
        """Arrival to first token (s)."""
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """Mean gap between tokens after the first (s); NaN for a single token."""
        n = len(self.token_times)
        return (self.last_token - self.first_token) / (n - 1) if n > 1 else math.nan

    def stages(self) -> dict[str, float]:
        """The simulated stages (s): ``queue`` (arrival to first admission), ``prefill`` (the steps that
        prefilled it), ``decode`` (first token to last), ``other`` (admitted, before its first token, in
        steps that did not prefill it), ``e2e`` (arrival to last token); queue + prefill + other + decode
        = e2e for a request prefilled before its first token."""
        queue = self.admitted - self.arrival
        prefill = sum(end - start for start, end in self.prefill_steps)
        decode = self.last_token - self.first_token
        e2e = self.last_token - self.arrival
        return {"queue": queue, "prefill": prefill, "other": e2e - queue - prefill - decode, "decode": decode,
                "e2e": e2e, "ttft": self.ttft, "tpot": self.tpot}


def request_timeline(result: Mapping, trace: Sequence[Mapping]) -> Timeline:
    """The timeline of the request ``result`` (one element of what ``lib.simulator.simulate`` returns) from the
    ``trace`` of the same run (``simulate(..., trace=trace)``).

    Its tokens arrive at the ends of the steps whose "yielded" lists it; its prefill steps are those whose
    "prefill" maps its id. Checks that the trace belongs to the run: as many tokens as the result counts,
    the first at arrival + TTFT, the last at arrival + E2E."""
    try:
        rid, arrival, queue = result["id"], float(result["arrival"]), float(result["queue"])
        tokens, ttft, e2e = int(result["tokens"]), float(result["ttft"]), float(result["e2e"])
    except KeyError as e:
        raise ValueError(f"result lacks {e}: pass one element of what lib.simulator.simulate returns") from None
    if not trace:
        raise ValueError("the trace is empty: run lib.simulator.simulate(..., trace=trace) with a list and pass it here")
    prefill = tuple((float(s["start"]), float(s["end"])) for s in trace if rid in s["prefill"])
    times = tuple(float(s["end"]) for s in trace if rid in s["yielded"])
    if not times:
        raise ValueError(f"request {rid} gets no token in the trace: the trace is not from the run that produced "
                         f"this result; pass the trace list given to that simulate call")
    checks = [("tokens", len(times), tokens), ("first token", times[0], arrival + ttft),
              ("last token", times[-1], arrival + e2e)]
    for what, seen, said in checks:
        if abs(seen - said) > _TOL * max(1.0, abs(said)):
            raise ValueError(f"request {rid}: the trace gives {what} {seen!r}, its result {said!r}: the trace is "
                             f"not from the run that produced this result")
    return Timeline(id=rid, arrival=arrival, admitted=arrival + queue, prefill_steps=prefill, token_times=times)


# the bands, bottom to top of the drawing order: (stage, colour, hatch)
_BANDS = {"queue": ("0.75", None), "prefill": ("C1", None), "decode": ("C0", None),
          "post": ("white", "//"), "network": ("white", "xx")}


def _draw(ax, tl: Timeline, post_s: float, network_s: float, t_max_ms: float, zoom: bool, outside: str) -> None:
    ms = 1e3
    t0 = tl.arrival
    h = 0.6  # the bands span -h/2 .. h/2

    def x(t):
        return (t - t0) * ms

    def band(start, end, stage, label=None, name=None):
        colour, hatch = _BANDS[stage]
        ax.broken_barh([(x(start), (end - start) * ms)], (-h / 2, h), facecolors=colour, edgecolors="0.2",
                       hatch=hatch, linewidth=0.6, label=label)
        if name:  # the stage's symbol, above its band
            ax.text((x(start) + x(end)) / 2, h / 2 + 0.06, name, ha="center", va="bottom", fontsize=10)

    def bracket(start, end, level, text, below=False):
        ax.annotate("", xy=(x(start), level), xytext=(x(end), level),
                    arrowprops={"arrowstyle": "<->", "lw": 0.9, "shrinkA": 0, "shrinkB": 0})
        ax.text((x(start) + x(end)) / 2, level + (-0.08 if below else 0.08), text, ha="center",
                va="top" if below else "bottom", fontsize=10)

    end = tl.last_token
    band(tl.arrival, tl.admitted, "queue", "queued", r"$T_\mathrm{queue}$" if zoom else None)
    for i, (start, stop) in enumerate(tl.prefill_steps):
        band(start, stop, "prefill", "prefill steps" if i == 0 else None,
             r"$T_\mathrm{prefill}$" if zoom and i == 0 else None)
    band(tl.first_token, end, "decode", "decoding", None if zoom else r"$T_\mathrm{decode}$")
    band(end, end + post_s, "post", f"post-processing ({outside})", None if zoom else r"$T_\mathrm{post}$")
    band(end + post_s, end + post_s + network_s, "network", f"network ({outside})",
         None if zoom else r"$T_\mathrm{network}$")
    ax.vlines([x(t) for t in tl.token_times], -h / 2 - 0.15, -h / 2, color="k", lw=0.7)
    if zoom:
        bracket(tl.arrival, tl.first_token, h / 2 + 0.65, "TTFT")
        if len(tl.token_times) > 1:
            bracket(tl.token_times[0], tl.token_times[1], -h / 2 - 0.3, "TPOT: one gap", below=True)
        ax.set_ylim(-1.35, 1.5)
    else:
        bracket(tl.arrival, tl.first_token, h / 2 + 0.65, "TTFT")
        bracket(tl.arrival, end + post_s + network_s, h / 2 + 1.35, r"$T_\mathrm{total}$")
        bracket(tl.first_token, end, -h / 2 - 0.3, f"{len(tl.token_times)} tokens, TPOT = mean of the "
                f"{len(tl.token_times) - 1} gaps", below=True)
        ax.set_ylim(-1.35, 2.2)
    ax.set_xlim(0, t_max_ms)
    ax.set_yticks([])
    ax.spines["left"].set_visible(False)
    ax.grid(False, axis="y")


def latency_figure(tl: Timeline, *, post_s: float, network_s: float, zoom_tokens: int = 4,
                   run: str = "the simulated run", outside: str = "not simulated"):
    """The request's timeline, two rows sharing nothing but the style: above, the whole request with
    post-processing and network after its last token (bands ``post_s`` and ``network_s`` seconds wide,
    hatched and labelled ``outside``: the simulator does not model them) and T_total over all; below, its
    start enlarged to the first ``zoom_tokens`` tokens, with TTFT and one TPOT gap marked. Times in ms from
    arrival; ``run`` names where the request comes from in the title."""
    for name, v in (("post_s", post_s), ("network_s", network_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number of seconds (the band's drawn width), got {v!r}")
    if not (isinstance(zoom_tokens, int) and zoom_tokens >= 2):
        raise ValueError(f"zoom_tokens must be a whole number >= 2 (the enlarged row shows TPOT between two "
                         f"tokens), got {zoom_tokens!r}")
    plt = plots.plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(plots.WIDTH_IN, 5.6))
    total_ms = (tl.last_token + post_s + network_s - tl.arrival) * 1e3
    _draw(top, tl, post_s, network_s, total_ms * 1.02, zoom=False, outside=outside)
    shown = tl.token_times[min(zoom_tokens, len(tl.token_times)) - 1]
    _draw(bottom, tl, post_s, network_s, (shown - tl.arrival) * 1e3 * 1.08, zoom=True, outside=outside)
    top.set_title(f"One request's latency: request {tl.id} of {run}", fontsize=11)
    bottom.set_title(f"its start enlarged: up to token {min(zoom_tokens, len(tl.token_times))}", fontsize=10)
    bottom.set_xlabel("time since the request arrived (ms)")
    top.set_xlabel("time since the request arrived (ms)")
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig
