"""Faults of the serving engine (lib.engine) and its front end, each refused with a message that says what to
change, or handled as its contract says: a lease grown by another cache, an arrival the clock has not
reached, a cost model that returns no time, stop tokens that are not a list, the Prometheus page between
steps, an abandoned stream, a static batch that cannot fill, a batching window on a virtual clock."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lib import simulator
from lib.engine import EngineConfig, EngineOverloaded, LLMEngine, RequestError, SamplingParams
from lib.engine.metrics import PrometheusExporter
from lib.engine.runner import StepResult
from lib.engine.scheduler import EngineCache
from lib.engine.server import AsyncEngine, open_loop
from lib.kv_pool import KVPool

COST = simulator.MeasuredCostModel.fitted([1, 64, 1024, 8192], [0.004, 0.0042, 0.012, 0.09], 1e-12, 0.0005, 2e-9)
HANG = 30.0  # seconds: reached only if the front end hangs; every test here takes milliseconds


class InstantRunner:
    """A runner that computes nothing: the next token is the request's length modulo 50."""

    def run(self, plan):
        return StepResult([x.length % 50 for x in plan.sampled], float("nan"), 0.0, False)


def instant_engine(**kw) -> LLMEngine:
    cfg = EngineConfig(**{"max_num_seqs": 4, "block_size": 4, "num_blocks": 60, "max_model_len": 64, **kw})
    return LLMEngine(cfg, InstantRunner(), KVPool(60, 4, storage=False), vocab=50)


