"""lib.simulator.simulate traced by hand: small workloads whose every step is worked out in the comments.

The cost model is ``Ticks``: a step of M tokens lasts 1 + M seconds, whatever the context, so every time
is a whole or half number of seconds, exact in floats, and the trace can be followed with pencil and
paper. It also records what the engine asked of it, (tokens, prefill attention work, decode KV tokens),
so the tests check the work of each step as well as its timing. Prefill work of a chunk of m tokens
after c tokens is m (c + m / 2).

KV (the engine's rules, ``lib.engine.scheduler``, in one-token blocks: ``lib.engine.kv.TokenKV``): admission
reserves a request's tokens to prefill whole (its prompt; after a pre-emption its prompt and the tokens it
had generated), and only if they fit what is left of ``kv_capacity``; before a step, each request that
decodes needs room for its whole length (its prompt and its output so far: the token it decodes from
included), one token more than after its previous step. When that room is not there, the most recently
admitted running request (ties: the higher id) is pre-empted while the step is planned (the trace record
of that step lists it), until the room is there or the request that needs it is itself gone. The trace's
"kv" is the tokens reserved after the step, finished requests released: a request that has yielded n
tokens holds its prompt + n - 1 (the KV of its newest token is written by the step that decodes from it).

Chapters: 6.
"""

from __future__ import annotations

import math

import pytest

from lib import simulator

NAN = math.nan


class Ticks:
    """step = 1 s + 1 s per token; records every call. These runs take a handful of steps: past 1000 the
    engine is looping, and the test fails instead of hanging."""

    def __init__(self):
        self.calls = []

    def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
        self.calls.append((tokens, prefill_ctx_work, decode_kv_tokens))
        assert len(self.calls) < 1000, "the engine does not finish a few requests in 1000 steps"
        return 1.0 + tokens


def req(id_, arrival, input_, output, kind="chat"):
    return {"id": id_, "arrival": float(arrival), "kind": kind, "input": input_, "output": output}


# A: a 3-token prompt, 3 tokens out; B arrives at 1 s (2 in, 2 out); C at 2 s (1 in, 1 out: no TPOT)
THREE = [req(0, 0, 3, 3), req(1, 1, 2, 2), req(2, 2, 1, 1, kind="doc")]


def step(start, end, prefill=None, decode=(), yielded=(), finished=(), preempted=(), kv=0):
    return {"start": float(start), "end": float(end), "prefill": dict(prefill or {}), "decode": list(decode),
            "yielded": list(yielded), "finished": list(finished), "preempted": list(preempted), "kv": kv}


def result(r, ttft, e2e, tpot, itl, queue, prefill, preemptions=0, tokens=None, bucket=""):
    """The expected result of request ``r`` (``lib.engine.scheduler.Request.result``): ``itl`` the gaps
    between its token times, itl_max their largest (NaN: none), decode = e2e - ttft, tokens = its output
    unless said, no prefix cache (cached 0), every request stopped by its length."""
    return {"id": r["id"], "kind": r["kind"], "bucket": bucket, "input": r["input"], "output": r["output"],
            "arrival": r["arrival"], "ttft": ttft, "e2e": e2e, "tpot": tpot, "itl": itl,
            "itl_max": max(itl) if itl else NAN, "queue": queue, "prefill": prefill, "decode": e2e - ttft,
            "preemptions": preemptions, "tokens": r["output"] if tokens is None else tokens, "cached": 0,
            "finish_reason": "length"}


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN and floats to 1e-12 (the hand values like 14 / 3 are rounded)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == pytest.approx(b, rel=1e-12, abs=1e-12)
    return a == b


def run(reqs, policy):
    cost, trace = Ticks(), []
    res = simulator.simulate(reqs, cost, policy, trace=trace)
    return res, trace, cost.calls


def check(reqs, policy, want_trace, want_calls, want_results):
    res, trace, calls = run(reqs, policy)
    assert same(trace, want_trace), trace
    assert same(calls, want_calls), calls
    for got, want in zip(res, want_results):
        assert same(got, want), (got, want)
    assert len(res) == len(want_results)
    return res


