"""The engine's scheduler, its step records and its metrics against oracles worked out by hand: tiny workloads
on a virtual clock where every step lasts exactly 1 s, so that each schedule (who is admitted, who is
pre-empted, in what order it resumes) and each latency is a small number derived in the comments; the
percentiles against numpy's. No model, no wall clock: the whole file runs in well under a second."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lib.engine import EngineConfig, EngineOverloaded, LLMEngine, SamplingParams, replay
from lib.engine.metrics import PrometheusExporter, decomposition, goodput, summary
from lib.engine.scheduler import FINISHED, RUNNING, WAITING


class Unit:
    """Every step lasts ``dt`` s (1 by default), whatever it holds: times on the virtual clock are whole
    multiples of it, exact in floats."""

    def __init__(self, dt=1.0):
        self.dt = dt

    def step(self, tokens, work, kv):
        return self.dt


def sp(n):
    return SamplingParams(max_tokens=n, ignore_eos=True)


def engine(dt=1.0, **kw):
    cfg = dict(block_size=2, max_model_len=64, enable_prefix_caching=False)
    cfg.update(kw)
    num_blocks = cfg.pop("num_blocks")
    return LLMEngine.virtual(EngineConfig(**cfg), Unit(dt), vocab=50, num_blocks=num_blocks)


def run(e, limit=100, close=True):
    """``e.close(); e.run()`` (``close=False``: ``e.run()`` alone), but a loop that would never end fails after
    ``limit`` steps instead of hanging."""
    calls = [0]
    step = e.step

    def counted():
        calls[0] += 1
        if calls[0] > limit:
            raise AssertionError(f"more than {limit} steps: the engine loops")
        return step()

    e.step = counted
    if close:
        e.close()
    e.run()
    del e.step


def scrape(exporter) -> dict:
    """The exporter's page as {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(x.name, tuple(sorted(x.labels.items()))): x.value for f in text_string_to_metric_families(exporter.text())
            for x in f.samples}


def trace(e):
    return [(s["start"], s["end"], s["prefill"], s["decode"], s["yielded"], s["finished"], s["preempted"])
            for s in e.steps]


def by_id(e):
    return {r["id"]: r for r in e.results()}


# ---------------------------------------------------------------------------- pre-emption, by hand

def preemption_run(dt=1.0, exporter=False):
    """A (2-token prompt, 8 tokens out) starts alone; B (2 + 4) and C (2 + 2) are added after its first step,
    at t = 1. Blocks of 2 tokens, 5 blocks, 2 requests at most running (so C waits).

    step  t    blocks (free after)       what happens
    1     0-1  A 1 (4)                   A prefills [1, 2]: token 1 of A at t=1 (A holds 3 tokens)
    2     1-2  B 1, A grows to 2 (2)     B admitted (C waits: 2 running); B prefills, A decodes: B's 1st, A's 2nd
    3     2-3  B grows to 2 (1)          both decode: A 3 tokens, B 2
    4     3-4  A grows to 3 (0)          both decode: A 4, B 3 (B now holds 5 tokens in 2 blocks)
    5     4-5  B needs a 3rd: none free  the newest admitted (B, at t=1; A at t=0) is pre-empted: its 2 blocks
                                         come back, it goes to the FRONT of the queue (B, C) to prefill 2 + 3
                                         tokens again; A decodes: 5 tokens
    6     5-6  A grows to 4 (1)          admission: B first, 5 tokens need 3 blocks, 2 free: nobody is admitted
                                         (C, behind it, waits too); A decodes: 6
    7     6-7  (1)                       B still does not fit; A: 7
    8     7-8  A grows to 5 (0)          A: 8, done: its 5 blocks come back (5 free)
    9     8-9  B 3, C 1 (1)              B and C admitted; B recomputes its 5 tokens and gets its 4th (done),
                                         C prefills and gets its 1st
    10    9-10 C grows to 2              C decodes its 2nd: done

    A: tokens at 1..8: TTFT 1, E2E 8, TPOT (8 - 1) / (8 - 1) = 1. B (arrived 1): tokens at 2, 3, 4, 9: TTFT 1,
    E2E 8, TPOT (9 - 2) / 3 = 7/3, ITL 1, 1, 5; queued 0; in prefill steps before its first token: step 2, 1 s
    (step 9 recomputes its KV after it). C (arrived 1): tokens at
    9, 10: TTFT 8, E2E 9, TPOT 1, queued 7 (admitted at 8)."""
    e = engine(dt, max_num_seqs=2, num_blocks=5)
    page = PrometheusExporter(e) if exporter else None
    a = e.add_request([1, 2], sp(8))
    e.step()
    b, c = e.add_request([3, 4], sp(4)), e.add_request([5, 6], sp(2))
    run(e)
    return (e, (a, b, c), page) if exporter else (e, (a, b, c))


def test_the_newest_request_is_preempted_and_resumes_first():
    e, (a, b, c) = preemption_run()
    assert trace(e) == [
        (0.0, 1.0, {a: 2}, [], [a], [], []),
        (1.0, 2.0, {b: 2}, [a], [b, a], [], []),
        (2.0, 3.0, {}, [a, b], [a, b], [], []),
        (3.0, 4.0, {}, [a, b], [a, b], [], []),
        (4.0, 5.0, {}, [a], [a], [], [b]),
        (5.0, 6.0, {}, [a], [a], [], []),
        (6.0, 7.0, {}, [a], [a], [], []),
        (7.0, 8.0, {}, [a], [a], [a], []),
        (8.0, 9.0, {b: 5, c: 2}, [], [b, c], [b], []),
        (9.0, 10.0, {}, [c], [c], [c], []),
    ]
    assert [s["queued"] for s in e.steps] == [0, 1, 1, 1, 2, 2, 2, 2, 0, 0]
    assert [s["running"] for s in e.steps] == [1, 2, 2, 2, 1, 1, 1, 0, 1, 0]
    assert [s["kv_blocks"] for s in e.steps] == [1, 3, 4, 5, 3, 4, 4, 0, 1, 0]
    assert e.scheduler.preemptions == 1 and [e.requests[i].preemptions for i in (a, b, c)] == [0, 1, 0]