def sp(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


async def read(stream) -> list[int]:
    return [t async for t in stream]


def scrape(exporter) -> dict:
    """The page's samples, by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(exporter.text()) for s in f.samples}


# ---------------------------------------------------------------------------- 8: a lease and its cache

def test_a_lease_is_grown_only_by_its_own_cache():
    pool = KVPool(8, 4, storage=False)
    mine, other = EngineCache(pool), EngineCache(pool)
    lease = mine.acquire([1, 2, 3, 4])
    before = list(pool.refs), pool.free_count
    with pytest.raises(ValueError, match="given by another PrefixCache over the same pool"):
        other.grow(lease)
    assert (list(pool.refs), pool.free_count) == before and lease.blocks == [0]
    mine.grow(lease)
    assert lease.blocks == [0, 1] and pool.free_count == 6


# ---------------------------------------------------------------------------- 9: arrivals in the future

def test_an_arrival_the_clock_has_not_reached_is_refused_and_counted():
    e = LLMEngine.virtual(EngineConfig(block_size=4, num_blocks=20, max_model_len=64), COST, vocab=97)
    e.clock.advance_to(5.0)
    with pytest.raises(RequestError, match=r"^arrival 105\.0 is 100 s in the future: the engine's clock reads 5\.0 "
                                           r"now; give a time the clock has reached"):
        e.add_request([1, 2], sp(2), arrival=105.0)
    for bad in (True, math.inf, "5"):
        with pytest.raises(RequestError, match="arrival must be a finite time"):
            e.add_request([1, 2], sp(2), arrival=bad)
    assert e.rejects == {"invalid": 4} and e.unfinished == 0 and e.pool.free_count == 20
    now = e.add_request([1, 2], sp(2), arrival=5.0)  # the clock's reading, and a time before it: accepted
    early = e.add_request([3, 4], sp(2), arrival=4.0)
    e.close()
    e.run()
    r = {x["id"]: x for x in e.results()}
    first = e.steps[0]["end"] - 5.0  # both prefilled by the first step, which starts at 5 s
    assert first > 0 and r[now]["ttft"] == pytest.approx(first) and r[early]["ttft"] == pytest.approx(1.0 + first)
    assert r[now]["queue"] == 0.0 and r[early]["queue"] == 1.0


def test_a_submission_arriving_in_the_future_is_refused_by_the_front_end():
    e = instant_engine()

    async def main():
        async with AsyncEngine(e) as a:
            with pytest.raises(RequestError, match="in the future"):
                a.submit([1, 2], sp(2), arrival=e.clock() + 100)
            return a._streams

    assert asyncio.run(main()) == {} and e.rejects == {"invalid": 1} and e.requests == {}


# ---------------------------------------------------------------------------- 10, 11: the page between steps

def test_the_page_shows_the_engine_as_it_is_when_scraped():
    """Three requests of 6 tokens hold 2 blocks of 4 each: 6 of 10 blocks. Aborted between two steps, they
    leave at once: with no step after the aborts, the page says what the engine says, 0 running and no KV in
    use (their cached full blocks are evictable, not in use); a step after that runs nothing."""
    e = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=4, num_blocks=10, max_model_len=64), COST, vocab=50)
    exporter = PrometheusExporter(e)
    running, waiting, kv = (("engine_num_requests_running", ()), ("engine_num_requests_waiting", ()),
                            ("engine_kv_cache_usage_perc", ()))
    ids = [e.add_request([i + 1] * 6, sp(20)) for i in range(3)]
    page = scrape(exporter)
    assert (page[running], page[waiting], page[kv]) == (0, 3, 0)  # added, not taken in by a step yet
    e.step()
    page = scrape(exporter)
    assert (page[running], page[waiting], page[kv]) == (3, 0, pytest.approx(0.6))
    for i in ids:
        e.abort(i)
    assert not e.scheduler.running and e.unfinished == 0 and e.kv_blocks_in_use == 0
    page = scrape(exporter)
    assert (page[running], page[waiting], page[kv]) == (0, 0, 0)
    assert len(e.scheduler.cache.evictable) == 3 and e.pool.free_count == 7
    assert e.step() == [] and len(e.steps) == 1
    assert (scrape(exporter)[running], e.aborted) == (0, 3)


def test_an_engine_whose_pool_another_holds_refuses_every_request_and_shows_no_kv_in_use():
    """A pool of 2 blocks both held before the engine was made: the engine may use none of them. Every request
    is refused with that reason, and the page's KV usage is 0, not a division by zero."""
    pool = KVPool(2, 2, storage=False)
    pool.allocate(2)
    e = LLMEngine(EngineConfig(block_size=2, max_model_len=64), InstantRunner(), pool, vocab=50)
    with pytest.raises(RequestError, match="more than the pool's 0"):
        e.add_request([1], sp(1))
    assert scrape(PrometheusExporter(e))[("engine_kv_cache_usage_perc", ())] == 0.0


def test_an_abort_asked_during_a_step_takes_effect_at_the_next():
    """A token callback that aborts another request mid-step: that step's plan runs as it was made (both
    requests get their token), and the abort takes effect when the next step starts."""
    e = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=4, num_blocks=10, max_model_len=64), COST, vocab=50)
    a, b = e.add_request([1, 2, 3], sp(5)), e.add_request([4, 5, 6], sp(5))
    e.on_token(lambda rid, tok, fin: e.abort(b) if rid == a else None)
    first = e.step()
    assert sorted(r for r, _, _ in first) == [a, b] and len(e.scheduler.running) == 2
    second = e.step()
    assert [r for r, _, _ in second] == [a] and e.requests[b].finish_reason == "abort"


def test_requests_refused_after_the_last_step_reach_the_page():
    cfg = EngineConfig(max_num_seqs=2, block_size=4, num_blocks=50, max_model_len=64, max_queue=1)
    e = LLMEngine.virtual(cfg, COST, vocab=50)
    exporter = PrometheusExporter(e)
    e.add_request([1, 2, 3], sp(2))
    e.step()
    e.add_request([4, 5, 6], sp(2))  # waits: the queue of one is full
    for prompt in ([], [99], [1.5]):
        with pytest.raises(RequestError):
            e.add_request(prompt, sp(2))
    with pytest.raises(EngineOverloaded):
        e.add_request([7, 8], sp(2))
    assert e.rejects == {"invalid": 3, "queue_full": 1}
    page = scrape(exporter)
    assert page[("engine_request_rejects_total", (("reason", "invalid"),))] == 3
    assert page[("engine_request_rejects_total", (("reason", "queue_full"),))] == 1
    e.close()
    e.run()
    assert scrape(exporter)[("engine_request_rejects_total", (("reason", "invalid"),))] == 3  # counted once


# ---------------------------------------------------------------------------- 16: what to change, not internals

@pytest.mark.parametrize("stops", [5, 5.0, None])
def test_stop_tokens_that_are_not_a_list_are_a_request_error(stops):
    with pytest.raises(RequestError, match="stop_token_ids must be a tuple or list of token ids"):
        SamplingParams(stop_token_ids=stops)
    assert SamplingParams(stop_token_ids=[5]).stop_token_ids == (5,)


