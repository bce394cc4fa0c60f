"""lib.simulator and lib.workloads: the cost model, the policy, the metrics, and properties of the simulator
over random workloads and policies (every request finishes once with every token, token times move
forward, limits hold, runs are reproducible). Hand-worked traces are in test_simulator_traces.py."""

from __future__ import annotations

import importlib
import math
import random
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import simulator, workloads
from lib.engine.scheduler import Plan

simulate_module = importlib.import_module("lib.simulator.simulate")  # the module, which the function's name hides

# a model like chapter 6's fit: a forward pass of 1.8 ms up to ~100 tokens, compute-bound beyond
COST = simulator.MeasuredCostModel.fitted([16, 64, 256, 1024, 4096, 16384], [1.8e-3, 1.75e-3, 2.2e-3, 4.8e-3, 15.4e-3, 39.6e-3],
                                        prefill_s_per_work=5e-10, decode_fixed_s=1e-4, decode_s_per_kv_token=9e-9,
                                        overhead_s=2e-4)
MIX = (("chat", workloads.CHAT, 0.8), ("docs", workloads.LONG_DOC, 0.2))


def test_arrivals_and_requests_are_seeded():
    a = workloads.requests(200, 5.0, mix=MIX, seed=4)
    assert a == workloads.requests(200, 5.0, mix=MIX, seed=4) and a != workloads.requests(200, 5.0, mix=MIX, seed=5)
    times = workloads.arrival_times(20000, 10.0, seed=1)
    assert abs(len(times) / times[-1] - 10.0) < 0.3  # the rate asked for
    gaps = workloads.arrival_times(20000, 10.0, process="gamma", cv=3.0, seed=1)
    g = [b - a for a, b in zip(gaps, gaps[1:])]
    mean = sum(g) / len(g)
    cv = math.sqrt(sum((x - mean) ** 2 for x in g) / len(g)) / mean
    assert 2.5 < cv < 3.5  # bursty: the coefficient of variation asked for
    with pytest.raises(ValueError, match="process must be"):
        workloads.arrival_times(3, 1.0, process="uniform")


def test_mix_shares_are_weights_and_bad_mixes_are_refused():
    """A kind is drawn with probability share / sum of shares: 3 to 1 gives about 75% of the first kind; a
    share of 0 never draws its kind. Negative or NaN shares, shares that sum to 0, bad length specs,
    repeated names and counts that are not whole are refused, saying what to change."""
    kinds = Counter(r["kind"] for r in workloads.requests(4000, 1.0, mix=(("a", workloads.CHAT, 3), ("b", workloads.CHAT, 1))))
    assert 0.72 < kinds["a"] / 4000 < 0.78 and kinds["a"] + kinds["b"] == 4000
    only = workloads.requests(200, 1.0, mix=(("a", workloads.CHAT, 0.0), ("b", workloads.LONG_DOC, 2.0)))
    assert {r["kind"] for r in only} == {"b"} and min(r["input"] for r in only) >= workloads.LONG_DOC["input"][2]
    lists = (["chat", {"input": [600, 0.8, 16, 4096], "output": [200, 0.7, 4, 1024]}, 1],)  # as JSON gives it back
    assert workloads.requests(50, 1.0, mix=lists) == workloads.requests(50, 1.0)
    assert all(isinstance(r["input"], int) and isinstance(r["output"], int) for r in only)
    for share in (-1.0, math.nan, math.inf, "1", None, True):
        with pytest.raises(ValueError, match=rf"^mix 'b': share must be a finite weight >= 0, got {re.escape(repr(share))}$"):
            workloads.requests(5, 1.0, mix=(("a", workloads.CHAT, 1.0), ("b", workloads.LONG_DOC, share)))
    with pytest.raises(ValueError, match=r"^mix shares must not all be 0: no kind could be drawn; got \[0, 0.0\]$"):
        workloads.requests(5, 1.0, mix=(("a", workloads.CHAT, 0), ("b", workloads.CHAT, 0.0)))
    with pytest.raises(ValueError, match=r"^mix names must be distinct \(each request's kind is its name\), got \['a', 'a'\]$"):
        workloads.requests(5, 1.0, mix=(("a", workloads.CHAT, 1), ("a", workloads.LONG_DOC, 1)))
    for spec in [(0, 0.8, 16, 4096), (600, -0.1, 16, 4096), (600, 0.8, 0, 4096), (600, 0.8, 16, 15), (600, 0.8, 1.5, 4),
                 (600, 0.8, 16), (600, math.nan, 16, 4096), "600"]:
        with pytest.raises(ValueError, match=rf"^mix 'a': output lengths must be \(median > 0, sigma >= 0, low, high\) "
                                             rf"with whole 1 <= low <= high tokens, got {re.escape(repr(spec))}$"):
            workloads.requests(5, 1.0, mix=(("a", {"input": workloads.CHAT["input"], "output": spec}, 1.0),))
    with pytest.raises(ValueError, match=r"^mix 'a': lengths must be a dict with 'input' and 'output' specs, got"):
        workloads.requests(5, 1.0, mix=(("a", {"input": workloads.CHAT["input"]}, 1.0),))
    for mix in [(), "chat", ("chat", workloads.CHAT, 1.0), [("chat", workloads.CHAT)], None]:
        with pytest.raises(ValueError, match=r"^mix must be \(\(name, \{'input': spec, 'output': spec\}, share\), \.\.\.\)"):
            workloads.requests(5, 1.0, mix=mix)
    for n, rate, cv in [(2.5, 1.0, 1.0), (-1, 1.0, 1.0), (True, 1.0, 1.0), (3, 0.0, 1.0), (3, "1", 1.0), (3, 1.0, math.nan),
                        (3, 1.0, 0.0)]:
        with pytest.raises(ValueError, match=r"^need a whole n >= 0, a finite rate > 0 and a finite cv > 0; got "
                                             rf"n={re.escape(repr(n))}, rate={re.escape(repr(rate))}, cv={re.escape(repr(cv))}$"):
            workloads.arrival_times(n, rate, cv=cv)
    assert workloads.requests(0, 1.0) == [] and len(workloads.requests(np.int64(3), np.float64(2.0))) == 3