def test_static_batching_by_hand():
    """max_batch 2. At 0 s A waits alone (not full, more to come): the clock jumps to B's arrival. At 1 s
    the batch {A, B} starts and is locked: C, arriving at 2 s, waits until both have finished.

    step 1 [1, 7]:   prefill A 3 + B 2 = 5 tokens, work 3 (0 + 1.5) + 2 (0 + 1) = 6.5; both yield (t 7);
                     KV: the prompts reserved at admission, A 3 + B 2 = 5
    step 2 [7, 10]:  decode A, B: 2 tokens reading A 4 + B 3 = 7 of KV, each grown to its length first
                     (KV 7); B has its 2 tokens and leaves: KV A 4
    step 3 [10, 12]: decode A reading 5 (grown to 5); A has its 3 tokens: KV 0
    step 4 [12, 14]: every request has arrived, so C alone is a batch: prefill 1 token, work 0.5; it yields
                     its only token and leaves
    """
    check(THREE, simulator.Policy("static", max_batch=2), [
        step(1, 7, prefill={0: 3, 1: 2}, yielded=[0, 1], kv=5),
        step(7, 10, decode=[0, 1], yielded=[0, 1], finished=[1], kv=4),
        step(10, 12, decode=[0], yielded=[0], finished=[0], kv=0),
        step(12, 14, prefill={2: 1}, yielded=[2], finished=[2], kv=0),
    ], [(5, 6.5, 0), (2, 0.0, 7), (1, 0.0, 5), (1, 0.5, 0)], [
        # A: admitted at 1; tokens at 7, 10, 12: TTFT 7, E2E 12, TPOT (12 - 7) / (3 - 1) = 2.5
        result(THREE[0], ttft=7.0, e2e=12.0, tpot=2.5, itl=[3.0, 2.0], queue=1.0, prefill=6.0),
        # B: arrived at 1, tokens at 7 and 10: TTFT 6, E2E 9, TPOT 3 / 1
        result(THREE[1], ttft=6.0, e2e=9.0, tpot=3.0, itl=[3.0], queue=0.0, prefill=6.0),
        # C: arrived at 2, admitted at 12, its one token at 14
        result(THREE[2], ttft=12.0, e2e=12.0, tpot=NAN, itl=[], queue=10.0, prefill=2.0),
    ])


def test_dynamic_batching_by_hand():
    """max_batch 2, max_wait 0.5 s: A's batch starts alone when A has waited 0.5 s, before B arrives.

    step 1 [0.5, 4.5]:  prefill A 3 tokens, work 4.5; A yields; KV 3 (its prompt)
    step 2 [4.5, 6.5]:  decode A reading 4 (B and C queued meanwhile: the batch is locked); KV 4
    step 3 [6.5, 8.5]:  decode A reading 5; A done: KV 0
    step 4 [8.5, 12.5]: B and C fill a batch: prefill 2 + 1 tokens, work 2 + 0.5; KV 2 + 1; C done: B 2
    step 5 [12.5, 14.5]: decode B reading 3; B done
    """
    check(THREE, simulator.Policy("dynamic", max_batch=2, max_wait=0.5), [
        step(0.5, 4.5, prefill={0: 3}, yielded=[0], kv=3),
        step(4.5, 6.5, decode=[0], yielded=[0], kv=4),
        step(6.5, 8.5, decode=[0], yielded=[0], finished=[0], kv=0),
        step(8.5, 12.5, prefill={1: 2, 2: 1}, yielded=[1, 2], finished=[2], kv=2),
        step(12.5, 14.5, decode=[1], yielded=[1], finished=[1], kv=0),
    ], [(3, 4.5, 0), (1, 0.0, 4), (1, 0.0, 5), (3, 2.5, 0), (1, 0.0, 3)], [
        result(THREE[0], ttft=4.5, e2e=8.5, tpot=2.0, itl=[2.0, 2.0], queue=0.5, prefill=4.0),
        # B: arrived at 1, admitted at 8.5, tokens at 12.5 and 14.5
        result(THREE[1], ttft=11.5, e2e=13.5, tpot=2.0, itl=[2.0], queue=7.5, prefill=4.0),
        result(THREE[2], ttft=10.5, e2e=10.5, tpot=NAN, itl=[], queue=6.5, prefill=4.0),
    ])


def test_continuous_batching_by_hand():
    """Every step admits what has arrived: B and C join A's decode at 4 s.

    step 1 [0, 4]:  prefill A 3 tokens, work 4.5; KV 3
    step 2 [4, 9]:  prefill B 2 and C 1 (work 2 + 0.5) and decode A reading 4: 4 tokens; B, C then A
                    yield; KV: A 4 + B 2 + C 1 = 7; C done: 6
    step 3 [9, 12]: decode A, B reading 5 + 3 = 8; both done
    """
    check(THREE, simulator.Policy("continuous"), [
        step(0, 4, prefill={0: 3}, yielded=[0], kv=3),
        step(4, 9, prefill={1: 2, 2: 1}, decode=[0], yielded=[1, 2, 0], finished=[2], kv=6),
        step(9, 12, decode=[0, 1], yielded=[0, 1], finished=[0, 1], kv=0),
    ], [(3, 4.5, 0), (4, 2.5, 4), (2, 0.0, 8)], [
        # A: tokens at 4, 9, 12: TPOT (12 - 4) / 2 = 4, longest gap 5
        result(THREE[0], ttft=4.0, e2e=12.0, tpot=4.0, itl=[5.0, 3.0], queue=0.0, prefill=4.0),
        # B: arrived at 1, admitted at 4 (the next step), tokens at 9 and 12
        result(THREE[1], ttft=8.0, e2e=11.0, tpot=3.0, itl=[3.0], queue=3.0, prefill=5.0),
        result(THREE[2], ttft=7.0, e2e=7.0, tpot=NAN, itl=[], queue=2.0, prefill=5.0),
    ])