def test_the_latencies_of_the_preemption_run_by_hand():
    e, (a, b, c) = preemption_run()
    r = by_id(e)
    got = {i: (r[i]["arrival"], r[i]["ttft"], r[i]["e2e"], r[i]["queue"], r[i]["prefill"], r[i]["itl"], r[i]["output"])
           for i in (a, b, c)}
    assert got == {a: (0.0, 1.0, 8.0, 0.0, 1.0, [1.0] * 7, 8), b: (1.0, 1.0, 8.0, 0.0, 1.0, [1.0, 1.0, 5.0], 4),
                   c: (1.0, 8.0, 9.0, 7.0, 1.0, [1.0], 2)}
    # TPOT: the gaps after the first token over their number (output - 1), not over the output
    assert r[a]["tpot"] == 1.0 and r[c]["tpot"] == 1.0
    assert r[b]["tpot"] == pytest.approx(7 / 3, rel=1e-12)
    assert r[b]["decode"] == 7.0 and r[b]["itl_max"] == 5.0 and r[b]["preemptions"] == 1
    assert all(r[i]["finish_reason"] == "length" and r[i]["tokens"] == r[i]["output"] for i in (a, b, c))


def test_a_tie_in_admission_time_preempts_the_higher_id():
    """A and B (2-token prompts, 3 tokens out) are admitted together at t=0; 3 blocks of 2.

    step 1 (0-1): A 1 block, B 1 block (1 free); both prefill and get their 1st token (3 tokens each).
    step 2 (1-2): A grows to 2 (0 free); B needs a 2nd block: none. Both were admitted at 0: the higher id, B,
                  is pre-empted (its block back: 1 free); A decodes its 2nd.
    step 3 (2-3): B (2 + 1 tokens: 2 blocks) does not fit in 1; A decodes its 3rd, done (3 free).
    step 4 (3-4): B admitted (2 blocks), recomputes 3 tokens, gets its 2nd; step 5 (4-5): its 3rd.
    """
    e = engine(max_num_seqs=2, num_blocks=3)
    a, b = e.add_request([1, 2], sp(3)), e.add_request([3, 4], sp(3))
    run(e)
    assert trace(e) == [
        (0.0, 1.0, {a: 2, b: 2}, [], [a, b], [], []),
        (1.0, 2.0, {}, [a], [a], [], [b]),
        (2.0, 3.0, {}, [a], [a], [a], []),
        (3.0, 4.0, {b: 3}, [], [b], [], []),
        (4.0, 5.0, {}, [b], [b], [b], []),
    ]
    r = by_id(e)
    assert (r[a]["e2e"], r[b]["e2e"], r[b]["itl"], r[b]["tpot"]) == (3.0, 5.0, [3.0, 1.0], 2.0)


def test_a_request_preempted_twice_by_hand():
    """A (2 + 4 tokens), B (2 + 2) and C (2 + 3), all at t=0; 3 may run; 4 blocks of 2.

    step 1 (0-1): each takes a block (1 free), prefills and gets its 1st token (3 tokens each).
    step 2 (1-2): A grows (0 free); B needs a 2nd block: none. All were admitted at 0: the highest id, C, is
                  pre-empted (its block back), B grows (0 free). A's 2nd; B's 2nd, done (2 blocks back).
    step 3 (2-3): C admitted again (2 + 1 tokens: 2 blocks, 0 free), recomputes them: its 2nd token; A's 3rd.
    step 4 (3-4): A needs a 3rd block: none. C, admitted at 2, is the newest: pre-empted again (2 back), A grows
                  and gets its 4th, done (4 free).
    step 5 (4-5): C admitted (2 + 2 tokens), recomputes them: its 3rd, done. C: tokens at 1, 3, 5, three steps
                  of prefill (1, 3 and 5), of which one (step 1) before its first token; pre-empted twice."""
    e = engine(max_num_seqs=3, num_blocks=4)
    exporter = PrometheusExporter(e)
    a, b, c = e.add_request([1, 2], sp(4)), e.add_request([3, 4], sp(2)), e.add_request([5, 6], sp(3))
    run(e)
    assert trace(e) == [
        (0.0, 1.0, {a: 2, b: 2, c: 2}, [], [a, b, c], [], []),
        (1.0, 2.0, {}, [a, b], [a, b], [b], [c]),
        (2.0, 3.0, {c: 3}, [a], [c, a], [], []),
        (3.0, 4.0, {}, [a], [a], [a], [c]),
        (4.0, 5.0, {c: 4}, [], [c], [c], []),
    ]
    assert [s["kv_blocks"] for s in e.steps] == [3, 2, 4, 0, 0]
    r = by_id(e)[c]
    assert (r["ttft"], r["e2e"], r["itl"], r["tpot"], r["prefill"], r["preemptions"]) == (1.0, 5.0, [2.0, 2.0], 2.0,
                                                                                          1.0, 2)
    assert e.scheduler.preemptions == 2 and [e.requests[i].preemptions for i in (a, b, c)] == [0, 0, 2]
    assert scrape(exporter)[("engine_num_preemptions_total", ())] == 2