# ---------------------------------------------------------------------------- invariants of a run

def check_accounting(reqs, res):
    assert [r["id"] for r in res] == sorted(q["id"] for q in reqs)  # every request, exactly once
    by_id = {q["id"]: q for q in reqs}
    for r in res:
        q = by_id[r["id"]]
        assert r["tokens"] == q["output"]  # every token accounted for
        assert (r["input"], r["output"], r["arrival"], r["kind"]) == (q["input"], q["output"], q["arrival"], q.get("kind", ""))
        assert 0 <= r["queue"] <= r["ttft"] <= r["e2e"] and math.isfinite(r["e2e"])
        assert r["decode"] == pytest.approx(r["e2e"] - r["ttft"], abs=1e-9)
        assert r["prefill"] > 0
        if r["preemptions"] == 0:  # in prefill only between its admission and its first token
            assert r["prefill"] <= r["ttft"] - r["queue"] + 1e-9
        if q["output"] > 1:
            assert r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / (q["output"] - 1))
            assert r["tpot"] <= r["itl_max"] + 1e-12 and r["itl_max"] <= r["e2e"] - r["ttft"] + 1e-12  # mean <= max <= sum
        else:
            assert math.isnan(r["tpot"]) and math.isnan(r["itl_max"])


def check_trace(reqs, res, trace, policy):
    """What the step trace shows must agree with the results and respect the policy's limits."""
    for s in trace:
        assert s["start"] < s["end"]
        assert s["prefill"] or s["decode"]  # no empty step
        assert not (set(s["prefill"]) & set(s["decode"]))  # a request prefills or decodes, not both
        assert len(s["prefill"]) + len(s["decode"]) <= (policy.max_batch if policy.kind != "continuous" else policy.max_running)
        if policy.prefill_first and s["prefill"]:
            assert not s["decode"]
        if policy.chunk is not None:
            assert sum(s["prefill"].values()) <= policy.token_budget and max(s["prefill"].values(), default=0) <= policy.chunk
        elif policy.kind == "continuous" and len(s["prefill"]) > 1:
            assert sum(s["prefill"].values()) <= policy.token_budget
        if policy.kv_capacity is not None:
            assert s["kv"] <= policy.kv_capacity
    for a, b in zip(trace, trace[1:]):
        assert a["end"] <= b["start"]  # steps follow each other
    assert trace[-1]["kv"] == 0  # everything finished, nothing held
    times, prefilled, finished, preempted = defaultdict(list), Counter(), Counter(), Counter()
    for s in trace:
        for i in s["yielded"]:
            times[i].append(s["end"])
        prefilled.update(s["prefill"])
        finished.update(s["finished"])
        preempted.update(s["preempted"])
    for r in res:
        t = times[r["id"]]
        assert len(t) == r["output"]
        assert all(a < b for a, b in zip(t, t[1:]))  # token times move forward
        assert t[0] == pytest.approx(r["arrival"] + r["ttft"]) and t[-1] == pytest.approx(r["arrival"] + r["e2e"])
        if len(t) > 1:
            assert max(b - a for a, b in zip(t, t[1:])) == r["itl_max"]
        assert finished[r["id"]] == 1 and preempted[r["id"]] == r["preemptions"]
        if r["preemptions"] == 0:
            assert prefilled[r["id"]] == r["input"]  # each prompt token prefilled once
        else:  # and again after a pre-emption, with what it had generated
            assert prefilled[r["id"]] >= r["input"]


POLICIES = [
    simulator.Policy("static", max_batch=8),
    simulator.Policy("dynamic", max_batch=8, max_wait=0.02),
    simulator.Policy("continuous", token_budget=4096, max_running=32),
    simulator.Policy("continuous", token_budget=4096, chunk=512),
    simulator.Policy("continuous", token_budget=4096, chunk=512, kv_capacity=40000),
    simulator.Policy("continuous", token_budget=4096, max_running=32, prefill_first=True),
    simulator.Policy("continuous", token_budget=4096, chunk=1024, buckets=(
        simulator.Bucket("short", 2048, priority=0), simulator.Bucket("long", 10**9, priority=1, max_running=2))),
    simulator.Policy("continuous", token_budget=16384, max_running=64, max_wait=0.05, prefill_first=True),
    simulator.Policy("continuous", token_budget=2048, chunk=1024, kv_capacity=40000, buckets=(
        simulator.Bucket("short", 2048, priority=0, max_wait=0.0), simulator.Bucket("long", 10**9, priority=1, max_wait=0.1))),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}-{p.chunk}-{p.kv_capacity}-{len(p.buckets)}-{p.max_wait}")