def test_prefill_first_pauses_decode_by_hand():
    """As the continuous trace, but the step that prefills B and C runs no decode: A waits.

    step 1 [0, 4]:   prefill A; KV 3
    step 2 [4, 8]:   prefill B 2, C 1 (3 tokens, work 2.5), no decode (A does not grow); KV: A 3 + B 2 +
                     C 1 = 6; C done: 5
    step 3 [8, 11]:  decode A, B reading 4 + 3 (KV 7); B done; KV: A 4
    step 4 [11, 13]: decode A reading 5; done
    """
    check(THREE, simulator.Policy("continuous", prefill_first=True), [
        step(0, 4, prefill={0: 3}, yielded=[0], kv=3),
        step(4, 8, prefill={1: 2, 2: 1}, yielded=[1, 2], finished=[2], kv=5),
        step(8, 11, decode=[0, 1], yielded=[0, 1], finished=[1], kv=4),
        step(11, 13, decode=[0], yielded=[0], finished=[0], kv=0),
    ], [(3, 4.5, 0), (3, 2.5, 0), (2, 0.0, 7), (1, 0.0, 5)], [
        # A: tokens at 4, 11, 13: the gap of 7 is the paused decode
        result(THREE[0], ttft=4.0, e2e=13.0, tpot=4.5, itl=[7.0, 2.0], queue=0.0, prefill=4.0),
        result(THREE[1], ttft=7.0, e2e=10.0, tpot=3.0, itl=[3.0], queue=3.0, prefill=4.0),
        result(THREE[2], ttft=6.0, e2e=6.0, tpot=NAN, itl=[], queue=2.0, prefill=4.0),
    ])


def test_chunked_prefill_by_hand():
    """chunk 2, token_budget 3: a prompt goes in chunks of at most 2 tokens, at most 3 prompt tokens a step.

    step 1 [0, 3]:   A's first chunk, 2 tokens (work 2 (0 + 1) = 2); no token yet; KV 3 (A's whole prompt
                     is reserved at admission, not chunk by chunk)
    at 3 s B and C are admitted (their first chunks, 2 + 1, fit the budget of 3): KV 3 + 2 + 1 = 6
    step 2 [3, 7]:   A's last token (work 1 (2 + 0.5) = 2.5), B's 2 (work 2): the budget is spent, C waits
                     although admitted; A and B yield; KV 6
    step 3 [7, 11]:  C's 1 token (work 0.5) and decode A, B reading 4 + 3; C, then A, B yield; KV A 4 + B 3
                     + C 1 = 8; C and B done: KV A 4
    step 4 [11, 13]: decode A reading 5; done
    """
    check(THREE, simulator.Policy("continuous", chunk=2, token_budget=3), [
        step(0, 3, prefill={0: 2}, kv=3),
        step(3, 7, prefill={0: 1, 1: 2}, yielded=[0, 1], kv=6),
        step(7, 11, prefill={2: 1}, decode=[0, 1], yielded=[2, 0, 1], finished=[2, 1], kv=4),
        step(11, 13, decode=[0], yielded=[0], finished=[0], kv=0),
    ], [(2, 2.0, 0), (3, 4.5, 0), (3, 0.5, 7), (1, 0.0, 5)], [
        # A prefilled in steps 1 and 2 (3 s + 4 s); tokens at 7, 11, 13
        result(THREE[0], ttft=7.0, e2e=13.0, tpot=3.0, itl=[4.0, 2.0], queue=0.0, prefill=7.0),
        result(THREE[1], ttft=6.0, e2e=10.0, tpot=4.0, itl=[4.0], queue=2.0, prefill=4.0),
        # C: admitted at 3 (queue 1), prefilled only in step 3
        result(THREE[2], ttft=9.0, e2e=9.0, tpot=NAN, itl=[], queue=1.0, prefill=4.0),
    ])


def test_a_chunk_larger_than_the_budget_is_cut_to_it():
    """chunk 4 but token_budget 3: a 5-token prompt goes 3 + 2 (work 3 (0 + 1.5) = 4.5, then 2 (3 + 1) = 8);
    its 5 tokens of KV are reserved at admission, before its first chunk."""
    check([req(0, 0, 5, 1)], simulator.Policy("continuous", chunk=4, token_budget=3), [
        step(0, 4, prefill={0: 3}, kv=5),
        step(4, 7, prefill={0: 2}, yielded=[0], finished=[0], kv=0),
    ], [(3, 4.5, 0), (2, 8.0, 0)], [
        result(req(0, 0, 5, 1), ttft=7.0, e2e=7.0, tpot=NAN, itl=[], queue=0.0, prefill=7.0),
    ])


# as THREE, but B wants 3 tokens: it decodes after it is prefilled again
PREEMPT = [req(0, 0, 3, 3), req(1, 1, 2, 3), req(2, 2, 1, 1)]