def test_a_preempted_request_keeps_its_tokens_and_its_place():
    """The pre-empted request's state while it waits, in the run of ``preemption_run``, stopped after step 5:
    its 3 tokens kept, nothing of its KV held, at the front of its queue, to prefill 2 + 3 tokens."""
    e = engine(max_num_seqs=2, num_blocks=5)
    e.add_request([1, 2], sp(8))
    e.step()
    b, c = e.add_request([3, 4], sp(4)), e.add_request([5, 6], sp(2))
    for _ in range(4):
        e.step()
    x = e.requests[b]
    assert e.steps[-1]["preempted"] == [b]
    assert (x.status, x.lease, x.prefilled, x.target, len(x.output)) == (WAITING, None, 0, 5, 3)
    assert [y.id for y in e.scheduler.queues[0]] == [b, c] and e.requests[c].status == WAITING
    assert [y.status for y in e.scheduler.running] == [RUNNING] and e.pool.free_count == 2  # B's 2 back
    run(e)
    assert all(e.requests[i].status == FINISHED for i in e.requests)


# ---------------------------------------------------------------------------- admission and chunks, by hand

def chunked_run():
    """A chunk (and step budget) of 4 prompt tokens. R1 (8-token prompt, 2 out) is added at t=0, R2 (2 + 2,
    arrived at 0.5) and R3 (2 + 1) at t=1.

    step 1 (0-1): R1 admitted, prefills [0, 4).
    step 2 (1-2): R2 and R3 admitted (admission counts 2 + 2 tokens of the budget of 4), but the plan gives
                  R1's second chunk [4, 8) the whole budget: R2 and R3 run without prefilling. R1's 1st token.
    step 3 (2-3): R1 decodes its 2nd (done); R2 and R3 prefill (2 + 2 tokens): their 1st (R3 done).
    step 4 (3-4): R2 decodes its 2nd (done).

    Stages of TTFT (queued + in prefill steps + the rest): R1 0 + 2 + 0 = 2, R2 0.5 + 1 + 1 = 2.5 (admitted at
    1, step 2 did not prefill it), R3 0 + 1 + 1 = 2."""
    e = engine(max_num_seqs=8, num_blocks=20, max_num_batched_tokens=4)
    r1 = e.add_request(list(range(1, 9)), sp(2))
    e.step()
    r2 = e.add_request([9, 10], sp(2), arrival=0.5)
    r3 = e.add_request([11, 12], sp(1))
    run(e)
    return e, (r1, r2, r3)


def test_a_chunked_prefill_and_admitted_requests_waiting_for_the_budget_by_hand():
    e, (r1, r2, r3) = chunked_run()
    assert trace(e) == [
        (0.0, 1.0, {r1: 4}, [], [], [], []),
        (1.0, 2.0, {r1: 4}, [], [r1], [], []),
        (2.0, 3.0, {r2: 2, r3: 2}, [r1], [r2, r3, r1], [r3, r1], []),
        (3.0, 4.0, {}, [r2], [r2], [r2], []),
    ]
    r = by_id(e)
    got = {i: (r[i]["queue"], r[i]["prefill"], r[i]["ttft"], r[i]["e2e"]) for i in (r1, r2, r3)}
    assert got == {r1: (0.0, 2.0, 2.0, 3.0), r2: (0.5, 1.0, 2.5, 3.5), r3: (0.0, 1.0, 2.0, 2.0)}
    assert r[r3]["output"] == 1 and math.isnan(r[r3]["tpot"]) and r[r1]["tpot"] == 1.0 == r[r2]["tpot"]
    assert [s["prefill_work"] for s in e.steps] == [4 * 2, 4 * 6, 2 * 1 + 2 * 1, 0]  # m (c + m / 2) per chunk


def test_the_decomposition_of_ttft_by_hand():
    """The chunked run's stages (see ``chunked_run``): queued [0, 0.5, 0], in prefill [2, 1, 1], the rest
    [0, 1, 1], TTFT [2, 2.5, 2]: at the median 0, 1, 1 and 2; at P95 (rank 1.9 of 0..2) each stage's
    second-largest value plus 0.9 of the gap to its largest."""
    e, _ = chunked_run()
    res = e.results()
    assert decomposition(res, q=50) == {"queue": 0.0, "prefill": 1.0, "other": 1.0, "ttft": 2.0}
    d95 = decomposition(res, q=95)
    assert d95 == pytest.approx({"queue": 0.45, "prefill": 1.9, "other": 1.0, "ttft": 2.45}, rel=1e-12)
    for stage, values in (("queue", [0, 0.5, 0]), ("prefill", [2, 1, 1]), ("other", [0, 1, 1]), ("ttft", [2, 2.5, 2])):
        for q in (5, 50, 95, 99):
            assert decomposition(res, q=q)[stage] == pytest.approx(np.percentile(values, q), rel=1e-12, abs=1e-12)
    assert decomposition(res, kind="", q=95) == d95
    with pytest.raises(ValueError, match="no finished request"):
        decomposition(res, kind="doc")


def test_the_stages_of_a_preempted_request_add_up_to_its_ttft():
    """B of ``preemption_run``: queued 0, its only prefill before its first token 1 s (step 2), TTFT 1: the
    rest is 0. Its recomputation (step 9) comes after its first token and is no part of its TTFT. The
    simulator, run on the same workload with the same settings, counts the same."""
    from lib import simulator

    e, (a, b, c) = preemption_run()
    r = by_id(e)[b]
    assert (r["queue"], r["prefill"], r["ttft"], r["preemptions"]) == (0.0, 1.0, 1.0, 1)
    assert decomposition([r]) == {"queue": 0.0, "prefill": 1.0, "other": 0.0, "ttft": 1.0}
    assert by_id(e)[c]["prefill"] == 1.0  # step 9 only
    wl = [{"id": x["id"], "arrival": x["arrival"], "input": x["input"], "output": x["output"]} for x in e.results()]
    cfg = EngineConfig(max_num_seqs=2, block_size=2, max_model_len=64, enable_prefix_caching=False)
    sim = {x["id"]: x for x in simulator.simulate(wl, Unit(), cfg.as_policy(kv_capacity=10))}
    assert sim[b]["preemptions"] == 1 and (sim[b]["prefill"], sim[b]["ttft"]) == (1.0, 1.0)