def test_every_request_finishes_once_and_runs_are_reproducible(policy):
    reqs = workloads.requests(300, 4.0, mix=MIX, seed=7)
    trace = []
    res = simulator.simulate(reqs, COST, policy, trace=trace)
    check_accounting(reqs, res)
    check_trace(reqs, res, trace, policy)
    assert simulator.simulate(reqs, COST, policy) == res  # same input, same output, bit for bit


@st.composite
def policies(draw):
    kind = draw(st.sampled_from(["static", "dynamic", "continuous"]))
    kw = {"max_batch": draw(st.integers(1, 6)), "max_running": draw(st.integers(1, 8)),
          "token_budget": draw(st.integers(1, 200)), "max_wait": draw(st.sampled_from([0.0, 0.001, 0.05])),
          "prefill_first": draw(st.booleans()), "kv_capacity": draw(st.one_of(st.none(), st.integers(80, 300)))}
    if kind == "continuous":
        kw["chunk"] = draw(st.one_of(st.none(), st.integers(1, 64)))
        if draw(st.booleans()):
            kw["buckets"] = (simulator.Bucket("short", 16, priority=draw(st.integers(0, 1)),
                                            max_wait=draw(st.sampled_from([None, 0.0, 0.01]))),
                             simulator.Bucket("long", 10**6, priority=draw(st.integers(0, 1)),
                                            max_running=draw(st.one_of(st.none(), st.integers(1, 3)))))
    return simulator.Policy(kind, **kw)


@st.composite
def small_workloads(draw):
    n = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0005, 0.003, 0.02, 0.5]), min_size=n, max_size=n))
    t, reqs = 0.0, []
    for i, g in enumerate(gaps):
        t += g
        reqs.append({"id": 100 - i, "arrival": t, "kind": draw(st.sampled_from(["a", "b"])),
                     "input": draw(st.integers(1, 60)), "output": draw(st.integers(1, 20))})
    return reqs


SMALL_COST = simulator.MeasuredCostModel.fitted([1, 64], [1e-3, 2e-3], prefill_s_per_work=1e-6, decode_fixed_s=1e-4,
                                              decode_s_per_kv_token=1e-6, overhead_s=1e-4)


@settings(max_examples=150, deadline=None)
@given(reqs=small_workloads(), policy=policies(), seed=st.integers(0, 1000))
def test_small_random_workloads_and_policies(reqs, policy, seed):
    """Every request finishes once with all its tokens; token times increase; TTFT <= E2E; the step trace
    agrees with the results and with the policy's limits; the order the requests are given in does not
    matter; the run is deterministic."""
    trace = []
    res = simulator.simulate(reqs, SMALL_COST, policy, trace=trace)
    check_accounting(reqs, res)
    check_trace(reqs, res, trace, policy)
    shuffled = list(reqs)
    random.Random(seed).shuffle(shuffled)
    assert simulator.simulate(shuffled, SMALL_COST, policy) == res


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), rate=st.floats(0.5, 50), seed=st.integers(0, 10**6), which=st.integers(0, len(POLICIES) - 1))
def test_random_workloads_and_policies(n, rate, seed, which):
    reqs = workloads.requests(n, rate, mix=MIX, seed=seed)
    check_accounting(reqs, simulator.simulate(reqs, COST, POLICIES[which]))


# ---------------------------------------------------------------------------- what the policies do, at scale

def test_preemption_recomputes_and_still_finishes():
    reqs = workloads.requests(200, 20.0, mix=MIX, seed=2)
    policy = simulator.Policy("continuous", token_budget=8192, chunk=1024, kv_capacity=40000)
    trace = []
    res = simulator.simulate(reqs, COST, policy, trace=trace)
    check_accounting(reqs, res)
    check_trace(reqs, res, trace, policy)
    assert sum(r["preemptions"] for r in res) > 0


def test_chunked_prefill_shortens_short_requests_wait_behind_long_ones():
    reqs = workloads.requests(600, 6.0, mix=MIX, seed=3)
    whole = simulator.summary(simulator.simulate(reqs, COST, simulator.Policy("continuous", token_budget=32768)), "chat")
    chunked = simulator.summary(simulator.simulate(reqs, COST, simulator.Policy("continuous", token_budget=32768, chunk=1024)),
                              "chat")
    assert chunked["ttft_p95"] < whole["ttft_p95"]


def test_prefill_first_makes_running_requests_wait():
    """With prefill pre-empting decode, steps that prefill run no decode: decode gaps grow."""
    reqs = workloads.requests(300, 6.0, mix=MIX, seed=9)
    mixed = simulator.simulate(reqs, COST, simulator.Policy("continuous", token_budget=8192))
    first = simulator.simulate(reqs, COST, simulator.Policy("continuous", token_budget=8192, prefill_first=True))
    check_accounting(reqs, first)
    assert simulator.percentile([r["itl_max"] for r in first], 95) > simulator.percentile([r["itl_max"] for r in mixed], 95)


class Recording:
    """A cost that asks for the step's detail and records what the simulator tells it."""

    def __init__(self):
        self.calls = []

    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        raise AssertionError("a cost with step_detail must be asked through it")

    def step_detail(self, tokens, prefill_ctx_work, decode_kv_tokens, *, prefills, decode_ctx_max):
        self.calls.append((tokens, decode_kv_tokens, prefills, decode_ctx_max))
        return 1e-3


