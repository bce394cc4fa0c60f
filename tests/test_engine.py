"""The serving engine (lib.engine) on the CPU: requests refused cleanly, the schedule against chapter 6's
simulator decision by decision, greedy tokens against a reference generation loop (with chunked prefill,
pre-emption and the prefix cache), top-p draws, no leaked block under any sequence of adds, steps and aborts,
overload, the metrics and the asyncio front end."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lib import models, simulator, workloads
from lib.engine import EngineConfig, EngineOverloaded, LLMEngine, RequestError, SamplingParams, replay
from lib.engine.metrics import PrometheusExporter, decomposition, summary
from lib.engine.runner import StepResult
from lib.engine.server import AsyncEngine, open_loop
from lib.kv_pool import KVPool

COST = simulator.MeasuredCostModel.fitted([1, 64, 1024, 8192], [0.004, 0.0042, 0.012, 0.09], 1e-12, 0.0005, 2e-9)
MIX = (("chat", workloads.CHAT, 0.85), ("doc", workloads.LONG_DOC, 0.15))
TINY = models.CONFIGS["tiny"]


@pytest.fixture(scope="module")
def tiny():
    return models.Llama.random(TINY, seed=0)


def prompts_for(wl, vocab=32000, seed=0):
    rng = random.Random(seed)  # one stream: no two prompts share a block
    return [[rng.randrange(vocab) for _ in range(r["input"])] for r in wl]


def reference(m, prompt, n):
    """Greedy generation by a full prefill per token: the oracle for the engine's tokens."""
    pool, toks = m.new_pool(64, 4), list(prompt)
    for _ in range(n):
        toks.append(int(m.prefill(toks, pool, list(range(-(-len(toks) // 4))), last_only=True).argmax(-1)))
    return toks[len(prompt):]


def blocks_accounted(e: LLMEngine) -> int:
    """Blocks free, evictable or held by a running request (a shared block once): all usable blocks, when none
    leaks. Also checks each held block's reference count against the requests holding it."""
    holders = {}
    for x in e.scheduler.running:
        for b in x.lease.blocks:
            holders[b] = holders.get(b, 0) + 1
    assert all(e.pool.refs[b] == n for b, n in holders.items())
    return e.pool.free_count + len(e.scheduler.cache.evictable) + len(holders)


# ---------------------------------------------------------------------------- bad input

BAD = [([], {}, "empty"), ([1] * 60, {"max_tokens": 10}, "max_model_len"), ([1, 2], {"max_tokens": 0}, "max_tokens"),
       ([1, 2], {"max_tokens": -3}, "max_tokens"), ([1], {"temperature": math.nan}, "temperature"),
       ([1], {"temperature": -0.5}, "temperature"), ([1], {"top_p": 0.0}, "top_p"), ([1], {"top_p": 1.5}, "top_p"),
       ([1], {"top_p": math.nan}, "top_p"), ([1, 97], {}, "vocabulary"), ([1, -1], {}, "vocabulary"),
       ([1.0, 2], {}, "integers")]


@pytest.mark.parametrize("prompt,kw,words", BAD)
def test_bad_requests_are_refused_and_change_nothing(prompt, kw, words):
    e = LLMEngine.virtual(EngineConfig(block_size=4, num_blocks=20, max_model_len=64), COST, vocab=97)
    free = e.pool.free_count
    with pytest.raises(RequestError, match=words) as err:
        sp = SamplingParams(**kw)  # bad sampling parameters fail here, before the engine sees them
        e.add_request(prompt, sp)
    assert e.unfinished == 0 and e.pool.free_count == free
    assert e.rejects["invalid"] == (1 if "add_request" in "".join(str(t) for t in err.traceback) else 0)
    assert e.step() == [] and e.requests == {}
    with pytest.raises(RequestError, match="SamplingParams"):
        e.add_request([1, 2], (3,))
    # the same fields as a request body's dict: every bad one is refused by the engine, and counted
    before = e.rejects["invalid"]
    with pytest.raises(RequestError, match=words):
        e.add_request(prompt, kw)
    assert e.rejects["invalid"] == before + 1 and e.unfinished == 0 and e.pool.free_count == free


def test_a_request_longer_than_the_pool_is_refused():
    e = LLMEngine.virtual(EngineConfig(block_size=4, num_blocks=5, max_model_len=64), COST, vocab=97)
    with pytest.raises(RequestError, match="KV blocks"):
        e.add_request([1] * 18, SamplingParams(max_tokens=3))  # 21 tokens: 6 blocks of 4, the pool has 5
    e.add_request([1] * 17, SamplingParams(max_tokens=3))  # 20 tokens: 5 blocks fit
    e.close()
    e.run()
    assert [r["output"] for r in e.results()] == [3]


@pytest.mark.parametrize("kw", [{"max_num_seqs": 0}, {"block_size": 2.0}, {"policy": "fifo"}, {"max_wait": -1},
                                {"graph_batch_sizes": (4, 2)}, {"num_blocks": 0},
                                {"policy": "static", "buckets": (simulator.Bucket("a", 10),)}])
def test_bad_configs_are_refused(kw):
    with pytest.raises(ValueError):
        EngineConfig(**kw)


# ---------------------------------------------------------------------------- the schedule = the simulator's

POLICIES = {
    "continuous, chunked": EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048, long_prefill_token_threshold=512),
    "continuous, whole prompts, prefill first": EngineConfig(max_num_seqs=32, max_num_batched_tokens=4096,
                                                              enable_chunked_prefill=False, prefill_first=True),
    "queues by length": EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048, long_prefill_token_threshold=1024,
                                     buckets=(simulator.Bucket("chat", 2048, priority=0, max_wait=0.0),
                                              simulator.Bucket("doc", 10 ** 9, priority=1, max_wait=0.05))),
    "window": EngineConfig(max_num_seqs=16, max_num_batched_tokens=8192, max_wait=0.02),
    "static": EngineConfig(policy="static", max_num_seqs=8),
    "dynamic": EngineConfig(policy="dynamic", max_num_seqs=8, max_wait=0.05),
}


class DetailCost:
    """A cost that depends on which requests a step holds (``step_detail``): the longest decode's KV and the
    number of prompts prefilled, on top of ``COST``."""

    def step(self, tokens, work, kv):
        raise AssertionError("a cost with step_detail must be asked through it")

    def step_detail(self, tokens, work, kv, *, prefills, decode_ctx_max):
        return COST.step(tokens, work, kv) + 3e-3 * max(prefills - 1, 0) + 2e-7 * decode_ctx_max


@pytest.mark.parametrize("cost", ["tokens", "detail"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_virtual_engine_schedules_as_the_simulator(name, cost):
    """On the simulator's clock and costs the engine's decisions are the simulator's: every request's TTFT,
    E2E, time queued and time in prefill agree to rounding (prompts share no block, KV is ample), with a
    cost of token counts and with one that asks which requests a step holds."""
    cfg = POLICIES[name]
    cfg = EngineConfig(**{**cfg.__dict__, "max_model_len": 40000, "enable_prefix_caching": False})
    cm = COST if cost == "tokens" else DetailCost()
    wl = workloads.requests(80, 6.0, mix=MIX, seed=5)
    got = replay(LLMEngine.virtual(cfg, cm, num_blocks=150_000), wl, prompts_for(wl))
    sim = simulator.simulate(wl, cm, cfg.as_policy())
    assert [r["id"] for r in got] == [r["id"] for r in sim] == list(range(80))
    for a, b in zip(got, sim):
        for k in ("ttft", "e2e", "queue", "prefill"):
            assert a[k] == pytest.approx(b[k], abs=1e-9), (a["id"], k)
        assert a["tokens"] == b["tokens"] == b["output"]


def test_virtual_engine_and_simulator_differ_when_the_cache_hits():
    """The oracle above is not vacuous: with shared prompts and the prefix cache on, prefills get shorter. The
    engine computes exactly the tokens the cache did not hold (every prompt token of the simulator's, less the
    cached ones), and its steps are that much shorter: well beyond rounding (the cached 512-token prefix is
    about half of each prompt; the simulator's prefill time is about 1.45 times the engine's)."""
    cfg = EngineConfig(max_num_seqs=16, max_num_batched_tokens=4096, max_model_len=40000)
    wl = workloads.requests(30, 4.0, mix=(("chat", workloads.CHAT, 1.0),), seed=1)
    shared = prompts_for([{"input": 512}])[0]
    prompts = [shared + p for p in prompts_for(wl, seed=2)]
    wl = [{**r, "input": len(p)} for r, p in zip(wl, prompts)]
    e = LLMEngine.virtual(cfg, COST, num_blocks=50_000)
    got = replay(e, wl, prompts)
    trace = []
    sim = simulator.simulate(wl, COST, cfg.as_policy(), trace=trace)
    cached = sum(r["cached"] for r in got)
    assert cached >= 29 * 512 and all(r["preemptions"] == 0 for r in got)
    assert sum(sum(s["prefill"].values()) for s in trace) == sum(r["input"] for r in wl)
    assert sum(s["prefill_tokens"] for s in e.steps) == sum(r["input"] for r in wl) - cached
    assert sum(r["prefill"] for r in got) < 0.8 * sum(r["prefill"] for r in sim)
    assert sum(r["ttft"] for r in got) < 0.8 * sum(r["ttft"] for r in sim)


# ---------------------------------------------------------------------------- tokens on the model

def test_greedy_tokens_equal_a_reference_loop_with_chunks_and_preemption(tiny):
    """Chunked prefill (16 tokens a step), a pool of 14 blocks of 4 that forces pre-emption: every request's
    tokens equal a full prefill per token, and every block comes back."""
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, block_size=4, num_blocks=14, max_model_len=48)
    e = LLMEngine.from_model(tiny, cfg)
    rng = random.Random(0)
    prompts = [[rng.randrange(97) for _ in range(rng.randint(1, 24))] for _ in range(8)]
    ids = [e.add_request(p, SamplingParams(max_tokens=rng.randint(1, 12))) for p in prompts]
    e.close()
    e.run()
    assert e.scheduler.preemptions > 0
    assert any(len(p) > 16 for p in prompts)  # some prompt took two chunks
    for i, p in zip(ids, prompts):
        x = e.requests[i]
        assert x.output == reference(tiny, p, len(x.output)) and len(x.output) == x.params.max_tokens
    assert blocks_accounted(e) == e.usable_blocks
    assert max(e.pool.refs) == 1  # the padding block alone is held


def test_prefix_cache_hits_and_changes_no_token(tiny):
    cfg = dict(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, num_blocks=40, max_model_len=64)
    rng = random.Random(1)
    system = [rng.randrange(97) for _ in range(20)]
    prompts = [system + [rng.randrange(97) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    outs = {}
    for caching in (True, False):
        e = LLMEngine.from_model(tiny, EngineConfig(**cfg, enable_prefix_caching=caching))
        for p in prompts:  # one after another, so that the later ones find the first one's blocks
            e.add_request(p, SamplingParams(max_tokens=4))
            e.run()
        outs[caching] = [r["cached"] for r in e.results()], [e.requests[i].output for i in sorted(e.requests)]
    assert outs[True][0] == [0, 20, 20, 20] and outs[False][0] == [0, 0, 0, 0]
    assert outs[True][1] == outs[False][1]


def test_top_p_tokens(tiny):
    cfg = EngineConfig(max_num_seqs=4, block_size=4, num_blocks=40, max_model_len=64, seed=3)
    prompt = [5, 17, 33, 2, 9]

    def run(sp):
        e = LLMEngine.from_model(tiny, cfg)
        i = e.add_request(prompt, sp)
        e.run()
        return e.requests[i].output

    greedy = run(SamplingParams(max_tokens=6))
    assert run(SamplingParams(max_tokens=6, temperature=0.7, top_p=1e-6)) == greedy
    a, b = (run(SamplingParams(max_tokens=6, temperature=1.5, top_p=0.95)) for _ in range(2))
    assert a == b and all(0 <= t < TINY.vocab for t in a)
    assert a != greedy  # flat random logits at temperature 1.5: six draws do not all hit the argmax


def test_stop_tokens_end_a_request(tiny):
    e = LLMEngine.from_model(tiny, EngineConfig(block_size=4, num_blocks=40, max_model_len=64))
    first = reference(tiny, [3, 4, 5], 3)
    i = e.add_request([3, 4, 5], SamplingParams(max_tokens=10, stop_token_ids=(first[1],)))
    j = e.add_request([3, 4, 5], SamplingParams(max_tokens=3, stop_token_ids=(first[1],), ignore_eos=True))
    e.run()
    assert e.requests[i].output == first[:2] and e.requests[i].finish_reason == "stop"
    assert e.requests[j].output == first and e.requests[j].finish_reason == "length"


# ---------------------------------------------------------------------------- no leak, no loss

class EngineAgainstItsBlocks(RuleBasedStateMachine):
    """Adds, steps and aborts in any order on a small pool (pre-emption happens): no block leaks, no request
    is lost or finishes twice, and a finished request has exactly its max_tokens."""

    def __init__(self):
        super().__init__()
        cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=12, block_size=4, num_blocks=12, max_model_len=40)
        self.e = LLMEngine.virtual(cfg, COST, vocab=50)
        self.finished_events = {}
        self.e.on_token(lambda rid, tok, fin: self.finished_events.__setitem__(
            rid, self.finished_events.get(rid, 0) + fin))
        self.added = []
        self.aborted = set()

    @rule(n=st.integers(1, 30), out=st.integers(1, 8), shared=st.booleans())
    def add(self, n, out, shared):
        prompt = ([7] * n) if shared else [len(self.added) % 50] + [(3 * len(self.added) + k) % 50 for k in range(n - 1)]
        self.added.append(self.e.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True)))

    @rule(k=st.integers(1, 4))
    def step(self, k):
        for _ in range(k):
            self.e.step()

    @rule(i=st.integers(0, 100))
    def abort(self, i):
        if self.added:
            rid = self.added[i % len(self.added)]
            self.e.abort(rid)
            if self.e.requests.get(rid) is None or self.e.requests[rid].status not in ("finished",):
                self.aborted.add(rid)

    @invariant()
    def blocks_add_up(self):
        assert blocks_accounted(self.e) == self.e.usable_blocks
        assert all(r >= 0 for r in self.e.pool.refs)

    @invariant()
    def nothing_finishes_twice(self):
        assert all(v <= 1 for v in self.finished_events.values())

    def teardown(self):
        self.e.close()
        self.e.run()
        assert self.e.unfinished == 0
        assert self.e.pool.free_count + len(self.e.scheduler.cache.evictable) == self.e.usable_blocks
        assert all(r == 0 for r in self.e.pool.refs)
        for rid in self.added:
            x = self.e.requests[rid]
            assert x.status in ("finished", "aborted")
            if x.status == "finished":
                assert len(x.output) == x.params.max_tokens
            else:
                assert rid in self.aborted


EngineAgainstItsBlocks.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestEngineAgainstItsBlocks = EngineAgainstItsBlocks.TestCase


def test_overload_rejects_with_a_reason_and_loses_nothing():
    cfg = EngineConfig(max_num_seqs=2, block_size=4, num_blocks=50, max_model_len=64, max_queue=3)
    e = LLMEngine.virtual(cfg, COST, vocab=50)
    accepted, refused = [], 0
    for i in range(10):
        try:
            accepted.append(e.add_request([i + 1] * 5, SamplingParams(max_tokens=3, ignore_eos=True)))
        except EngineOverloaded:
            refused += 1
        if i % 3 == 2:
            e.step()
    e.close()
    e.run()
    assert refused > 0 and e.rejects["queue_full"] == refused
    assert sorted(r["id"] for r in e.results()) == sorted(accepted)
    assert all(r["tokens"] == 3 for r in e.results())


# ---------------------------------------------------------------------------- metrics

def test_metrics_and_the_prometheus_page():
    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, block_size=4, num_blocks=400, max_model_len=512)
    e = LLMEngine.virtual(cfg, COST, vocab=50)
    exporter = PrometheusExporter(e)
    wl = workloads.requests(20, 50.0, mix=(("chat", {"input": (60, 0.5, 4, 200), "output": (8, 0.5, 1, 30)}, 1.0),),
                            seed=2)
    with pytest.raises(RequestError):
        e.add_request([], None)
    res = replay(e, wl, [[1, 2, 3, 4] * 4 + p for p in prompts_for(wl, vocab=50)])
    page = exporter.text()
    assert "engine_time_to_first_token_seconds_count 20.0" in page
    assert f"engine_generation_tokens_total {float(sum(r['output'] for r in wl))}" in page
    assert 'engine_request_rejects_total{reason="invalid"} 1.0' in page
    hits = sum(r["cached"] for r in res)
    assert hits > 0 and f"engine_prefix_cache_hits_total {float(hits)}" in page
    s = summary(res)
    gaps = sorted(g for r in res for g in r["itl"])
    assert s["itl_p50"] == pytest.approx(simulator.percentile(gaps, 50))
    assert s["ttft_p95"] == simulator.summary(res)["ttft_p95"]
    d = decomposition(res, q=50)
    for r in res:  # the stages of each request add up to its TTFT
        assert r["queue"] + r["prefill"] <= r["ttft"] + 1e-12
    assert d["ttft"] == pytest.approx(simulator.percentile([r["ttft"] for r in res], 50))


# ---------------------------------------------------------------------------- the asyncio front end

class InstantRunner:
    """A runner that computes nothing: the next token is the request's length modulo 50."""

    def run(self, plan):
        return StepResult([x.length % 50 for x in plan.sampled], float("nan"), 0.0, False)


def test_async_front_end_admits_a_request_due_during_a_step_at_the_next_step():
    """A request whose time comes while a step runs (its timer expires during the step) joins the very next
    step: the front end lets due requests in before it steps again, rather than one step later."""
    cfg = EngineConfig(max_num_seqs=4, block_size=4, num_blocks=60, max_model_len=64)
    e = LLMEngine(cfg, InstantRunner(), KVPool(60, 4, storage=False), vocab=50)
    late = {}

    async def main():
        loop = asyncio.get_running_loop()
        async with AsyncEngine(e) as a:
            def during(step, finished):  # runs inside the engine's step, as GPU work would
                if len(e.steps) == 2:  # the second step (index 1)
                    loop.call_later(0, lambda: late.setdefault("stream", a.submit([7, 8], SamplingParams(
                        max_tokens=2, ignore_eos=True))))
            e.on_step(during)
            first = a.submit([1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))
            return [t async for t in first], [t async for t in late["stream"]] if "stream" in late else None

    out, late_tokens = asyncio.run(main())
    assert late_tokens is not None and len(late_tokens) == 2
    admitted = [i for i, s in enumerate(e.steps) if s["prefill_tokens"] == 2]
    assert admitted == [2], f"the request due during step 1 was prefilled at step {admitted}, not step 2"


def test_async_front_end_streams_aborts_and_refuses():
    cfg = EngineConfig(max_num_seqs=4, block_size=4, num_blocks=60, max_model_len=64)
    e = LLMEngine(cfg, InstantRunner(), KVPool(60, 4, storage=False), vocab=50)
    wl = [{"id": i, "arrival": 0.002 * i, "output": 3 + i % 4, "kind": "chat"} for i in range(12)]
    prompts = [[1 + i % 40] * (2 + i) for i in range(12)]

    async def main():
        async with AsyncEngine(e) as a:
            out = await open_loop(a, wl, prompts)
            with pytest.raises(RequestError):
                a.submit([], SamplingParams())
            stream = a.submit([1, 2, 3], SamplingParams(max_tokens=40, ignore_eos=True))
            it = stream.__aiter__()
            first = await it.__anext__()
            await it.aclose()  # the client leaves: the request is aborted
            while e.unfinished:
                await asyncio.sleep(0.001)
        return out, first

    out, first = asyncio.run(main())
    for i, r in enumerate(wl):
        assert out["tokens"][i] == [(len(prompts[i]) + k) % 50 for k in range(r["output"])]
    assert [r["id"] for r in out["results"]] == list(range(12))
    assert first == 3 and e.aborted == 1
    assert e.pool.free_count + len(e.scheduler.cache.evictable) == e.usable_blocks