def test_preemption_of_the_newest_by_hand():
    """kv_capacity 7 tokens. Admission reserves a request's prompt whole if it fits: KV in use + prompt <= 7.

    step 1 [0, 4]:   A admitted (0 + 3 <= 7), prefills 3 (work 4.5) and yields; KV 3
    at 4 s: B (3 + 2 = 5) and C (5 + 1 = 6) are admitted; A, decoding, grows to its length 4: KV 7, no
                     pre-emption
    step 2 [4, 9]:   prefill B 2 and C 1 (work 2 + 0.5), decode A reading 4: 4 tokens; B, C, A yield; C
                     done: KV A 4 + B 2 = 6
    at 9 s: A grows to 5 (KV 7); B, to decode, needs 3 but holds 2 and the KV is full: the newest running
                     request, B (admitted at 4 s, A at 0 s), is pre-empted while the step is planned: its 2
                     go back (KV 5) and it returns to the front of the queue, to prefill its 2 prompt tokens
                     and its 1 generated token again
    step 3 [9, 11]:  decode A reading 5; A done: KV 0
    at 11 s: B is admitted again (0 + 3 <= 7)
    step 4 [11, 15]: prefill B 3 (work 4.5); B yields its 2nd token; KV 3
    step 5 [15, 17]: decode B reading its 2 prompt + 2 generated tokens = 4 (KV 4); done
    """
    check(PREEMPT, simulator.Policy("continuous", kv_capacity=7), [
        step(0, 4, prefill={0: 3}, yielded=[0], kv=3),
        step(4, 9, prefill={1: 2, 2: 1}, decode=[0], yielded=[1, 2, 0], finished=[2], kv=6),
        step(9, 11, decode=[0], yielded=[0], finished=[0], preempted=[1], kv=0),
        step(11, 15, prefill={1: 3}, yielded=[1], kv=3),
        step(15, 17, decode=[1], yielded=[1], finished=[1], kv=0),
    ], [(3, 4.5, 0), (4, 2.5, 4), (1, 0.0, 5), (3, 4.5, 0), (1, 0.0, 4)], [
        # A: tokens at 4, 9, 11
        result(PREEMPT[0], ttft=4.0, e2e=11.0, tpot=3.5, itl=[5.0, 2.0], queue=0.0, prefill=4.0),
        # B: arrived at 1, first admitted at 4, tokens at 9 (kept through the pre-emption), 15, 17; in
        # prefill before its first token: step 2 (5 s); step 4 recomputes its KV after it, no stage of its TTFT
        result(PREEMPT[1], ttft=8.0, e2e=16.0, tpot=4.0, itl=[6.0, 2.0], queue=3.0, prefill=5.0, preemptions=1),
        result(PREEMPT[2], ttft=7.0, e2e=7.0, tpot=NAN, itl=[], queue=2.0, prefill=5.0),
    ])


def test_the_newest_is_preempted_not_the_request_that_needs_the_room_by_hand():
    """The trace above with kv_capacity 6: the request that needs a token of room (A, the oldest) keeps
    running; the newest running requests make room, even one admitted while this very step is planned.

    step 1 [0, 4]:   prefill A 3; KV 3
    at 4 s: B (3 + 2 = 5) and C (5 + 1 = 6) are admitted; A needs room for 4 and the KV is full: the newest,
                     C (admitted at 4 s with B: the higher id), is pre-empted before it prefilled anything
                     (KV 5) and A grows to 4 (KV 6)
    step 2 [4, 8]:   prefill B 2 (work 2), decode A reading 4: 3 tokens; B, A yield; KV A 4 + B 2 = 6
    at 8 s: C (6 + 1 > 6) is not admitted; A needs 5: the newest, B, is pre-empted (KV 4), A grows (KV 5)
    step 3 [8, 10]:  decode A reading 5; A done: KV 0
    at 10 s: B, at the front of the queue, to prefill 2 + 1 tokens (KV 3), then C (KV 4)
    step 4 [10, 15]: prefill B 3 (work 4.5), C 1 (0.5); B yields its 2nd token, C its only; C done: KV 3
    step 5 [15, 17]: decode B reading 4; done
    """
    check(PREEMPT, simulator.Policy("continuous", kv_capacity=6), [
        step(0, 4, prefill={0: 3}, yielded=[0], kv=3),
        step(4, 8, prefill={1: 2}, decode=[0], yielded=[1, 0], preempted=[2], kv=6),
        step(8, 10, decode=[0], yielded=[0], finished=[0], preempted=[1], kv=0),
        step(10, 15, prefill={1: 3, 2: 1}, yielded=[1, 2], finished=[2], kv=3),
        step(15, 17, decode=[1], yielded=[1], finished=[1], kv=0),
    ], [(3, 4.5, 0), (3, 2.0, 4), (1, 0.0, 5), (4, 5.0, 0), (1, 0.0, 4)], [
        result(PREEMPT[0], ttft=4.0, e2e=10.0, tpot=3.0, itl=[4.0, 2.0], queue=0.0, prefill=4.0),
        # B: tokens at 8, 15, 17; in prefill before its first token: step 2 (4 s)
        result(PREEMPT[1], ttft=7.0, e2e=16.0, tpot=4.5, itl=[7.0, 2.0], queue=3.0, prefill=4.0, preemptions=1),
        # C: first admitted at 4 (queue 2), pre-empted at once; prefilled only in step 4 (5 s), its token at 15
        result(PREEMPT[2], ttft=13.0, e2e=13.0, tpot=NAN, itl=[], queue=2.0, prefill=5.0, preemptions=1),
    ])