# ---------------------------------------------------------------------------- the engine's summary

def test_summary_of_the_preemption_run_against_numpy():
    """ITL is every gap of every request pooled: A's seven gaps of 1, B's 1, 1 and 5, C's 1; so 10 gaps of 1
    and one of 5: P50 1, P95 (rank 9.5) 3, P99 (rank 9.9) 4.6. Means over the requests: TTFT (1 + 1 + 8) / 3,
    TPOT (1 + 7/3 + 1) / 3, E2E (8 + 8 + 9) / 3. Tokens/s: 14 tokens over 0 to 10 s."""
    e, _ = preemption_run()
    res = e.results()
    s = summary(res)
    gaps = [1.0] * 10 + [5.0]
    for p, want in ((50, 1.0), (95, 3.0), (99, 4.6)):
        assert s[f"itl_p{p}"] == pytest.approx(want, rel=1e-12) == pytest.approx(np.percentile(gaps, p), rel=1e-12)
    assert s["ttft_mean"] == pytest.approx(10 / 3, rel=1e-12)
    assert s["tpot_mean"] == pytest.approx(13 / 9, rel=1e-12)
    assert s["e2e_mean"] == pytest.approx(25 / 3, rel=1e-12)
    assert s["tokens_per_s"] == pytest.approx(1.4, rel=1e-12) and s["requests"] == 3
    for m, values in (("ttft", [1, 1, 8]), ("e2e", [8, 8, 9]), ("queue", [0, 0, 7])):
        for p in (50, 95, 99):
            assert s[f"{m}_p{p}"] == pytest.approx(np.percentile(values, p), rel=1e-12, abs=1e-12)


def test_means_leave_out_what_does_not_exist_and_other_kinds():
    """The chunked run, R3 a one-token request (no TPOT) of another kind. TPOT's mean is over the two requests
    that have one, (1 + 1) / 2 = 1, not over all three; a kind's means are over that kind's requests only."""
    e, (r1, r2, r3) = chunked_run()
    res = [{**r, "kind": "doc" if r["id"] == r3 else "chat"} for r in e.results()]
    s = summary(res)
    assert s["tpot_mean"] == 1.0 and s["ttft_mean"] == pytest.approx(6.5 / 3, rel=1e-12)
    chat = summary(res, "chat")
    assert chat["requests"] == 2 and chat["ttft_mean"] == pytest.approx(2.25, rel=1e-12)
    assert chat["e2e_mean"] == pytest.approx(3.25, rel=1e-12) and chat["tpot_mean"] == 1.0
    assert chat["itl_p50"] == 1.0 and chat["itl_p99"] == 1.0  # R1's and R2's gaps, 1 s each
    doc = summary(res, "doc")
    assert doc["requests"] == 1 and doc["ttft_mean"] == 2.0 and math.isnan(doc["tpot_mean"])
    assert math.isnan(doc["itl_p50"]) and doc["e2e_mean"] == 2.0
    assert summary(res, "none") == {}
    # tokens/s over the whole run's span (0 to R2's finish at 4 s) whatever the kind: chat 4 tokens, doc 1
    assert chat["tokens_per_s"] == 1.0 and doc["tokens_per_s"] == 0.25
    # goodput: R1 and R2 meet a TTFT SLO of 2.5 s and a TPOT SLO of 1 s, R3 (no TPOT) meets it by TTFT alone
    assert goodput(res, 2.5, 1.0) == 1.25
    assert goodput(res, 2.4, 1.0) == 0.75  # R2's TTFT 2.5 misses
    assert goodput(res, 2.5, 1.0, "doc") == 0.25


# ---------------------------------------------------------------------------- KV blocks in use, overload

def test_kv_blocks_in_use_leave_out_cached_blocks_nobody_holds():
    """Prefix caching on, blocks of 2, 10 blocks. X = [1, 2, 3, 4, 5] (2 out): 3 blocks, the first two full and
    cached once its prompt is in. Step 1: X prefills (3 blocks held); step 2: its 2nd token, done: the partial
    block is freed, the two full ones stay cached but held by nobody (in use: 0). Y = [1, 2, 3, 4, 9] (2 out)
    finds them (4 tokens hit), holds them again plus one new block: 3 in use; then done: 0 again."""
    e = LLMEngine.virtual(EngineConfig(block_size=2, max_model_len=64), Unit(), vocab=50, num_blocks=10)
    exporter = PrometheusExporter(e)
    x = e.add_request([1, 2, 3, 4, 5], sp(2))
    e.step()
    assert "engine_kv_cache_usage_perc 0.3" in exporter.text()
    e.step()
    assert "engine_kv_cache_usage_perc 0.0" in exporter.text()
    y = e.add_request([1, 2, 3, 4, 9], sp(2))
    run(e)
    assert [s["kv_blocks"] for s in e.steps] == [3, 0, 3, 0]
    assert [s["cached_blocks"] for s in e.steps] == [2, 2, 2, 2]
    assert [(s["prefix_hit_tokens"], s["prefix_query_tokens"]) for s in e.steps] == [(0, 5), (0, 0), (4, 5), (0, 0)]
    assert [s["prefill"] for s in e.steps] == [{x: 5}, {}, {y: 1}, {}]
    assert by_id(e)[y]["cached"] == 4 and by_id(e)[x]["cached"] == 0
    assert "engine_kv_cache_usage_perc 0.0" in exporter.text()
    assert e.pool.free_count == 8 and len(e.scheduler.cache.evictable) == 2