def test_a_detailed_cost_hears_how_many_prompts_and_the_longest_decode():
    """By hand: A (4 prompt tokens, 3 out) and B (10, 2) arrive together. Step 1 prefills both (2 prompts, no
    decode); step 2 decodes both (KV 4 + 1 and 10 + 1: the longest 11); B is done, step 3 decodes A (4 + 2)."""
    cost = Recording()
    reqs = [{"id": 0, "arrival": 0.0, "input": 4, "output": 3}, {"id": 1, "arrival": 0.0, "input": 10, "output": 2}]
    res = simulator.simulate(reqs, cost, simulator.Policy("continuous", token_budget=64))
    assert cost.calls == [(14, 0, 2, 0), (2, 16, 0, 11), (1, 6, 0, 6)]
    assert [r["e2e"] for r in res] == pytest.approx([3e-3, 2e-3])


class Microsecond:
    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        return 1e-6


def test_a_batching_window_holds_prompts_until_it_closes_or_fills():
    reqs = [{"id": 0, "arrival": 0.0, "kind": "a", "input": 10, "output": 2},
            {"id": 1, "arrival": 0.001, "kind": "a", "input": 10, "output": 2},
            {"id": 2, "arrival": 1.0, "kind": "a", "input": 10, "output": 2}]
    held = simulator.simulate(reqs, Microsecond(), simulator.Policy("continuous", max_wait=0.05, token_budget=1000))
    assert held[0]["queue"] == pytest.approx(0.05) and held[1]["queue"] == pytest.approx(0.049)
    assert held[2]["queue"] == 0.0  # the last arrival: nothing more to wait for
    full = simulator.simulate(reqs, Microsecond(), simulator.Policy("continuous", max_wait=0.05, token_budget=20))
    assert full[0]["queue"] == pytest.approx(0.001)  # two prompts fill the budget: the window closes early
    short = simulator.Bucket("short", 10, 0, None, 0.0)
    long_ = simulator.Bucket("long", 10**6, 1)
    split = simulator.simulate(reqs, Microsecond(), simulator.Policy("continuous", max_wait=0.05, buckets=(short, long_)))
    assert split[0]["queue"] == 0.0  # the short bucket has no window
    own = simulator.simulate(reqs, Microsecond(),
                             simulator.Policy("continuous", buckets=(simulator.Bucket("w", 10, max_wait=0.02),)))
    assert own[0]["queue"] == pytest.approx(0.02)  # a bucket's own window, the policy having none
    unused = simulator.simulate(reqs, Microsecond(), simulator.Policy("static", max_batch=1, max_wait=0.05))
    assert unused[0]["queue"] == 0.0  # static batching has no window: max_wait is not used


def test_dynamic_batch_starts_when_full_before_its_deadline():
    reqs = [{"id": i, "arrival": 0.001 * i, "input": 4, "output": 1} for i in range(3)]
    res = simulator.simulate(reqs, Microsecond(), simulator.Policy("dynamic", max_batch=2, max_wait=1.0))
    assert [r["queue"] for r in res] == pytest.approx([0.001, 0.0, 0.0])  # 0, 1 at 1 ms; 2 is the last arrival


def test_the_last_bucket_takes_prompts_longer_than_every_max_input():
    reqs = [{"id": 0, "arrival": 0.0, "input": 30, "output": 1}, {"id": 1, "arrival": 0.0, "input": 10, "output": 1},
            {"id": 2, "arrival": 0.0, "input": 11, "output": 1}]
    res = simulator.simulate(reqs, Microsecond(),
                             simulator.Policy(buckets=(simulator.Bucket("a", 10), simulator.Bucket("b", 20))))
    assert [r["bucket"] for r in res] == ["b", "a", "b"] and [r["kind"] for r in res] == ["", "", ""]


# ---------------------------------------------------------------------------- bad input