def test_sampling_fields_as_a_request_body_are_checked_and_refusals_counted():
    """A front end hands the engine a request's JSON fields: a bad one is a RequestError the engine counts as
    an invalid request (the page's rejects), an unknown one is named, and nothing is queued."""
    e = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=4, num_blocks=60, max_model_len=64), COST, vocab=50)
    exporter = PrometheusExporter(e)
    with pytest.raises(RequestError, match="write one stop token as \\(5,\\)"):
        e.add_request([1, 2], {"stop_token_ids": 5})
    with pytest.raises(RequestError, match=r"unknown sampling fields \['n'\]"):
        e.add_request([1, 2], {"max_tokens": 2, "n": 2})
    with pytest.raises(RequestError, match="a SamplingParams \\(or a dict of its fields\\), got list"):
        e.add_request([1, 2], [2])
    assert dict(e.rejects) == {"invalid": 3} and e.unfinished == 0
    assert scrape(exporter)[("engine_request_rejects_total", (("reason", "invalid"),))] == 3
    rid = e.add_request([1, 2], {"max_tokens": 2, "ignore_eos": True})
    e.close()
    e.run()
    assert e.requests[rid].output and len(e.requests[rid].output) == 2


class Returns:
    def __init__(self, value):
        self.value = value

    def step(self, tokens, work, kv):
        return self.value


@pytest.mark.parametrize("value,error", [(None, TypeError), ("0.1", TypeError), (-0.001, ValueError),
                                         (math.nan, ValueError), (math.inf, ValueError)])
def test_a_cost_model_that_returns_no_time_is_named_and_changes_nothing(value, error):
    e = LLMEngine.virtual(EngineConfig(block_size=4, num_blocks=20, max_model_len=64), Returns(value), vocab=50)
    i = e.add_request([1, 2, 3], sp(2))
    with pytest.raises(error, match=r"^the cost model's step\(3, 4\.5, 0\) returned .*: a cost model must return "
                                    r"the step's time in seconds, a finite float >= 0$"):
        e.step()
    assert e.clock() == 0.0 and e.steps == [] and e.requests[i].output == []
    e.runner.cost = Returns(0.25)  # a cost model that does: the request runs as if nothing had happened
    e.run()
    assert e.requests[i].token_times == [0.25, 0.5] and e.pool.free_count + len(e.scheduler.cache.evictable) == 20


def test_a_cost_model_without_a_step_is_refused_when_the_engine_is_made():
    with pytest.raises(TypeError, match=r"must have a method step\(tokens, prefill_work, kv_tokens\)"):
        LLMEngine.virtual(EngineConfig(), lambda tokens, work, kv: 0.1)


# ---------------------------------------------------------------------------- 12: streams never read

def test_a_finished_request_leaves_no_queue_behind_and_a_slow_reader_gets_every_token():
    e = instant_engine()
    done = set()

    async def main():
        finished = asyncio.Event()

        def on_token(rid, token, last):
            if last:
                done.add(rid)
                if len(done) == 2:
                    finished.set()

        e.on_token(on_token)
        async with AsyncEngine(e) as a:
            late = a.submit([1, 2, 3], sp(5))
            abandoned = a.submit([4, 5], sp(3))
            queue = weakref.ref(abandoned._q)
            del abandoned
            await asyncio.wait_for(finished.wait(), HANG)
            left = dict(a._streams)
            gc.collect()
            return left, queue() is None, await asyncio.wait_for(read(late), HANG)

    left, freed, tokens = asyncio.run(main())
    assert left == {} and freed
    assert tokens == [3, 4, 5, 6, 7]  # the length after each token: nothing lost for a reader who comes late


# ---------------------------------------------------------------------------- 13: a static batch in the front end

def test_a_static_front_end_that_nobody_will_close_is_refused():
    """Two requests under the static policy with batches of 8 would wait for 6 more for ever in a front end that
    is never closed: the front end is refused when it is made, with what to do instead."""
    e = instant_engine(policy="static", max_num_seqs=8)
    with pytest.raises(ValueError, match=r"would wait for ever\. Use the dynamic policy .*until_close=True"):
        AsyncEngine(e)
    AsyncEngine(instant_engine(policy="dynamic", max_num_seqs=8, max_wait=0.01))  # a static batch with a deadline