def test_max_queue_requests_may_wait_and_the_next_is_refused():
    """max_queue 2, one request running at a time. Two requests wait (no step yet): the third is refused. One
    step admits the first: one waits, so one more may queue, and the one after is refused. A running request
    is not waiting."""
    e = engine(max_num_seqs=1, num_blocks=20, max_queue=2)
    ids = [e.add_request([1, 2], sp(2)), e.add_request([3, 4], sp(2))]
    with pytest.raises(EngineOverloaded, match="max_queue"):
        e.add_request([5, 6], sp(2))
    assert e.rejects["queue_full"] == 1 and e.unfinished == 2
    e.step()
    assert e.scheduler.queued == 1 and len(e.scheduler.running) == 1
    ids.append(e.add_request([7, 8], sp(2)))
    with pytest.raises(EngineOverloaded):
        e.add_request([9, 10], sp(2))
    assert e.rejects["queue_full"] == 2 and dict(e.rejects) == {"queue_full": 2}
    run(e)
    assert sorted(r["id"] for r in e.results()) == ids


def test_replay_on_the_virtual_clock_by_hand():
    """``replay`` adds each request when the clock reaches its arrival: P (2 + 2) at 0, Q (2 + 1) at 0.5, R
    (2 + 1) at 5 (nothing runs from 3 to 5: the clock jumps). Step 0-1: P prefills (1st token); Q arrived
    at 0.5, is added after it; step 1-2: Q prefills (its token, done), P decodes (done); R at 5: step 5-6."""
    e = engine(max_num_seqs=4, num_blocks=20)
    wl = [{"id": 7, "arrival": 0.0, "input": 2, "output": 2}, {"id": 8, "arrival": 0.5, "input": 2, "output": 1},
          {"id": 9, "arrival": 5.0, "input": 2, "output": 1, "kind": "doc"}]
    out = replay(e, wl, [[1, 2], [3, 4], [5, 6]])
    assert [(r["id"], r["arrival"], r["ttft"], r["e2e"], r["kind"]) for r in out] == [
        (7, 0.0, 1.0, 2.0, ""), (8, 0.5, 1.5, 1.5, ""), (9, 5.0, 1.0, 1.0, "doc")]
    assert [(s["start"], s["end"]) for s in e.steps] == [(0.0, 1.0), (1.0, 2.0), (5.0, 6.0)]


# ---------------------------------------------------------------------------- the Prometheus page

def test_the_prometheus_page_of_the_preemption_run_by_hand():
    """``preemption_run`` with steps of 0.5 s: every time halves. TTFT 0.5, 0.5, 4 (sum 5); TPOT 0.5, 3.5 / 3,
    0.5; ITL 10 gaps of 0.5 and one of 2.5 (sum 7.5); E2E 4, 4, 4.5; queued 0, 0, 3.5. Prompt tokens computed
    2 + 2 + 5 (B again, its 3 tokens too) + 2 = 11, all looked up in the prefix cache (which is off: no hit);
    14 tokens generated; ten steps of 0.5 s of 'GPU' each, the virtual clock's host time the same."""
    e, (a, b, c), exporter = preemption_run(dt=0.5, exporter=True)
    page = scrape(exporter)

    def v(name, **labels):
        return page[(name, tuple(sorted(labels.items())))]

    assert v("engine_time_to_first_token_seconds_count") == 3 and v("engine_time_to_first_token_seconds_sum") == 5.0
    assert v("engine_time_to_first_token_seconds_bucket", le="0.5") == 2
    assert v("engine_time_to_first_token_seconds_bucket", le="2.5") == 2
    assert v("engine_time_to_first_token_seconds_bucket", le="5.0") == 3
    assert v("engine_time_per_output_token_seconds_count") == 3
    assert v("engine_time_per_output_token_seconds_sum") == pytest.approx(1 + 3.5 / 3, rel=1e-12)
    assert v("engine_time_per_output_token_seconds_bucket", le="0.5") == 2
    assert v("engine_time_per_output_token_seconds_bucket", le="1.0") == 2
    assert v("engine_time_per_output_token_seconds_bucket", le="2.5") == 3
    assert v("engine_inter_token_latency_seconds_count") == 11 and v("engine_inter_token_latency_seconds_sum") == 7.5
    assert v("engine_inter_token_latency_seconds_bucket", le="0.5") == 10
    assert v("engine_e2e_request_latency_seconds_count") == 3 and v("engine_e2e_request_latency_seconds_sum") == 12.5
    assert v("engine_e2e_request_latency_seconds_bucket", le="2.5") == 0
    assert v("engine_e2e_request_latency_seconds_bucket", le="5.0") == 3
    assert v("engine_request_queue_time_seconds_count") == 3 and v("engine_request_queue_time_seconds_sum") == 3.5
    assert v("engine_request_queue_time_seconds_bucket", le="0.001") == 2
    assert v("engine_prompt_tokens_total") == 11 and v("engine_generation_tokens_total") == 14
    assert v("engine_request_success_total", finish_reason="length") == 3
    assert v("engine_num_preemptions_total") == 1
    assert v("engine_prefix_cache_hits_total") == 0 and v("engine_prefix_cache_queries_total") == 11
    assert v("engine_step_gpu_seconds_total") == 5.0 and v("engine_step_host_seconds_total") == 5.0
    assert v("engine_step_batch_size") == 1  # the last step: C's decode
    assert (v("engine_num_requests_running"), v("engine_num_requests_waiting"), v("engine_kv_cache_usage_perc")) == (
        0, 0, 0)
    from lib.engine.metrics import E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS

    for name, bounds in (("time_to_first_token", TTFT_BUCKETS), ("time_per_output_token", TPOT_BUCKETS),
                         ("inter_token_latency", TPOT_BUCKETS), ("e2e_request_latency", E2E_BUCKETS),
                         ("request_queue_time", TTFT_BUCKETS)):
        les = [dict(k[1])["le"] for k in page if k[0] == f"engine_{name}_seconds_bucket"]
        assert les == [str(float(b)) for b in bounds] + ["+Inf"], name