def test_bad_configuration_and_requests_are_rejected():
    reqs = workloads.requests(5, 1.0, seed=0)
    with pytest.raises(ValueError, match=r"^kind must be 'static', 'dynamic' or 'continuous', got 'greedy'$"):
        simulator.Policy("greedy")
    with pytest.raises(ValueError, match=r"^buckets need the continuous policy$"):
        simulator.Policy("static", buckets=(simulator.Bucket("a", 10),))
    with pytest.raises(ValueError, match=r"^chunk \(chunked prefill\) needs the continuous policy: a static or "
                                         r"dynamic batch prefills whole prompts$"):
        simulator.Policy("dynamic", chunk=64)
    with pytest.raises(ValueError, match=r"^buckets must be listed by increasing max_input$"):
        simulator.Policy(buckets=(simulator.Bucket("a", 10), simulator.Bucket("b", 5)))
    with pytest.raises(ValueError, match=r"^buckets must be a tuple of Bucket"):
        simulator.Policy(buckets=(("a", 10),))
    for bad in [dict(max_batch=0), dict(max_running=0), dict(token_budget=0), dict(token_budget=2.5),
                dict(max_running=True)]:
        with pytest.raises(ValueError, match=r"^max_batch, max_running and token_budget must be whole numbers >= 1 "
                                             r"and max_wait >= 0 s; got " + re.escape(f"{bad}") + "$"):
            simulator.Policy(**bad)
    for wait in (-0.1, math.nan, "1"):
        with pytest.raises(ValueError, match=r"max_wait >= 0 s; got \{'max_wait'"):
            simulator.Policy(max_wait=wait)
    for chunk in (0, 1.5):
        with pytest.raises(ValueError, match=r"^chunk must be >= 1 tokens or None, got"):
            simulator.Policy(chunk=chunk)
    for cap in (0, 10.5):
        with pytest.raises(ValueError, match=r"^kv_capacity must be a positive number of tokens or None, got"):
            simulator.Policy(kv_capacity=cap)
    simulator.Policy(kv_capacity=1, chunk=1, max_batch=1, max_running=1, token_budget=1, max_wait=0)  # the smallest allowed
    simulator.Policy(max_wait=np.float64(0.5), token_budget=np.int64(64))
    with pytest.raises(ValueError, match=r"more than the capacity 10: raise kv_capacity or drop the request$"):
        simulator.simulate(reqs, COST, simulator.Policy(kv_capacity=10))
    with pytest.raises(ValueError, match=r"^request 0 needs 11 tokens of KV, more than the capacity 10: raise "
                                         r"kv_capacity or drop the request$"):
        simulator.simulate([{"id": 0, "arrival": 0.0, "input": 6, "output": 5}], COST, simulator.Policy(kv_capacity=10))
    exact = [{"id": 0, "arrival": 0.0, "input": 6, "output": 4}]
    assert simulator.simulate(exact, COST, simulator.Policy(kv_capacity=10))[0]["preemptions"] == 0  # exactly fits
    for k, v in [("input", 0), ("output", 0), ("output", -2)]:
        with pytest.raises(ValueError, match=rf"^request 0: {k} must be at least 1 token, got {v}$"):
            simulator.simulate([{"id": 0, "arrival": 0.0, "input": 3, "output": 3} | {k: v}], COST, simulator.Policy())
    simulator.simulate([{"id": 0, "arrival": 0.0, "input": 1, "output": 1}], COST, simulator.Policy())
    for t in (-1.0, math.inf):
        with pytest.raises(ValueError, match=r"^request 7: arrival .* must be a finite time >= 0 \(seconds\); a NaN"):
            simulator.simulate([{"id": 7, "arrival": t, "input": 3, "output": 3}], COST, simulator.Policy())
    for k, v in [("input", 1.9), ("input", 2.0), ("output", True), ("output", "3"), ("input", None)]:
        with pytest.raises(ValueError, match=rf"^request 4: {k} must be a whole number of tokens, got "
                                             rf"{re.escape(repr(v))}: round lengths before simulating"):
            simulator.simulate([{"id": 4, "arrival": 0.0, "input": 3, "output": 3} | {k: v}], COST, simulator.Policy())
    assert simulator.simulate([{"id": 4, "arrival": 0.0, "input": np.int64(3), "output": 2}], COST,
                            simulator.Policy())[0]["input"] == 3  # a numpy integer is a whole number
    for r, missing in [({"arrival": 0.0, "input": 3, "output": 3}, "['id']"), ({"id": 1, "input": 3}, "['arrival', 'output']"),
                       ((1, 0.0, 3, 3), "['id', 'arrival', 'input', 'output']")]:
        with pytest.raises(ValueError, match=rf"^request #1 \(.*\) lacks {re.escape(missing)}: each request is a dict"):
            simulator.simulate([{"id": 0, "arrival": 0.0, "input": 3, "output": 3}, r], COST, simulator.Policy())
    for t in ("1", True, None):
        with pytest.raises(ValueError, match=r"^request 5: arrival .* must be a finite time >= 0"):
            simulator.simulate([{"id": 5, "arrival": t, "input": 3, "output": 3}], COST, simulator.Policy())
    twice = [{"id": 3, "arrival": 0.0, "input": 3, "output": 3}] * 2
    with pytest.raises(ValueError, match=r"^request ids must be unique: each result is reported under its request's id$"):
        simulator.simulate(twice, COST, simulator.Policy())


def test_bad_buckets_are_rejected():
    for kw, msg in [(dict(max_input=0), "max_input must be a whole number of tokens >= 1"),
                    (dict(max_input=2.5), "max_input must be a whole number of tokens >= 1"),
                    (dict(max_input=10, max_running=0), "max_running must be at least 1 \\(or None for no cap\\)"),
                    (dict(max_input=10, max_wait=-1.0), "max_wait must be >= 0 s \\(or None for the policy's\\)")]:
        with pytest.raises(ValueError, match=rf"^bucket 'x': {msg}, got"):
            simulator.Bucket("x", **kw)
    simulator.Bucket("x", 1, max_running=1, max_wait=0.0)  # the smallest allowed


def test_bad_costs_and_times_are_rejected_not_simulated():
    """A NaN rate, a NaN arrival or a cost model that gives a non-positive step would stall or reverse the
    clock: each is refused with a message saying what to fix."""
    with pytest.raises(ValueError, match="finite rate"):
        workloads.arrival_times(3, float("nan"))
    with pytest.raises(ValueError, match="finite rate"):
        workloads.arrival_times(3, math.inf)
    reqs = [{"id": 0, "arrival": float("nan"), "input": 8, "output": 2}]
    with pytest.raises(ValueError, match="arrival"):
        simulator.simulate(reqs, COST, simulator.Policy())

    class Broken:
        def __init__(self, value):
            self.value = value

        def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
            return self.value

    # a negative or non-finite step is refused by the step-cost protocol (lib.engine.cost.step_seconds), as
    # the engine refuses it; a step of 0 s, which the engine allows, by the simulator, whose clock must move
    for value in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=rf"^the cost model's step\(8, 32.0, 0\) returned {value!r}: a cost model "
                                             r"must return the step's time in seconds, a finite float >= 0$"):
            simulator.simulate([{"id": 0, "arrival": 0.0, "input": 8, "output": 2}], Broken(value), simulator.Policy())
    with pytest.raises(ValueError, match=r"^the cost model gives 0.0 s for a step of 8 prefill and 0 decode "
                                         r"tokens \(0 of KV\): a step must take a positive, finite time; check"):
        simulator.simulate([{"id": 0, "arrival": 0.0, "input": 8, "output": 2}], Broken(0.0), simulator.Policy())