def test_a_static_batch_starts_when_the_front_end_is_closed():
    """Two requests under the static policy with batches of 8: the batch waits for 6 more, and starts at once
    when the clients say none will come (close); a request after that is refused."""
    e = instant_engine(policy="static", max_num_seqs=8)

    async def main():
        async with AsyncEngine(e, until_close=True) as a:
            streams = [a.submit([1 + i] * 3, sp(2)) for i in range(2)]
            for _ in range(20):  # loop turns of the front end: the batch cannot start, whatever the machine's speed
                await asyncio.sleep(0.001)
            waited = len(e.steps)
            a.close()
            out = await asyncio.wait_for(asyncio.gather(*map(read, streams)), HANG)
            with pytest.raises(RuntimeError, match=r"closed \(close\(\)\): it takes no more requests"):
                a.submit([1], sp(1))
            return waited, out

    waited, out = asyncio.run(main())
    assert waited == 0 and out == [[3, 4], [3, 4]]
    assert sorted(e.steps[0]["prefill"]) == [0, 1] and e.requests.keys() == {0, 1}  # one batch of both


def test_a_full_static_batch_starts_without_closing():
    e = instant_engine(policy="static", max_num_seqs=2)

    async def main():
        async with AsyncEngine(e, until_close=True) as a:
            return await asyncio.wait_for(asyncio.gather(*(read(a.submit([5] * 3, sp(2))) for _ in range(2))), HANG)

    assert asyncio.run(main()) == [[3, 4], [3, 4]] and not e.scheduler.arrivals_done


def test_open_loop_closes_a_static_front_end_after_the_workload_s_last_request():
    e = instant_engine(policy="static", max_num_seqs=8)
    wl = [{"id": i, "arrival": 0.001 * i, "output": 2, "kind": "chat"} for i in range(3)]

    async def main():
        async with AsyncEngine(e, until_close=True) as a:
            return await asyncio.wait_for(open_loop(a, wl, [[1, 2, 3]] * 3), HANG)

    out = asyncio.run(main())
    assert out["tokens"] == {0: [3, 4], 1: [3, 4], 2: [3, 4]} and e.scheduler.arrivals_done
    assert all(r["ttft"] >= 0 and r["queue"] >= 0 for r in out["results"])


# ---------------------------------------------------------------------------- 14: the front end on a virtual clock

def test_a_front_end_on_a_virtual_clock_moves_the_clock_to_the_end_of_a_window():
    """A request arriving at 0 s into a batching window of 20 ms is admitted by a step that starts at 20 ms of
    the virtual clock; its first token comes at the end of that step."""
    e = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=4, num_blocks=60, max_model_len=64, max_wait=0.02),
                          COST, vocab=50)

    async def main():
        async with AsyncEngine(e) as a:
            stream = a.submit([1, 2, 3, 4], sp(3))
            return stream.id, await asyncio.wait_for(read(stream), HANG)

    rid, tokens = asyncio.run(main())
    x, first = e.requests[rid], e.steps[0]
    assert len(tokens) == 3 and x.arrival == 0.0 and first["start"] == 0.02 and first["prefill"] == {rid: 4}
    assert x.result()["ttft"] == first["end"] and x.result()["queue"] == 0.02


def test_a_static_front_end_on_a_virtual_clock_waits_for_close_and_then_runs():
    e = LLMEngine.virtual(EngineConfig(policy="static", max_num_seqs=8, block_size=4, num_blocks=60,
                                       max_model_len=64), COST, vocab=50)

    async def main():
        async with AsyncEngine(e, until_close=True) as a:
            streams = [a.submit([1 + i] * 3, sp(2)) for i in range(2)]
            for _ in range(20):
                await asyncio.sleep(0.001)
            waited = len(e.steps), e.clock()
            a.close()
            return waited, await asyncio.wait_for(asyncio.gather(*map(read, streams)), HANG)

    waited, out = asyncio.run(main())
    assert waited == (0, 0.0) and [len(t) for t in out] == [2, 2]