class NoGPUTime:
    """A runner without a device clock (GPU time NaN, as on a CPU) whose requests stop at token 7 when asked."""

    def run(self, plan):
        from lib.engine.runner import StepResult

        return StepResult([7 if x.id == 0 else 3 for x in plan.sampled], math.nan, 0.0, False)


def test_the_page_counts_no_gpu_time_without_a_device_clock_and_names_the_finish_reason():
    """Request 0 draws token 7, a stop token of its own: done after one token, for "stop" (and a one-token
    request has no TPOT to observe). Request 1 asks for 2 tokens: "length". No GPU time is known: none is
    counted (a NaN would poison the counter)."""
    from lib.engine.engine import VirtualClock
    from lib.kv_pool import KVPool

    e = LLMEngine(EngineConfig(block_size=2, max_model_len=64), NoGPUTime(), KVPool(10, 2, storage=False), vocab=50,
                  clock=VirtualClock())
    exporter = PrometheusExporter(e)
    e.add_request([1, 2], SamplingParams(max_tokens=5, stop_token_ids=(7,)))
    e.add_request([3, 4], sp(2))
    e.step()
    e.step()
    assert [x.finish_reason for x in e.requests.values()] == ["stop", "length"]
    page = scrape(exporter)
    assert page[("engine_request_success_total", (("finish_reason", "stop"),))] == 1
    assert page[("engine_request_success_total", (("finish_reason", "length"),))] == 1
    assert page[("engine_step_gpu_seconds_total", ())] == 0.0
    assert page[("engine_time_per_output_token_seconds_count", ())] == 1  # request 1's; request 0 has none
    assert page[("engine_time_to_first_token_seconds_count", ())] == 2


def test_the_engine_summary_reads_the_simulator_s_results():
    """The chunked run's own workload through the simulator, with the engine's settings: the simulator's
    results are the engine's own (``Request.result``, "itl" included), so the summary is the same: the
    latencies of ``chunked_run``, ITL from R1's gap 2 -> 3 and R2's 3 -> 4 (1 s each; R3 has one token, no
    gap), R3's missing TPOT left out of the mean. Results without "itl" (an older simulator's) give no ITL
    (NaN) and the rest unchanged."""
    from lib import simulator

    e, _ = chunked_run()
    wl = [{"id": r["id"], "arrival": r["arrival"], "input": r["input"], "output": r["output"]} for r in e.results()]
    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=4, block_size=2, max_model_len=64)
    sim = simulator.simulate(wl, Unit(), cfg.as_policy())
    s = summary(sim)
    assert [r["itl"] for r in sim] == [r["itl"] for r in e.results()] == [[1.0], [1.0], []]
    assert all(s[f"itl_p{p}"] == 1.0 for p in (50, 95, 99))
    assert s == summary(e.results())
    no_itl = summary([{k: v for k, v in r.items() if k != "itl"} for r in sim])
    assert all(math.isnan(no_itl.pop(f"itl_p{p}")) for p in (50, 95, 99))
    assert no_itl == {k: v for k, v in s.items() if not k.startswith("itl_")}
    assert {k: s[k] for k in ("ttft_p50", "tpot_p50", "e2e_p50", "queue_p50")} == {
        "ttft_p50": 2.0, "tpot_p50": 1.0, "e2e_p50": 3.0, "queue_p50": 0.0}
    assert s["ttft_mean"] == pytest.approx(6.5 / 3, rel=1e-12) and s["tpot_mean"] == 1.0
    assert decomposition(sim) == decomposition(e.results(), q=50) == {"queue": 0.0, "prefill": 1.0, "other": 1.0,
                                                                       "ttft": 2.0}


# ---------------------------------------------------------------------------- windows, replay, the virtual runner

def test_a_dynamic_batch_starts_when_its_oldest_request_has_waited_max_wait():
    """Dynamic batches of 4 with max_wait 0.5 s, one request at t=0 and nothing closed: the batch cannot fill,
    so it starts when the request has waited 0.5 s (``run`` moves the clock there), and its token comes 1 s
    later. A second engine given the same request with a second one due at 3 s (``replay``): the first batch
    starts at 0.5 all the same, the second request, the workload's last, starts at 3 (nothing more can come)."""
    e = engine(policy="dynamic", max_num_seqs=4, max_wait=0.5, num_blocks=20)
    rid = e.add_request([1, 2], sp(1))
    assert e.step() == [] and e.next_wake() == 0.5  # nothing runs before the window ends
    run(e, close=False)  # not closed: only the window can start the batch
    assert [(s["start"], s["end"]) for s in e.steps] == [(0.5, 1.5)] and by_id(e)[rid]["ttft"] == 1.5
    e2 = engine(policy="dynamic", max_num_seqs=4, max_wait=0.5, num_blocks=20)
    out = replay(e2, [{"id": 0, "arrival": 0.0, "input": 2, "output": 1},
                      {"id": 1, "arrival": 3.0, "input": 2, "output": 1}], [[1, 2], [3, 4]])
    assert [(s["start"], s["end"]) for s in e2.steps] == [(0.5, 1.5), (3.0, 4.0)]
    assert [(r["id"], r["queue"], r["ttft"]) for r in out] == [(0, 0.5, 1.5), (1, 0.0, 1.0)]