def test_a_stuck_engine_fails_loudly_instead_of_spinning(monkeypatch):
    """If the simulation ever stops moving (here: a wake-up that does not move the clock), the run raises.
    Loop turns: turn 1 queues request 0 (an arrival: progress seen at turn 2's check); turns 2 to 6 wake
    up without progress; turn 7's check counts 5 turns without progress, more than the limit of
    STALL_LIMIT 3 + 1 queue + 0 tokens to recompute = 4, and raises before waking: six wake-ups. The
    patched wake-up gives up after 100 (a guard that never fires must fail this test, not hang it)."""
    calls = []

    def stuck(self):
        calls.append(self.now)
        assert len(calls) < 100, "the no-progress guard did not fire"
        return self.now

    monkeypatch.setattr(simulate_module.Simulation, "wake_time", stuck)
    reqs = [{"id": 0, "arrival": 0.0, "input": 4, "output": 1}, {"id": 1, "arrival": 1.0, "input": 4, "output": 1}]
    with pytest.raises(RuntimeError, match=r"^the simulation made no progress in 5 loop turns \(no arrival, no token, "
                                           r"no prompt token prefilled for the first time\) at t=0.000000 s: 0 running; "
                                           r"1 queued; 0 of 2 done; 0 tokens of KV in use \(unbounded\); a bug in the "
                                           r"scheduler or the policy, not in the workload$"):
        simulator.simulate(reqs, Microsecond(), simulator.Policy("static", max_batch=2))
    assert len(calls) == 6 and simulate_module.STALL_LIMIT == 3


def test_a_finished_request_leaves_nothing_to_recompute_in_the_stall_limit(monkeypatch):
    """Requests 0 and 1 (a full static batch of 2) prefill 4 tokens each and finish in turn 1: the KV they
    may recompute drops back to 0. Turn 2 jumps to 5 s; turn 3 queues request 2, whose batch waits for
    request 3 (at 6 s), and the stuck wake-up never gets there: turns 4 to 8 change nothing, and turn 9's
    check, the 5th without progress, is over the limit of STALL_LIMIT 3 + 1 queue + 0 = 4."""
    monkeypatch.setattr(simulate_module.Simulation, "wake_time", lambda self: self.now)
    reqs = [{"id": i, "arrival": t, "input": 4, "output": 1} for i, t in enumerate((0.0, 0.0, 5.0, 6.0))]
    with pytest.raises(RuntimeError, match=r"^the simulation made no progress in 5 loop turns .* at t=5.000000 s: "
                                           r"0 running; 1 queued; 2 of 4 done; 0 tokens of KV in use \(unbounded\);"):
        simulator.simulate(reqs, Microsecond(), simulator.Policy("static", max_batch=2))


def test_the_stuck_state_names_eight_running_requests_and_counts_the_rest():
    """The error's state lists the first 8 running requests (id, prefilled of target, generated of output)
    and counts the others; the KV capacity is named. A decoding request's prefilled count runs past its
    target (each decode writes one more token): the state shows it at its target."""
    policy = simulator.Policy(kv_capacity=50)
    reqs = [{"id": i, "arrival": 0.0, "input": 3, "output": 2} for i in range(10)]
    sim = simulate_module.Simulation(simulate_module.requests(reqs, policy), Microsecond(), policy)
    s = sim.scheduler
    s.running = sim.requests[:10]
    sim.requests[9].prefilled, sim.requests[0].output, s.kv.used = 2, [0], 7
    sim.requests[1].prefilled = 4  # prefilled its 3 and decoded once
    listed = ", ".join(f"{i} (prefilled {3 if i == 1 else 0}/3, generated {int(i == 0)}/2)" for i in range(8))
    assert sim.state() == f"10 running: {listed} and 2 more; 0 queued; 0 of 10 done; 7 tokens of KV in use (of 50)"
    s.running = sim.requests[:9]
    assert sim.state().startswith(f"9 running: {listed} and 1 more; 0 queued")
    s.running = sim.requests[:8]
    assert sim.state().startswith(f"8 running: {listed}; 0 queued")
    s.running = []
    s.queues[0].extend(sim.requests[:2])
    assert sim.state() == "0 running; 2 queued; 0 of 10 done; 7 tokens of KV in use (of 50)"


class Charging:
    """1 ms a step, empty or not; counts its calls."""

    def __init__(self):
        self.calls = 0

    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        self.calls += 1
        return 1e-3


def test_an_empty_plan_is_never_run_as_a_step(monkeypatch):
    """A plan with nothing to run is not a step: under a cost model that charges for an empty step, running
    it would move the clock without end. Planted: a scheduler that admits as usual and then plans nothing.
    The simulator never asks the cost model about it; with every request in, no window and no arrival to
    wait for, nothing can change the plan, and the run stops with an error at its first plan. (Its message
    today is ``Simulation.wake_time``'s "requests are queued but the policy can admit none of them", though
    the request runs and none is queued: not asserted here.)"""
    plans = []

    def empty(self, now):
        plans.append(now)
        assert len(plans) < 100, "the empty plan was run or retried without end"
        return Plan(admitted=self.admit(now))

    monkeypatch.setattr(simulate_module.Scheduler, "schedule", empty)
    cost, trace = Charging(), []
    with pytest.raises(RuntimeError):
        simulator.simulate([{"id": 0, "arrival": 0.0, "input": 4, "output": 1}], cost, simulator.Policy(), trace=trace)
    assert plans == [0.0] and cost.calls == 0 and trace == []


