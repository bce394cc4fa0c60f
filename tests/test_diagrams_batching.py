"""lib.diagrams.batching (chapter 6): the per-request reading of a step trace, hand-worked, and the policy
timelines drawn from real simulator traces."""

from __future__ import annotations

import pytest

from lib import simulator
from lib.diagrams import batching as bd


def flat_cost(step_s):
    """Every step takes step_s seconds, whatever it does."""
    return simulator.MeasuredCostModel.fitted([1, 10**9], [step_s, step_s], prefill_s_per_work=0.0, decode_fixed_s=0.0,
                                            decode_s_per_kv_token=0.0)


# two requests, both at t = 0: a prompt of 4 tokens and 3 output tokens, a prompt of 2 tokens and 2 output tokens
FEW = [{"id": 0, "arrival": 0.0, "kind": "chat", "input": 4, "output": 3},
       {"id": 1, "arrival": 0.0, "kind": "chat", "input": 2, "output": 2}]


def test_occupancy_hand_worked():
    trace = [{"start": 0.0, "end": 1.0, "prefill": {0: 4}, "decode": []},
             {"start": 1.0, "end": 2.0, "prefill": {1: 2}, "decode": [0]},
             {"start": 2.0, "end": 3.0, "prefill": {}, "decode": [0, 1]}]
    assert bd.occupancy(trace) == {0: [(0.0, 1.0, "prefill"), (1.0, 2.0, "decode"), (2.0, 3.0, "decode")],
                                   1: [(1.0, 2.0, "prefill"), (2.0, 3.0, "decode")]}


def test_occupancy_of_a_static_batch_read_from_the_simulator():
    # a static batch of 2, every step 1 s: step 1 prefills both (each yields its first token), step 2 decodes
    # both (request 1 has its 2 tokens and is done), step 3 decodes request 0 alone (its third token)
    trace = []
    res = simulator.simulate(FEW, flat_cost(1.0), simulator.Policy("static", max_batch=2), trace=trace)
    occ = bd.occupancy(trace)
    assert occ[0] == [(0.0, 1.0, "prefill"), (1.0, 2.0, "decode"), (2.0, 3.0, "decode")]
    assert occ[1] == [(0.0, 1.0, "prefill"), (1.0, 2.0, "decode")]
    assert [r["e2e"] for r in res] == [3.0, 2.0]


def test_continuous_lets_a_late_request_join_the_next_step():
    # request 1 arrives at 0.5 s, during request 0's prefill step: continuous batching prefills it in the next
    # step, beside request 0's decode; a static batch of 2 keeps request 0 waiting for it
    late = [FEW[0], {**FEW[1], "arrival": 0.5}]
    trace = []
    simulator.simulate(late, flat_cost(1.0), simulator.Policy("continuous", max_running=2, token_budget=64), trace=trace)
    occ = bd.occupancy(trace)
    assert occ[1][0] == (1.0, 2.0, "prefill") and (1.0, 2.0, "decode") in occ[0]
    trace = []
    simulator.simulate(late, flat_cost(1.0), simulator.Policy("static", max_batch=2), trace=trace)
    assert bd.occupancy(trace)[0][0] == (0.5, 1.5, "prefill")


def test_occupancy_refuses_what_is_not_a_trace():
    with pytest.raises(ValueError, match="lacks"):
        bd.occupancy([{"start": 0.0, "end": 1.0}])
    with pytest.raises(ValueError, match="both prefills and decodes"):
        bd.occupancy([{"start": 0.0, "end": 1.0, "prefill": {0: 1}, "decode": [0]}])


def test_policy_timelines_draws_one_box_per_step_a_request_runs_in():
    runs = {}
    for name, pol in (("static", simulator.Policy("static", max_batch=2)),
                      ("continuous", simulator.Policy("continuous", max_running=2, token_budget=64))):
        trace = []
        runs[name] = (simulator.simulate(FEW, flat_cost(1e-3), pol, trace=trace), trace)
    fig = bd.policy_timelines(runs, title="two policies")
    assert len(fig.axes) == 2
    for ax, (_res, trace) in zip(fig.axes, runs.values(), strict=True):
        boxes = sum(len(c.get_paths()) for c in ax.collections)  # broken_barh: one path per box
        assert boxes == sum(len(v) for v in bd.occupancy(trace).values())
        assert list(ax.get_yticks()) == [0, 1]


def test_policy_timelines_refuses_different_requests_or_no_trace():
    trace = []
    res = simulator.simulate(FEW, flat_cost(1e-3), simulator.Policy("static", max_batch=2), trace=trace)
    with pytest.raises(ValueError, match="same requests"):
        bd.policy_timelines({"a": (res, trace), "b": (res[:1], trace)}, title="t")
    with pytest.raises(ValueError, match="empty trace"):
        bd.policy_timelines({"a": (res, [])}, title="t")
    with pytest.raises(ValueError, match="runs is empty"):
        bd.policy_timelines({}, title="t")