def test_the_newest_is_preempted_whatever_its_id():
    """The capacity-7 trace above with the ids relabelled so that the newest request (B, now id 3) has a lower
    id than the oldest (A, now 5): B is still the one pre-empted."""
    ids = {0: 5, 1: 3, 2: 4}
    reqs = [dict(r, id=ids[r["id"]]) for r in PREEMPT]
    res, trace, calls = run(reqs, simulator.Policy("continuous", kv_capacity=7))
    assert [s["preempted"] for s in trace] == [[], [], [3], [], []]
    assert calls == [(3, 4.5, 0), (4, 2.5, 4), (1, 0.0, 5), (3, 4.5, 0), (1, 0.0, 4)]
    assert [(r["id"], r["preemptions"], r["e2e"]) for r in res] == [(3, 1, 16.0), (4, 0, 7.0), (5, 0, 11.0)]


def test_preemption_tie_goes_to_the_higher_id():
    """Two requests admitted together at 0 s (2 in, 4 out each), kv_capacity 8.

    step 1 [0, 5]:   prefill both (4 tokens, work 2 + 2); KV 2 + 2
    step 2 [5, 8]:   each grows to 3 (KV 6); decode both reading 6
    step 3 [8, 11]:  each grows to 4 (KV 8, full); decode both reading 8
    at 11 s: 0 needs 5 and the KV is full: both were admitted at 0, so the higher id (1) is pre-empted (KV 4,
                     and 1 is to prefill its 2 + 3 tokens again); 0 grows to 5
    step 4 [11, 13]: decode 0 reading 5; done: KV 0
    step 5 [13, 19]: 1 is admitted (5 reserved), prefills its 2 + 3 tokens again (work 5 x 2.5 = 12.5) and
                     yields its last token
    """
    two = [req(0, 0, 2, 4), req(1, 0, 2, 4)]
    res = check(two, simulator.Policy("continuous", kv_capacity=8), [
        step(0, 5, prefill={0: 2, 1: 2}, yielded=[0, 1], kv=4),
        step(5, 8, decode=[0, 1], yielded=[0, 1], kv=6),
        step(8, 11, decode=[0, 1], yielded=[0, 1], kv=8),
        step(11, 13, decode=[0], yielded=[0], finished=[0], preempted=[1], kv=0),
        step(13, 19, prefill={1: 5}, yielded=[1], finished=[1], kv=0),
    ], [(4, 4.0, 0), (2, 0.0, 6), (2, 0.0, 8), (1, 0.0, 5), (5, 12.5, 0)], [
        # 0: tokens at 5, 8, 11, 13
        result(two[0], ttft=5.0, e2e=13.0, tpot=8 / 3, itl=[3.0, 3.0, 2.0], queue=0.0, prefill=5.0),
        # 1: tokens at 5, 8, 11, 19; step 1 (5 s) before its first token; step 5 recomputes after it
        result(two[1], ttft=5.0, e2e=19.0, tpot=14 / 3, itl=[3.0, 3.0, 8.0], queue=0.0, prefill=5.0,
               preemptions=1),
    ])
    assert [r["preemptions"] for r in res] == [0, 1]


def test_static_batches_respect_the_kv_capacity_too():
    """Static, max_batch 2, kv_capacity 8, the two requests above: the locked batch loses request 1 while
    planning the step at 11 s as in the continuous case; it waits in the queue until the batch (now request
    0 alone) is done and then forms a batch of its own."""
    two = [req(0, 0, 2, 4), req(1, 0, 2, 4)]
    res, trace, _ = run(two, simulator.Policy("static", max_batch=2, kv_capacity=8))
    assert [(s["start"], s["end"], s["preempted"]) for s in trace] == [
        (0.0, 5.0, []), (5.0, 8.0, []), (8.0, 11.0, []), (11.0, 13.0, [1]), (13.0, 19.0, [])]
    assert [r["e2e"] for r in res] == [13.0, 19.0]


def test_bucket_priority_decides_who_runs_first():
    """max_running 1; the long bucket has priority 0 (first), the short one 1. Both arrive at 0 s: the long
    prompt (3 in, 2 out) runs first although the short bucket is listed first.

    step 1 [0, 4]: prefill 0 (KV 3); step 2 [4, 6]: decode 0 reading 4; step 3 [6, 8]: prefill 1 (1 token)."""
    reqs = [req(0, 0, 3, 2), req(1, 0, 1, 1)]
    buckets = (simulator.Bucket("short", 2, priority=1), simulator.Bucket("long", 10**6, priority=0))
    check(reqs, simulator.Policy("continuous", max_running=1, buckets=buckets), [
        step(0, 4, prefill={0: 3}, yielded=[0], kv=3),
        step(4, 6, decode=[0], yielded=[0], finished=[0], kv=0),
        step(6, 8, prefill={1: 1}, yielded=[1], finished=[1], kv=0),
    ], [(3, 4.5, 0), (1, 0.0, 4), (1, 0.5, 0)], [
        result(reqs[0], ttft=4.0, e2e=6.0, tpot=2.0, itl=[2.0], queue=0.0, prefill=4.0, bucket="long"),
        result(reqs[1], ttft=8.0, e2e=8.0, tpot=NAN, itl=[], queue=6.0, prefill=2.0, bucket="short"),
    ])