def test_a_policy_that_admits_nobody_when_no_more_will_arrive_is_an_error(monkeypatch):
    monkeypatch.setattr(simulate_module.Scheduler, "admit", lambda self, now: [])
    with pytest.raises(RuntimeError, match=r"^requests are queued but the policy can admit none of them: check the "
                                           r"bucket limits and the KV capacity$"):
        simulator.simulate([{"id": 0, "arrival": 0.0, "input": 4, "output": 1}], Microsecond(), simulator.Policy())


# ---------------------------------------------------------------------------- metrics

def test_percentiles_by_hand():
    xs = [50.0, 10.0, math.nan, 40.0, 20.0, 30.0]  # sorted 10 .. 50 without the NaN: ranks 0 .. 4
    assert simulator.percentile(xs, 0) == 10.0 and simulator.percentile(xs, 100) == 50.0
    assert simulator.percentile(xs, 50) == 30.0
    assert simulator.percentile(xs, 95) == pytest.approx(48.0)  # rank 3.8: 40 + 0.8 x 10
    assert simulator.percentile(xs, 99) == pytest.approx(49.6)  # rank 3.96
    assert simulator.percentile(xs, 10) == pytest.approx(14.0)  # rank 0.4
    assert simulator.percentile([1, 2, 3, 4], 50) == 2.5 and simulator.percentile([5], 99) == 5
    assert math.isnan(simulator.percentile([], 50)) and math.isnan(simulator.percentile([math.nan], 50))
    for p in (-50, -1, -1e-9, 100.5, 100 + 1e-9, math.nan, math.inf, "50", True, None):
        with pytest.raises(ValueError, match=rf"^p must be a percentile between 0 and 100, got {re.escape(repr(p))}$"):
            simulator.percentile(xs, p)
    assert simulator.percentile(xs, np.float64(50)) == 30.0 and simulator.percentile(xs, np.int64(100)) == 50.0


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=30), p=st.floats(0, 100))
def test_percentile_agrees_with_numpy(xs, p):
    assert simulator.percentile(xs, p) == pytest.approx(float(np.percentile(xs, p)), rel=1e-9, abs=1e-6)


def test_summary_covers_every_metric():
    reqs = workloads.requests(100, 2.0, mix=MIX, seed=1)
    res = simulator.simulate(reqs, COST, simulator.Policy())
    s = simulator.summary(res)
    assert list(s) == ["requests", "tokens_per_s"] + [f"{m}_p{p}" for m in ("ttft", "tpot", "e2e", "queue") for p in (50, 95, 99)]
    assert s["requests"] == 100 and s["ttft_p50"] <= s["ttft_p95"] <= s["ttft_p99"]
    span = max(r["arrival"] + r["e2e"] for r in res) - min(r["arrival"] for r in res)
    assert s["tokens_per_s"] == pytest.approx(sum(r["output"] for r in reqs) / span)
    assert s["e2e_p50"] == simulator.percentile([r["e2e"] for r in res], 50)
    assert simulator.summary([]) == {}


def test_goodput_counts_only_requests_within_their_slos():
    res = [{"kind": "a", "arrival": 0.0, "e2e": 2.0, "ttft": 0.1, "tpot": 0.01, "tokens": 100},
           {"kind": "a", "arrival": 0.0, "e2e": 2.0, "ttft": 0.5, "tpot": 0.01, "tokens": 50},
           {"kind": "b", "arrival": 1.0, "e2e": 1.0, "ttft": 0.1, "tpot": 0.05, "tokens": 30},
           {"kind": "b", "arrival": 1.0, "e2e": 1.0, "ttft": 0.1, "tpot": math.nan, "tokens": 1}]
    assert simulator.goodput(res, 0.2, 0.02) == pytest.approx(101 / 2.0)
    assert simulator.goodput(res, 1.0, 1.0, kind="a") == pytest.approx(150 / 2.0)
    assert simulator.goodput(res, 0.5, 0.05) == pytest.approx(181 / 2.0)  # both limits inclusive
    with pytest.raises(ValueError, match=r"^goodput of no requests: a run's tokens/s needs its span, from the first "
                                         r"arrival to the last finish; simulate at least one request$"):
        simulator.goodput([], 1.0, 1.0)
    assert simulator.goodput(res, 1.0, 1.0, kind="c") == 0.0  # a kind with no request: none met its SLOs
    assert simulator.goodput(res, math.inf, math.inf) == pytest.approx(181 / 2.0)  # no limit: every token counts
    short = [{"kind": "a", "arrival": 0.0, "e2e": 0.5, "ttft": 0.1, "tpot": 0.01, "queue": 0.0, "tokens": 10}]
    assert simulator.goodput(short, 1.0, 1.0) == 20.0 and simulator.summary(short)["tokens_per_s"] == 20.0  # a span < 1 s
    instant = [{"kind": "a", "arrival": 1.0, "e2e": 0.0, "ttft": 0.0, "tpot": math.nan, "queue": 0.0, "tokens": 1}]
    assert math.isnan(simulator.goodput(instant, 1.0, 1.0)) and math.isnan(simulator.summary(instant)["tokens_per_s"])
    for slos in [(0.0, 0.02), (0.2, 0.0), (-0.2, 0.02), (math.nan, 0.02), (0.2, math.nan), ("0.2", 0.02), (0.2, True),
                 (None, 0.02)]:
        with pytest.raises(ValueError, match=rf"^SLOs must be positive seconds, got TTFT {re.escape(repr(slos[0]))} "
                                             rf"and TPOT {re.escape(repr(slos[1]))}$"):
            simulator.goodput(res, *slos)
        with pytest.raises(ValueError, match=r"^SLOs must be positive seconds"):
            simulator.goodput([], *slos)  # the SLOs are checked first, whatever the results