def test_a_continuous_window_holds_a_queue_until_it_ends_or_the_budget_fills():
    """Continuous batching with a window of 0.25 s and a step budget of 8 prompt tokens. A (2 tokens) at t=0 is
    held until 0.25. B (4) and C (4) at t=0 fill the budget (8 tokens): admitted at once, no wait."""
    e = engine(max_num_seqs=4, max_wait=0.25, num_blocks=20, max_num_batched_tokens=8)
    a = e.add_request([1, 2], sp(1))
    run(e, close=False)
    assert e.steps[0]["start"] == 0.25 and by_id(e)[a]["queue"] == 0.25
    e = engine(max_num_seqs=4, max_wait=0.25, num_blocks=20, max_num_batched_tokens=8)
    b, c = e.add_request([1, 2, 3, 4], sp(1)), e.add_request([5, 6, 7, 8], sp(1))
    e.step()
    assert e.steps[0]["start"] == 0.0 and e.steps[0]["prefill"] == {b: 4, c: 4}


def test_replay_admits_by_arrival_from_any_clock_reading_with_a_sampling_rule():
    """A workload listed out of order, replayed on a virtual clock that already reads 10 s, one request running
    at a time, each asking for one token more than its "output" (the sampling rule). Arrivals come back
    relative to the start; the two requests due at 0 are admitted in workload order (index breaks the tie).

    10-12: 6 (due 0) prefills, then decodes its 2nd token; 12-14: 7 (due 0) the same; 14-17: 5 (due 1, 3
    tokens). TTFT: 6 1 s, 7 3 s, 5 (arrived at 11) 4 s."""
    e = engine(max_num_seqs=1, num_blocks=20)
    e.clock.advance_to(10.0)
    wl = [{"id": 5, "arrival": 1.0, "input": 2, "output": 2}, {"id": 6, "arrival": 0.0, "input": 2, "output": 1},
          {"id": 7, "arrival": 0.0, "input": 2, "output": 1}]
    out = replay(e, wl, [[1, 2], [3, 4], [5, 6]],
                 sampling=lambda r: SamplingParams(max_tokens=r["output"] + 1, ignore_eos=True))
    got = [(r["id"], r["arrival"], r["output"], r["ttft"], r["e2e"]) for r in out]
    assert got == [(5, 1.0, 3, 4.0, 6.0), (6, 0.0, 2, 1.0, 2.0), (7, 0.0, 2, 3.0, 4.0)]
    assert [s["start"] for s in e.steps] == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]