def test_open_loop_refuses_a_virtual_clock():
    e = LLMEngine.virtual(EngineConfig(block_size=4, num_blocks=60, max_model_len=64), COST, vocab=50)

    async def main():
        async with AsyncEngine(e) as a:
            await open_loop(a, [{"id": 0, "arrival": 1.0, "output": 2}], [[1, 2]])

    with pytest.raises(ValueError, match="virtual clock: run the workload through lib.engine.replay"):
        asyncio.run(main())
    assert e.requests == {}


def test_submitting_before_or_after_the_front_end_runs_adds_nothing():
    e = instant_engine()
    a = AsyncEngine(e)
    with pytest.raises(RuntimeError, match="not running"):
        a.submit([1, 2], sp(2))

    async def main():
        async with a:
            pass

    asyncio.run(main())
    with pytest.raises(RuntimeError, match="not running"):
        a.submit([1, 2], sp(2))
    assert e.unfinished == 0 and e.requests == {}


# ---------------------------------------------------------------------------- an engine on another's runner; stuck

def fake_runner(num_blocks=8, **settings):
    """What ``LLMEngine.from_runner`` reads of a ``ModelRunner``: its settings, its pool's size, its padding
    block (the pool's first) and its model's vocabulary."""
    from types import SimpleNamespace

    cfg = EngineConfig(**{"block_size": 4, "max_model_len": 64, "num_blocks": num_blocks, **settings})
    return SimpleNamespace(config=cfg, pool=SimpleNamespace(num_blocks=num_blocks), pad_block=0,
                           m=SimpleNamespace(cfg=SimpleNamespace(vocab=97)), run=InstantRunner().run)


def test_an_engine_on_another_engines_runner_keeps_its_padding_block_and_its_settings():
    """A fresh engine on a runner: its own pool of the runner's size with block 0 (the runner's padding) held
    for good, the model's vocabulary, other scheduling settings allowed; the settings the runner was built
    for (block size, context, graph batch sizes) must be the runner's, each difference named."""
    runner = fake_runner()
    e = LLMEngine.from_runner(runner, EngineConfig(block_size=4, max_model_len=64, max_num_seqs=2))
    assert (e.pool.num_blocks, e.usable_blocks, e.vocab, e.runner) == (8, 7, 97, runner)
    assert e.config.max_num_seqs == 2 and 0 not in e.pool.allocate(7)
    with pytest.raises(ValueError, match=r"other settings \(new, runner's\): \{'block_size': \(8, 4\)\}"):
        LLMEngine.from_runner(runner, EngineConfig(block_size=8, max_model_len=64))
    with pytest.raises(ValueError, match=r"'max_model_len': \(128, 64\)"):
        LLMEngine.from_runner(runner, EngineConfig(block_size=4, max_model_len=128))
    with pytest.raises(ValueError, match="graph_batch_sizes"):
        LLMEngine.from_runner(runner, EngineConfig(block_size=4, max_model_len=64, graph_batch_sizes=(1, 2)))
    runner.pad_block = 3
    with pytest.raises(RuntimeError, match="padding block is not the pool's first block"):
        LLMEngine.from_runner(runner, EngineConfig(block_size=4, max_model_len=64))


def test_an_engine_that_can_never_start_says_why():
    """A static batch of 4 with one request and nothing closed: ``run`` would wait for ever, so it stops with
    what to do. Closed, a request that nothing can admit (its blocks lost) stops it with the pool's state."""
    e = LLMEngine.virtual(EngineConfig(policy="static", max_num_seqs=4, block_size=4, num_blocks=10,
                                       max_model_len=64), COST, vocab=50)
    e.add_request([1, 2, 3], sp(2))
    with pytest.raises(RuntimeError, match="1 requests wait for a batch that can only start when more arrive: add "
                                           "more or call close"):
        e.run()
    e2 = LLMEngine.virtual(EngineConfig(max_num_seqs=4, block_size=4, num_blocks=10, max_model_len=64), COST, vocab=50)
    lost = e2.pool.allocate(9)  # blocks taken behind the engine's back
    e2.add_request([1] * 8, sp(2))  # 10 tokens: 3 blocks, and 1 is free
    e2.close()
    with pytest.raises(RuntimeError, match=r"1 requests wait and none can be admitted: 1 blocks free and 0 evictable "
                                           r"of 10 usable, nothing running; a block was lost"):
        e2.run()
    assert len(lost) == 9
