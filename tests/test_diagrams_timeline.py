"""One request's timeline read back from the simulator (lib.diagrams.timeline): hand-worked traces, and
every request of a real simulated run against the simulator's own metrics."""

from __future__ import annotations

import math

import pytest

from lib import simulator, workloads
from lib.diagrams import timeline


def _result(rid=7, arrival=1.0, queue=0.5, ttft=0.6, e2e=0.9, tokens=3):
    return {"id": rid, "arrival": arrival, "queue": queue, "ttft": ttft, "e2e": e2e, "tokens": tokens}


def _step(start, end, prefill=(), yielded=()):
    return {"start": start, "end": end, "prefill": {i: 16 for i in prefill}, "decode": [], "yielded": list(yielded),
            "finished": [], "preempted": [], "kv": 0}


# request 7: arrives at 1.0, admitted at 1.5, prefilled in one step to 1.6 (its first token), then two
# decode steps ending at 1.7 and 1.9; request 8 shares the steps and must not leak into 7's timeline
HAND = [_step(1.2, 1.5, prefill=[8], yielded=[8]),
        _step(1.5, 1.6, prefill=[7], yielded=[7, 8]),
        _step(1.6, 1.7, yielded=[7]),
        _step(1.7, 1.9, yielded=[7, 8])]


def test_hand_worked_request():
    tl = timeline.request_timeline(_result(), HAND)
    assert tl.id == 7 and tl.arrival == 1.0 and tl.admitted == 1.5
    assert tl.prefill_steps == ((1.5, 1.6),)
    assert tl.token_times == (1.6, 1.7, 1.9)
    st = tl.stages()
    assert st["queue"] == pytest.approx(0.5)
    assert st["prefill"] == pytest.approx(0.1)
    assert st["decode"] == pytest.approx(0.3)
    assert st["other"] == pytest.approx(0.0, abs=1e-12)
    assert st["e2e"] == pytest.approx(0.9)
    assert st["ttft"] == pytest.approx(0.6)
    assert st["tpot"] == pytest.approx(0.15)  # (1.9 - 1.6) / (3 - 1), not the last gap 0.2 nor the mean 0.1
    assert st["queue"] + st["prefill"] + st["other"] + st["decode"] == pytest.approx(st["e2e"])


def test_chunked_prefill_with_a_step_in_between():
    # two prefill chunks (1.5-1.6 and 1.65-1.7) with a step between them that did not prefill request 7
    trace = [_step(1.5, 1.6, prefill=[7]), _step(1.6, 1.65, prefill=[8]), _step(1.65, 1.7, prefill=[7], yielded=[7]),
             _step(1.7, 1.8, yielded=[7])]
    tl = timeline.request_timeline(_result(ttft=0.7, e2e=0.8, tokens=2), trace)
    st = tl.stages()
    assert tl.prefill_steps == ((1.5, 1.6), (1.65, 1.7))
    assert st["prefill"] == pytest.approx(0.15)
    assert st["other"] == pytest.approx(0.05)
    assert st["tpot"] == pytest.approx(0.1)


def test_one_token_has_no_tpot():
    tl = timeline.request_timeline(_result(ttft=0.6, e2e=0.6, tokens=1), HAND[:2])
    assert math.isnan(tl.tpot)


class _Cost:
    """1 ms per step plus 1 us per token: a cost model with the simulator's interface."""

    def step(self, tokens, prefill_work, decode_kv):
        return 1e-3 + 1e-6 * tokens


def test_every_request_of_a_real_run_matches_the_simulator():
    trace = []
    reqs = workloads.requests(40, 200.0, seed=3)
    res = simulator.simulate(reqs, _Cost(), simulator.Policy("continuous", max_running=8, token_budget=1024, chunk=256),
                           trace=trace)
    for r in res:
        tl = timeline.request_timeline(r, trace)
        st = tl.stages()
        assert st["ttft"] == pytest.approx(r["ttft"], abs=1e-12)
        assert st["queue"] == pytest.approx(r["queue"], abs=1e-12)
        assert st["prefill"] == pytest.approx(r["prefill"], abs=1e-12)
        assert st["decode"] == pytest.approx(r["decode"], abs=1e-12)
        if r["output"] > 1:
            assert st["tpot"] == pytest.approx(r["tpot"], rel=1e-9)
        assert len(tl.token_times) == r["output"]


def test_a_trace_from_another_run_is_refused():
    with pytest.raises(ValueError, match="first token"):
        timeline.request_timeline(_result(ttft=0.65), HAND)
    with pytest.raises(ValueError, match="tokens"):
        timeline.request_timeline(_result(tokens=4), HAND)
    with pytest.raises(ValueError, match="no token"):
        timeline.request_timeline(_result(rid=9), HAND)
    with pytest.raises(ValueError, match="empty"):
        timeline.request_timeline(_result(), [])
    with pytest.raises(ValueError, match="lacks"):
        timeline.request_timeline({"id": 7}, HAND)


def test_figure_marks_the_stages_and_refuses_bad_widths():
    tl = timeline.request_timeline(_result(), HAND)
    fig = timeline.latency_figure(tl, post_s=0.05, network_s=0.1, zoom_tokens=2)
    top, bottom = fig.axes[:2]
    texts = {t.get_text() for ax in (top, bottom) for t in ax.texts}
    assert {"TTFT", "TPOT: one gap", r"$T_\mathrm{total}$", r"$T_\mathrm{queue}$", r"$T_\mathrm{prefill}$",
            r"$T_\mathrm{decode}$", r"$T_\mathrm{post}$", r"$T_\mathrm{network}$"} <= texts
    # the whole request, post and network included, is on the top row: 0.9 s + 0.05 + 0.1 = 1050 ms
    assert top.get_xlim()[1] >= 1050
    # the lower row ends near the second token (0.7 s after arrival), enlarging the start
    assert 700 <= bottom.get_xlim()[1] < 1050
    for bad in (0, -1.0, math.nan, "5"):
        with pytest.raises(ValueError, match="post_s"):
            timeline.latency_figure(tl, post_s=bad, network_s=0.1)
    with pytest.raises(ValueError, match="zoom_tokens"):
        timeline.latency_figure(tl, post_s=0.1, network_s=0.1, zoom_tokens=1)
    timeline.plots.plt.close("all")