def test_bucket_running_cap_holds_back_its_own_requests_only():
    """The long bucket runs at most 1 request. At 0 s: the short prompt (1 token) and one long prompt (3)
    are admitted, the second long one (4) waits for the first to finish.

    step 1 [0, 5]: prefill 2 (1 token) and 0 (3 tokens): work 0.5 + 4.5; both done
    step 2 [5, 10]: prefill 1, 4 tokens, work 8; done"""
    reqs = [req(0, 0, 3, 1), req(1, 0, 4, 1), req(2, 0, 1, 1)]
    buckets = (simulator.Bucket("short", 2), simulator.Bucket("long", 10**6, max_running=1))
    res = check(reqs, simulator.Policy("continuous", buckets=buckets), [
        step(0, 5, prefill={2: 1, 0: 3}, yielded=[2, 0], finished=[2, 0], kv=0),
        step(5, 10, prefill={1: 4}, yielded=[1], finished=[1], kv=0),
    ], [(4, 5.0, 0), (4, 8.0, 0)], [
        result(reqs[0], ttft=5.0, e2e=5.0, tpot=NAN, itl=[], queue=0.0, prefill=5.0, bucket="long"),
        result(reqs[1], ttft=10.0, e2e=10.0, tpot=NAN, itl=[], queue=5.0, prefill=5.0, bucket="long"),
        result(reqs[2], ttft=5.0, e2e=5.0, tpot=NAN, itl=[], queue=0.0, prefill=5.0, bucket="short"),
    ])
    assert [r["bucket"] for r in res] == ["long", "long", "short"]


def test_bucket_running_cap_counts_the_running_requests_by_hand():
    """Three 2-token prompts at 0 s, all in the long bucket, which runs at most 2 (the short bucket takes
    prompts of 1 token).

    step 1 [0, 5]:   prefill 0 and 1 (work 2 + 2); KV 2 + 2; 2 waits: 2 of its bucket run
    step 2 [5, 8]:   decode 0, 1 reading 6 (KV 3 + 3); 0 (2 tokens) done; KV: 1 holds 3
    at 8 s one of the bucket runs: 2 is admitted (KV 3 + 2)
    step 3 [8, 12]:  prefill 2 (work 2), decode 1 reading 4 (KV 4 + 2); 2 done; KV: 1 holds 4
    step 4 [12, 14]: decode 1 reading 5; done
    """
    reqs = [req(0, 0, 2, 2), req(1, 0, 2, 4), req(2, 0, 2, 1)]
    buckets = (simulator.Bucket("short", 1), simulator.Bucket("long", 10**6, max_running=2))
    check(reqs, simulator.Policy("continuous", buckets=buckets), [
        step(0, 5, prefill={0: 2, 1: 2}, yielded=[0, 1], kv=4),
        step(5, 8, decode=[0, 1], yielded=[0, 1], finished=[0], kv=3),
        step(8, 12, prefill={2: 2}, decode=[1], yielded=[2, 1], finished=[2], kv=4),
        step(12, 14, decode=[1], yielded=[1], finished=[1], kv=0),
    ], [(4, 4.0, 0), (2, 0.0, 6), (3, 2.0, 4), (1, 0.0, 5)], [
        result(reqs[0], ttft=5.0, e2e=8.0, tpot=3.0, itl=[3.0], queue=0.0, prefill=5.0, bucket="long"),
        result(reqs[1], ttft=5.0, e2e=14.0, tpot=3.0, itl=[3.0, 4.0, 2.0], queue=0.0, prefill=5.0, bucket="long"),
        result(reqs[2], ttft=12.0, e2e=12.0, tpot=NAN, itl=[], queue=8.0, prefill=4.0, bucket="long"),
    ])


def test_max_running_and_the_token_budget_bound_admission():
    """max_running 2: of three prompts at 0 s, two run; token_budget 4 without chunks: a 3-token prompt
    after a 2-token one does not fit (2 + 3 > 4) and waits for the next step, while the step's first
    prompt is admitted whatever its size."""
    reqs = [req(0, 0, 2, 1), req(1, 0, 3, 1), req(2, 0, 1, 1)]
    _, trace, _ = run(reqs, simulator.Policy("continuous", max_running=2))
    assert [s["prefill"] for s in trace] == [{0: 2, 1: 3}, {2: 1}]
    _, trace, _ = run(reqs, simulator.Policy("continuous", token_budget=4))
    assert [s["prefill"] for s in trace] == [{0: 2}, {1: 3, 2: 1}]
    _, trace, _ = run([req(0, 0, 9, 1)], simulator.Policy("continuous", token_budget=4))
    assert [s["prefill"] for s in trace] == [{0: 9}]


