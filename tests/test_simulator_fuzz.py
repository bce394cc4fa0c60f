"""lib.simulator.simulate driven through random small configurations (seeded numpy draws): every run ends,
and what it reports holds.

Each case draws 1 to 6 requests (prompts and outputs of 1 to 24 tokens, arrivals together or apart), a
policy of any kind (batch and running limits, token budget, chunk, prefill_first, a window, buckets)
and a KV capacity from exactly the largest request's need to 30 tokens more (or none), and runs under a
cost model that counts its steps: past ``STEP_LIMIT`` the run is declared spinning and the test fails
instead of hanging. Checked on every run, against the plans (who was admitted, who decodes, who was
pre-empted: ids only, seen through ``on_plan``) and the step trace, rebuilt request by request (an oracle
that does not read the scheduler's own KV counter):

- the KV the running requests hold, rebuilt under the engine's rules (admission reserves the tokens to
  prefill whole: the prompt and every token generated so far; a decode first grows its request by exactly
  one token, to its prompt and output so far; finishing or a pre-emption drops all), never exceeds the
  capacity once a step is planned, and equals the trace's "kv" after each step;
- a request that is pre-empted prefills its prompt plus every token it had generated, and nothing more;
- every request yields exactly its output tokens and finishes once; 0 <= queue <= TTFT <= E2E, and its
  first and last token times are arrival + TTFT and arrival + E2E; its pre-emptions are those of the plans
  (a plan may pre-empt and run nothing: such a plan has no trace record).

A planted bug (a ``finish_step`` that forgets a chunk's progress unless it completes the prompt, so a
chunked prompt prefills its first chunk over and over) shows the other way a run may end: with the
no-progress error.

Chapters: 6.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from lib import simulator

STEP_LIMIT = 5000  # the cases below finish in at most a few hundred steps
CASES = 1000


class Spinning(Exception):
    """The run took more than STEP_LIMIT steps."""


class CountedCost:
    """step = a + b x tokens seconds (a, b drawn per case); counts the steps and stops a spinning run."""

    def __init__(self, a: float, b: float):
        self.a, self.b, self.steps = a, b, 0

    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        self.steps += 1
        if self.steps > STEP_LIMIT:
            raise Spinning(f"more than {STEP_LIMIT} steps")
        return self.a + self.b * tokens


def random_case(rng: np.random.Generator):
    """Requests, a policy and a cost model, drawn from ``rng``."""
    t, reqs = 0.0, []
    for i in range(int(rng.integers(1, 7))):
        t += float(rng.choice([0.0, 0.0, 1e-3, 0.5, 3.0]))
        reqs.append({"id": int(rng.integers(0, 1000)) * 10 + i, "arrival": t, "kind": "ab"[i % 2],
                     "input": int(rng.integers(1, 25)), "output": int(rng.integers(1, 25))})
    need = max(r["input"] + r["output"] for r in reqs)
    kind = str(rng.choice(["static", "dynamic", "continuous"]))
    kw = {"max_batch": int(rng.integers(1, 5)), "max_running": int(rng.integers(1, 5)),
          "token_budget": int(rng.integers(1, 40)), "max_wait": float(rng.choice([0.0, 1e-3, 1.0])),
          "prefill_first": bool(rng.integers(2)),
          "kv_capacity": None if rng.random() < 0.2 else need + int(rng.integers(0, 31))}
    if kind == "continuous":
        kw["chunk"] = None if rng.random() < 0.3 else int(rng.integers(1, 10))
        if rng.random() < 0.3:
            kw["buckets"] = (simulator.Bucket("short", int(rng.integers(1, 15)), priority=int(rng.integers(2)),
                                            max_wait=[None, 0.0, 0.5][int(rng.integers(3))]),
                             simulator.Bucket("long", 10**6, priority=int(rng.integers(2)),
                                            max_running=[None, 1, 2][int(rng.integers(3))]))
    cost = CountedCost(float(rng.choice([1e-3, 1.0])), float(rng.choice([0.0, 1e-4, 1.0])))
    return reqs, simulator.Policy(kind, **kw), cost


def snapshot(plans):
    """An ``on_plan`` that keeps each plan's ids, taken when it is made (the requests change afterwards)."""

    def on_plan(plan):
        plans.append({"admitted": [x.id for x in plan.admitted], "decode": [x.id for x in plan.decodes],
                      "prefill": {x.id: end - start for x, start, end in plan.prefills},
                      "preempted": [x.id for x in plan.preempted], "empty": plan.empty})

    return on_plan