# ---------------------------------------------------------------------------- the cost model

def test_cost_model_interpolates_log_log():
    m = simulator.MeasuredCostModel((10, 100, 1000), (1e-3, 1e-2, 2e-2), prefill_s_per_work=0.0, decode_fixed_s=0.0,
                                  decode_s_per_kv_token=0.0)
    assert m.linear(10) == 1e-3 and m.linear(1) == 1e-3 and m.linear(100) == pytest.approx(1e-2)
    assert m.linear(50) == pytest.approx(5e-3)  # 10 .. 100: t grows as M (slope 1 on log-log axes)
    assert m.linear(1000 ** 0.5 * 10) == pytest.approx(2 ** 0.5 * 1e-2)  # halfway in log M: halfway in log t
    assert m.linear(1000) == pytest.approx(2e-2) and m.linear(2000) == pytest.approx(4e-2)  # beyond: linear in M
    assert m.step(0, 0, 0) == 0.0 and m.step(-3, 5.0, 7) == 0.0  # an empty step costs nothing


def test_cost_model_adds_its_terms_by_hand():
    """step = overhead + linear(M) + prefill_s_per_work W + [K > 0] (decode_fixed + decode_s_per_kv_token K)."""
    cm = simulator.MeasuredCostModel.fitted([10, 100, 1000], [1e-3, 1e-2, 2e-2], prefill_s_per_work=1e-9,
                                          decode_fixed_s=2e-4, decode_s_per_kv_token=1e-8, overhead_s=5e-5)
    assert (cm.m_points, cm.linear_s) == ((10, 100, 1000), (1e-3, 1e-2, 2e-2))
    assert (cm.prefill_s_per_work, cm.decode_fixed_s, cm.decode_s_per_kv_token, cm.overhead_s) == (1e-9, 2e-4, 1e-8, 5e-5)
    assert cm.step(50, 0.0, 0) == pytest.approx(5e-5 + 5e-3)
    assert cm.step(50, 1000.0, 0) == pytest.approx(5e-5 + 5e-3 + 1e-6)
    assert cm.step(50, 0.0, 10_000) == pytest.approx(5e-5 + 5e-3 + 2e-4 + 1e-4)
    assert cm.step(50, 1000.0, 10_000) == pytest.approx(5e-5 + 5e-3 + 1e-6 + 2e-4 + 1e-4)
    lists = simulator.MeasuredCostModel([1, 64], [1e-3, 2e-3], 1e-9, 0.0, 0.0)
    assert (lists.m_points, lists.linear_s) == ((1, 64), (1e-3, 2e-3))  # kept as tuples: the model is frozen
    no_kv = simulator.MeasuredCostModel.fitted([1, 64], [1e-3, 2e-3], 1e-9, 0.0, 0.0)
    assert no_kv.overhead_s == 0.0 and no_kv.step(4, 0.0, 100) == no_kv.linear(4)  # no cost per KV token: none added


def test_bad_cost_models_are_rejected():
    ok = dict(prefill_s_per_work=1e-9, decode_fixed_s=0.0, decode_s_per_kv_token=1e-9)
    for ms, ts in [([100, 1], [1, 1]), ([1, 1], [1, 1]), ([0, 4], [1, 1]), ([-1, 4], [1, 1]), ([1, math.inf], [1, 1])]:
        with pytest.raises(ValueError, match=r"^m_points must be positive token counts in increasing order, got"):
            simulator.MeasuredCostModel.fitted(ms, ts, **ok)
    for ms, ts in [([1], [1.0]), ([1, 2], [1.0]), ([1, 2, 3], [1.0, 2.0])]:
        with pytest.raises(ValueError, match=r"^need at least two m_points and one forward time for each, got"):
            simulator.MeasuredCostModel.fitted(ms, ts, **ok)
    for ts in ([0.0, 1.0], [1.0, -1.0], [1.0, math.nan], [1.0, math.inf], [1.0, True]):
        with pytest.raises(ValueError, match=r"^every forward time must be positive and finite \(seconds\), got"):
            simulator.MeasuredCostModel.fitted([1, 2], ts, **ok)
    for name in ("prefill_s_per_work", "decode_fixed_s", "decode_s_per_kv_token", "overhead_s"):
        for value in (-1e-9, math.nan, math.inf, None):
            with pytest.raises(ValueError, match=rf"^costs must be finite and >= 0, got {{'{name}': {value!r}}}: a "
                                                 r"negative slope fitted from timings means their noise exceeds"):
                simulator.MeasuredCostModel.fitted([1, 2], [1.0, 2.0], **(ok | {name: value}))
    simulator.MeasuredCostModel.fitted(np.array([1, 2]), np.array([1e-3, 2e-3]), 0.0, 0.0, 0.0, 0.0)  # zeros allowed