def test_summary_and_goodput_of_the_static_trace_by_hand():
    """The static trace's results: TTFT 7, 6, 12; TPOT 2.5, 3 (C has none); E2E 12, 9, 12; queued 1, 0, 10;
    6 tokens from the first arrival (0 s) to the last finish (14 s)."""
    res, _, _ = run(THREE, simulator.Policy("static", max_batch=2))
    s = simulator.summary(res)
    # sorted TTFT 6, 7, 12: P95 at rank 2 x 0.95 = 1.9 -> 7 + 0.9 x 5 = 11.5; P99 at 1.98 -> 11.9
    want = {"requests": 3, "tokens_per_s": 6 / 14, "ttft_p50": 7.0, "ttft_p95": 11.5, "ttft_p99": 11.9,
            "tpot_p50": 2.75, "tpot_p95": 2.975, "tpot_p99": 2.995, "e2e_p50": 12.0, "e2e_p95": 12.0, "e2e_p99": 12.0,
            "queue_p50": 1.0, "queue_p95": 9.1, "queue_p99": 9.82}
    assert same(s, want), s
    doc = simulator.summary(res, "doc")  # C alone, over the whole run's span
    assert doc["requests"] == 1 and doc["tokens_per_s"] == pytest.approx(1 / 14) and doc["ttft_p99"] == 12.0
    assert math.isnan(doc["tpot_p50"])
    assert simulator.summary(res, "video") == {}
    # A meets TTFT 7 and TPOT 2.5 exactly; B misses the TPOT, C the TTFT
    assert simulator.goodput(res, 7.0, 2.5) == pytest.approx(3 / 14)
    assert simulator.goodput(res, 12.0, 2.5) == pytest.approx(4 / 14)  # and C, which has no TPOT
    assert simulator.goodput(res, 12.0, 3.0, kind="chat") == pytest.approx(5 / 14)
    assert simulator.goodput(res, 6.9, 10.0) == pytest.approx(2 / 14)


def test_admission_with_chunks_needs_only_the_first_chunk():
    """chunk 2, token_budget 4: a 5-token prompt after a 2-token one is admitted (its first chunk, 2, fits
    the 2 tokens left) and prefilled 2 + 2 + 1."""
    _, trace, _ = run([req(0, 0, 2, 1), req(1, 0, 5, 1)], simulator.Policy("continuous", chunk=2, token_budget=4))
    assert [s["prefill"] for s in trace] == [{0: 2, 1: 2}, {1: 2}, {1: 1}]


def test_a_prompt_that_does_not_fit_the_step_lets_a_later_one_through():
    """chunk 3, token_budget 4. Step 1 [0, 4] prefills 3 of prompt 0 (8 tokens). At 4 s prompts 1 (3 tokens)
    and 2 (1 token) are admitted. Step 2: prompt 0's next chunk (3) leaves 1 token of budget: prompt 1's
    chunk of 3 waits, prompt 2's single token goes. Step 3: 0's last 2; 1's 3 do not fit the 2 left.
    Step 4: prompt 1."""
    reqs = [req(0, 0, 8, 1), req(1, 0.5, 3, 1), req(2, 0.5, 1, 1)]
    _, trace, _ = run(reqs, simulator.Policy("continuous", chunk=3, token_budget=4))
    assert [s["prefill"] for s in trace] == [{0: 3}, {0: 3, 2: 1}, {0: 2}, {1: 3}]


def test_static_and_dynamic_batches_ignore_the_token_budget():
    """A static batch prefills all its prompts in its first step, however many tokens they hold."""
    for kind in ("static", "dynamic"):
        _, trace, calls = run([req(0, 0, 2, 1), req(1, 0, 2, 1)], simulator.Policy(kind, max_batch=2, token_budget=3))
        assert [s["prefill"] for s in trace] == [{0: 2, 1: 2}] and calls == [(4, 4.0, 0)]


def test_a_held_bucket_does_not_hold_back_the_buckets_after_it():
    """The short bucket (first by priority) has a window of 5 s, the long one none: the long prompt that
    arrives at 0 s is admitted at once (its step lasts 1 + 10 s), while the short one waits for its window
    and is admitted at the first step after it closes, at 11 s."""
    reqs = [req(0, 0, 4, 1), req(1, 0, 10, 1), req(2, 100, 4, 1)]
    buckets = (simulator.Bucket("short", 5, priority=0, max_wait=5.0), simulator.Bucket("long", 10**6, priority=1, max_wait=0.0))
    res, trace, _ = run(reqs, simulator.Policy("continuous", buckets=buckets))
    assert [(s["start"], s["prefill"]) for s in trace] == [(0.0, {1: 10}), (11.0, {0: 4}), (100.0, {2: 4})]
    assert [r["queue"] for r in res] == [11.0, 0.0, 0.0]