def check_run(reqs, policy, res, plans, trace):
    """The invariants of the module's docstring, from the plans and the trace rebuilt request by request."""
    by_id = {r["id"]: r for r in reqs}
    held = defaultdict(int)  # request -> tokens of KV it holds now
    generated = defaultdict(int)  # request -> tokens yielded so far
    episode = defaultdict(int)  # request -> tokens prefilled since its last admission
    preemptions = defaultdict(int)
    token_times = defaultdict(list)
    steps = iter(trace)
    for p in plans:
        for i in p["admitted"]:  # reserves its tokens to prefill: its prompt and what it has generated
            assert held[i] == 0
            held[i] = by_id[i]["input"] + generated[i]
        for i in p["preempted"]:
            held[i] = episode[i] = 0
            preemptions[i] += 1
        for i in p["decode"]:  # room for its prompt and its output so far: one token more than after its last step
            assert held[i] == by_id[i]["input"] + generated[i] - 1
            held[i] += 1
        if policy.kv_capacity is not None:
            assert sum(held.values()) <= policy.kv_capacity
        if p["empty"]:
            continue
        s = next(steps)
        assert (s["prefill"], s["decode"], s["preempted"]) == (p["prefill"], p["decode"], p["preempted"])
        for i, take in s["prefill"].items():
            assert take >= 1 and held[i] == by_id[i]["input"] + generated[i]  # reserved at admission
            episode[i] += take
            # what it prefills is its prompt plus what it had generated when it was last pre-empted
            assert episode[i] <= by_id[i]["input"] + generated[i]
        for i in s["yielded"]:
            if i in s["prefill"]:  # the step that completes a prompt: exactly the prompt and the tokens before
                assert episode[i] == by_id[i]["input"] + generated[i]
            generated[i] += 1
            token_times[i].append(s["end"])
        for i in s["finished"]:
            held[i] = episode[i] = 0
        assert sum(held.values()) == s["kv"]
    assert next(steps, None) is None
    assert trace[-1]["kv"] == 0
    assert sorted(r["id"] for r in res) == sorted(by_id)
    for r in res:
        q = by_id[r["id"]]
        assert r["tokens"] == generated[r["id"]] == q["output"]
        assert sum(s["finished"].count(r["id"]) for s in trace) == 1
        assert 0 <= r["queue"] <= r["ttft"] <= r["e2e"] and math.isfinite(r["e2e"])
        assert token_times[r["id"]][0] == pytest.approx(q["arrival"] + r["ttft"])
        assert token_times[r["id"]][-1] == pytest.approx(q["arrival"] + r["e2e"])
        assert r["preemptions"] == preemptions[r["id"]]


def test_every_random_run_ends_and_keeps_its_invariants():
    rng = np.random.default_rng(2024)
    preempted = 0
    for case in range(CASES):
        reqs, policy, cost = random_case(rng)
        plans, trace = [], []
        try:
            res = simulator.simulate(reqs, cost, policy, trace=trace, on_plan=snapshot(plans))
        except Spinning:
            pytest.fail(f"case {case} spins: {reqs} under {policy}")
        check_run(reqs, policy, res, plans, trace)
        assert cost.steps == len(trace)
        preempted += sum(r["preemptions"] for r in res)
    assert preempted > 0  # the cases reach pre-emption, where the engine's KV accounting is exercised


def test_every_random_run_of_a_planted_livelock_ends(forgetful_scheduler):
    """A ``finish_step`` that forgets a chunk's progress unless it completes the prompt (a scheduler bug):
    each run still ends, finished or stopped by the no-progress error, never spinning; some of them do stop
    with the error (a chunked prompt never completes), some finish (no prompt needed two chunks)."""
    rng = np.random.default_rng(7)
    stopped = finished = 0
    for case in range(CASES):
        reqs, policy, cost = random_case(rng)
        try:
            simulator.simulate(reqs, cost, policy)
            finished += 1
        except Spinning:
            pytest.fail(f"case {case} spins: {reqs} under {policy}")
        except RuntimeError as e:
            assert str(e).startswith("the simulation made no progress in "), e
            stopped += 1
    assert stopped > 0 and finished > 0