class FakeTime:
    """A clock that is not virtual: it moves only when ``replay`` sleeps (each sleep recorded)."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_replay_on_a_real_clock_polls_at_most_every_millisecond(monkeypatch):
    """On a clock replay cannot move, it sleeps until the next arrival, a millisecond at most at a time, so a
    request is added within a millisecond of its arrival: here exactly at it (the last sleep is the rest)."""
    from lib.engine import engine as engine_module
    from lib.kv_pool import KVPool

    t = FakeTime()
    monkeypatch.setattr(engine_module.time, "sleep", t.sleep)
    e = LLMEngine(EngineConfig(block_size=2, max_model_len=64), NoGPUTime(), KVPool(10, 2, storage=False), vocab=50,
                  clock=t)  # its steps take no time on this clock
    wl = [{"id": 0, "arrival": 0.0, "input": 2, "output": 1}, {"id": 1, "arrival": 0.0105, "input": 2, "output": 1}]
    out = replay(e, wl, [[1, 2], [3, 4]])
    assert t.sleeps and all(0 < s <= 0.001 for s in t.sleeps) and len(t.sleeps) == 11
    assert [r["arrival"] for r in out] == [0.0, 0.0105]
    assert out[1]["ttft"] == pytest.approx(0.0, abs=1e-12) and e.steps[1]["start"] == pytest.approx(0.0105, abs=1e-12)


def test_the_virtual_runner_gives_tokens_of_the_vocabulary_no_graph_and_takes_a_free_step():
    """The virtual engine's tokens are ids of its vocabulary (whole numbers), differ between requests, and its
    steps record no CUDA graph; a cost model may give a step 0 s (the clock stays)."""
    e = engine(max_num_seqs=4, num_blocks=20)
    ids = [e.add_request([1, 2], sp(4)) for _ in range(3)]
    run(e)
    outs = [e.requests[i].output for i in ids]
    assert all(isinstance(t, int) and 0 <= t < 50 for o in outs for t in o) and len({tuple(o) for o in outs}) == 3
    assert all(s["graph"] is False for s in e.steps)
    free = engine(dt=0.0, max_num_seqs=4, num_blocks=20)
    free.add_request([1, 2], sp(2))
    run(free)
    assert [(s["start"], s["end"]) for s in free.steps] == [(0.0, 0.0), (0.0, 0.0)]


def test_results_name_each_request_s_bucket_and_an_unfinished_request_has_no_latencies():
    """Queues by prompt length: a 2-token prompt falls in "short" (at most 4 tokens), a 6-token one in "long"
    (the last bucket takes the rest). A request not yet run has no TTFT, decode time or gaps."""
    from lib.simulator import Bucket

    e = engine(max_num_seqs=4, num_blocks=20, buckets=(Bucket("short", 4), Bucket("long", 64)))
    s, lo = e.add_request([1, 2], sp(1)), e.add_request([1, 2, 3, 4, 5, 6], sp(1))
    run(e)
    assert {r["id"]: r["bucket"] for r in e.results()} == {s: "short", lo: "long"}
    from lib.engine.scheduler import Request

    r = Request(0, [1, 2], sp(2), 0.0).result()
    assert math.isnan(r["ttft"]) and math.isnan(r["decode"]) and r["itl"] == [] and r["output"] == 0


def test_growing_a_lease_evicts_exactly_one_cached_block():
    """A pool of 4 blocks of 2, prefix caching on. X = [1, 2, 3, 4, 5] (1 out) leaves 2 full blocks cached and
    held by nobody, 2 free. Y = [9] * 7 (1 out) needs 4 blocks: it takes the 2 free ones, then each block it
    grows by evicts exactly one cached block (none is left)."""
    from lib.kv_pool import PoolExhausted

    e = LLMEngine.virtual(EngineConfig(block_size=2, max_model_len=64), Unit(), vocab=50, num_blocks=4)
    e.add_request([1, 2, 3, 4, 5], sp(1))
    run(e)
    cache = e.scheduler.cache
    assert len(cache.evictable) == 2 and e.pool.free_count == 2
    lease = cache.acquire([9] * 2)  # one block, from the free ones
    cache.grow(lease)  # the last free block
    assert (e.pool.free_count, len(cache.evictable), len(lease.blocks)) == (0, 2, 2)
    cache.grow(lease)
    assert (len(cache.evictable), len(lease.blocks)) == (1, 3)
    cache.grow(lease)
    assert (len(cache.evictable), len(lease.blocks)) == (0, 4)
    with pytest.raises(PoolExhausted, match="no block is free or evictable"):
        cache.grow(lease)
    assert len(lease.blocks) == 4


class Waits:
    """A runner whose step lasts 1 s of a virtual clock, of which the host waited 0.75 s for the device."""

    def __init__(self, clock):
        self.clock = clock

    def run(self, plan):
        from lib.engine.runner import StepResult

        self.clock.advance_to(self.clock.now + 1.0)
        return StepResult([5] * len(plan.sampled), 1.0, 0.75, False)


def test_the_step_records_by_hand():
    """A (2-token prompt, 3 out) alone; a request refused before step 2. Step 1 prefills A's 2 tokens: its 1st
    token (A holds 3 tokens). Step 2 decodes from A's 3rd token: it writes that token's KV and attends over all
    3, the KV read and the longest context (what the cost model is asked with). Step 3: 4 and 4. Each step lasts
    1 s, of which the host waited 0.75 for the device: 0.25 s of host time."""
    from lib.engine.engine import VirtualClock
    from lib.kv_pool import KVPool

    clock = VirtualClock()
    e = LLMEngine(EngineConfig(block_size=2, max_model_len=64), Waits(clock), KVPool(10, 2, storage=False), vocab=50,
                  clock=clock)
    e.add_request([1, 2], sp(3))
    e.step()
    with pytest.raises(Exception, match="empty"):
        e.add_request([], sp(1))
    run(e)
    got = [(s["prefill_tokens"], s["decode_tokens"], s["decode_kv"], s["decode_ctx_max"], s["rejects"], s["batch"])
           for s in e.steps]
    assert got == [(2, 0, 0, 0, 0, 1), (0, 1, 3, 3, 1, 1), (0, 1, 4, 4, 1, 1)]
    assert [(s["gpu_s"], s["host_s"]) for s in e.steps] == [(1.0, 0.25)] * 3


def test_an_abort_tells_the_callbacks_that_the_request_ended_without_a_token():
    e = engine(max_num_seqs=1, num_blocks=20)
    tokens, events = [], []
    e.on_token(lambda *t: tokens.append(t))
    e.on_events(events.append)
    a, b = e.add_request([1, 2], sp(3)), e.add_request([3, 4], sp(3))
    e.step()
    e.abort(b)  # waiting: it leaves its queue
    e.abort(a)  # running: it leaves the batch
    e.abort(a)  # already gone: nothing more
    assert tokens[-2:] == [(b, -1, True), (a, -1, True)] and events[-2:] == [[(b, -1, True)], [(a, -1, True)]]
    assert e.aborted == 2 and e.unfinished == 0 and e.requests[a].finish_reason == "abort"


def test_the_step_record_holds_what_the_cost_model_was_asked():
    """Every step of the virtual engine asks the cost model with its tokens, prefill work, KV read, prefills and
    longest context: the step's record holds the same numbers (what a fit to measured records relies on)."""
    class Asked:
        def __init__(self):
            self.calls = []

        def step(self, tokens, work, kv):
            raise AssertionError("step_detail is asked when a cost model has it")

        def step_detail(self, tokens, work, kv, *, prefills, decode_ctx_max):
            self.calls.append((tokens, work, kv, prefills, decode_ctx_max))
            return 1.0

    cost = Asked()
    e = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=2, max_model_len=64, max_num_batched_tokens=4),
                          cost, vocab=50, num_blocks=30)
    e.add_request([1, 2, 3, 4, 5, 6], sp(3))
    e.add_request([7, 8], sp(4))
    run(e)
    assert cost.calls == [(s["prefill_tokens"] + s["decode_tokens"], s["prefill_work"], s["decode_kv"],
                           len(s["prefill"]), s["decode_ctx_max"]) for s in e.steps]
    assert any(s["decode_tokens"] for s in e.steps) and any(s["prefill_tokens"] for s in e.steps)