def test_a_readmitted_request_holds_its_kv_once_by_hand():
    """Two requests at 0 s, 10 + 80 and 10 + 60 tokens, kv_capacity 100. Alone, request 1 needs at most
    10 + 59 = 69 tokens of KV (its last decode reads its prompt and 59 tokens): once request 0 has finished
    it must never be pre-empted again.

    step 1 [0, 21]:     prefill both (20 tokens); both yield: KV 10 + 10 = 20
    decode steps 1 to 40 (3 s each): before decode k each grows to 10 + k: after the 40th, ending at
                        21 + 40 x 3 = 141, KV 50 + 50 = 100 (full), each with 41 tokens
    at 141 s:           request 0 needs 51: request 1 (the higher id of two admitted together) is pre-empted
                        with 41 tokens generated (KV 50), 0 grows (KV 51)
    trace[41] [141, 143]: decode 0 alone; KV 51
    then:               request 1 needs 10 + 41 = 51 and waits (51 + 51 > 100); request 0 decodes alone (2 s
                        each) from 42 to 80 tokens, 38 more steps, and leaves at 143 + 38 x 2 = 219; KV 0
    trace[80] [219, 271]: request 1 reserves and prefills its 10 + 41 tokens again (52 s) and yields its
                        42nd: KV 51
    trace[81:99]:       it decodes its last 18 tokens alone (2 s each), growing to 10 + 59 = 69 for the last
                        one, and leaves at 271 + 36 = 307; the trace's KV after each step: at most 68 (after
                        the last it is released); 99 steps in all
    With chunks of 8 the prompts go in as 8 then 2 (steps [0, 17] and [17, 22]; the whole prompts reserved
    at admission), everything after is 1 s later and one index on, and request 1's recomputation takes 6
    chunks of 8 and one of 3 (52 s + 6 s of steps; 106 steps)."""
    two = [req(0, 0, 10, 80), req(1, 0, 10, 60)]
    for chunk, first, pre, leave0, leave1, steps in [(None, 21.0, 41, 219.0, 307.0, 99), (8, 22.0, 42, 220.0, 314.0, 106)]:
        res, trace, _ = run(two, simulator.Policy("continuous", kv_capacity=100, chunk=chunk))
        assert len(trace) == steps
        assert [i for i, s in enumerate(trace) if s["preempted"]] == [pre] and trace[pre]["preempted"] == [1]
        assert trace[pre]["decode"] == [0] and trace[pre - 1]["decode"] == [0, 1]
        assert (trace[pre]["end"], trace[pre]["kv"], trace[pre - 1]["kv"]) == (first + 40 * 3 + 2, 51, 100)
        done0 = next(i for i, s in enumerate(trace) if s["finished"] == [0])
        assert trace[done0]["end"] == leave0 and trace[done0]["kv"] == 0
        after = trace[done0 + 1:]
        assert not any(s["preempted"] for s in after) and max(s["kv"] for s in after) == 68
        assert after[-1]["decode"] == [1] and after[-1]["kv"] == 0
        assert sum(s["prefill"].get(1, 0) for s in after) == 51  # its prompt and 41 tokens, once
        assert [(r["preemptions"], r["ttft"], r["e2e"], r["tokens"]) for r in res] == [
            (0, first, leave0, 80), (1, first, leave1, 60)]


def test_a_scheduler_that_forgets_its_chunks_recomputes_forever_and_is_stopped_by_hand(forgetful_scheduler):
    """A planted bug: ``finish_step`` keeps a chunk's progress only when it completes the prompt (a chunk
    that does not is forgotten: the request prefills it again). Two requests of 4 + 4 tokens at 0 s, chunks
    of 4, kv_capacity 10: their prompts fit one chunk, but request 1, pre-empted, has 4 + 2 tokens to
    recompute, and recomputes its first chunk forever.

    turn 1 [0, 9]:   both admitted (KV 4 + 4), prefill 4 each (work 2 x 8) and yield; 8 prompt tokens
                     computed, all 8 recomputable while the two run
    turn 2 [9, 12]:  each grows to 5 (KV 10); decode both
    turn 3 [12, 14]: 0 needs 6: 1 (the higher id) is pre-empted (KV 5) and is to prefill 4 + 2 tokens; 0
                     grows (KV 6) and decodes
    turn 4 [14, 16]: 1 (6 + 6 > 10) waits; 0 decodes its 4th token and leaves: KV 0; 4 tokens recomputable
    turn 5 [16, 21]: 1 reserves 6 (KV 6) and prefills [0, 4) (work 8), which is forgotten; tokens it had
                     already computed: no progress
    turns 6 on:      the same step again. The limit is STALL_LIMIT 3 + 1 queue + 4 tokens request 1 may
                     recompute = 8: turn 14's check, the 9th turn in a row without progress (turns 5 to 13),
                     raises: 13 steps, the last ending at 16 + 9 x 5 = 61 s, request 1 at 0 of 6 tokens."""
    two = [req(0, 0, 4, 4), req(1, 0, 4, 4)]
    policy = simulator.Policy("continuous", kv_capacity=10, chunk=4)
    cost, trace = Ticks(), []
    with pytest.raises(RuntimeError, match=r"^the simulation made no progress in 9 loop turns \(no arrival, no token, "
                                           r"no prompt token prefilled for the first time\) at t=61.000000 s: 1 running: "
                                           r"1 \(prefilled 0/6, generated 2/4\); 0 queued; 1 of 2 done; 6 tokens of KV "
                                           r"in use \(of 10\); a bug in the scheduler or the policy, not in the workload$"):
        simulator.simulate(two, cost, policy, trace=trace)
    assert cost.calls == [(8, 16.0, 0), (2, 0.0, 10), (1, 0.0, 6), (1, 0.0, 7)] + [(4, 8.0, 0)] * 9
    assert [(s["end"], s["preempted"], s["kv"]) for s in trace[:4]] == [(9.0, [], 8), (12.0, [], 10),
                                                                        (14.0, [1], 6), (16.0, [], 0)]
    assert [(s["end"], s["prefill"], s["yielded"]) for s in trace[4:]] == [(21.0 + 5 * k, {1: 4}, []) for k in range(9)]
