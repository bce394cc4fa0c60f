"""The engine: requests in, one step at a time, tokens out, and a record of everything it did.

``LLMEngine`` joins the scheduler (``lib.engine.scheduler``: who runs, how many tokens, which KV blocks)
and a runner (who computes the step). Its loop is ``step``:

1. requests added (``add_request``) or aborted (``abort``) since the last step are taken in;
2. the scheduler admits, plans the step and gives decodes their blocks (pre-empting if needed);
3. the runner runs the step and returns a token for every request that gets one;
4. the scheduler records the tokens; finished requests release their blocks;
5. the step is recorded (``steps``): start and end, prefill chunks, decodes, tokens given, requests
   finished and pre-empted, KV blocks in use, prefix-cache hits, queue depth, rejects, GPU time and host
   time (the step's wall time less the time the host waited for the device).

Two runners: ``lib.engine.runner.ModelRunner`` runs a real model (``LLMEngine.from_model``);
``CostRunner`` runs none and lets a cost model decide how long each step lasts, on a virtual clock
(``LLMEngine.virtual``): the whole engine, its paged pool, prefix cache, front-end callbacks and metrics
included, on simulated time (chapter 8's metrics demo; the engine's tests). Chapter 6's simulator
(``lib.simulator``) runs the same scheduler without the rest.

Bad requests raise ``RequestError`` (an empty prompt, ids outside the vocabulary, more tokens than
``max_model_len`` or the pool holds, bad sampling parameters, an arrival the clock has not reached) and
change nothing; a request arriving when ``max_queue`` requests wait raises ``EngineOverloaded``. Both are
counted by reason (``rejects``). ``add_request`` and ``abort`` may be called from another thread than
``step`` (the asyncio front end does): they only append to queues the step drains.

Chapters: 8.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from numbers import Real

from lib.engine.config import EngineConfig, RequestError, SamplingParams
from lib.engine.cost import step_seconds
from lib.engine.kv import BlockKV
from lib.engine.scheduler import ABORTED, FINISHED, Plan, Request, Scheduler
from lib.kv_pool import KVPool, integer_ids


class EngineOverloaded(RuntimeError):
    """The engine turned a request away for lack of room (its queue is full); retry later."""


class VirtualClock:
    """A clock that moves only when told to: the engine's time under ``CostRunner``."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


class CostRunner:
    """Runs no model: each step lasts what ``cost`` says of its plan (``lib.engine.cost.step_seconds``, as
    the simulator asks it) on ``clock``, and a request's next token is a fixed function of its id and
    length (greedy and reproducible; never a stop token unless one is chosen so). ``cost`` has ``step``
    (or ``step_detail``, asked instead when present), returning a finite number of seconds >= 0; anything
    else stops the step before the clock moves."""

    def __init__(self, cost, clock: VirtualClock, vocab: int):
        if not callable(getattr(cost, "step_detail", None)) and not callable(getattr(cost, "step", None)):
            raise TypeError(f"the cost model must have a method step(tokens, prefill_work, kv_tokens) returning the "
                            f"step's time in seconds (a finite float >= 0), got {type(cost).__name__} {cost!r}")
        self.cost, self.clock, self.vocab = cost, clock, vocab

    def run(self, plan: Plan):
        from lib.engine.runner import StepResult

        dt = step_seconds(self.cost, plan)
        self.clock.advance_to(self.clock.now + dt)
        # any fixed mix of id and length serves (two primes); only that the tokens are ids of the vocabulary matters
        out = [(x.id * 7919 + x.length * 104729) % self.vocab for x in plan.sampled]  # pragma: no mutate
        return StepResult(out, dt, 0.0, False)


class LLMEngine:
    """A serving engine over ``runner`` (see the module). ``vocab``: token ids lie in [0, vocab)."""

    def __init__(self, config: EngineConfig, runner, pool: KVPool, *, vocab: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.config, self.runner, self.pool, self.vocab, self.clock = config, runner, pool, vocab, clock
        self.scheduler = Scheduler(config.as_policy(), BlockKV(pool, prefix_caching=config.enable_prefix_caching,
                                                               extra=config.extra))
        self.requests: dict[int, Request] = {}
        self.steps: list[dict] = []
        self.rejects: Counter = Counter()
        self.aborted = 0
        self._ids = itertools.count()
        self._inbox: deque[Request] = deque()
        self._aborts: deque[int] = deque()
        self._stepping = False  # inside step(): an abort waits for the next step's start
        self._on_token = []  # callbacks (request id, token, finished), called after each step
        self._on_step = []  # callbacks (step record, requests finished by it)
        self._on_events = []  # callbacks ([(request id, token, finished), ...] of a step)
        # blocks a request may hold: the pool less what the runner keeps for itself
        self.usable_blocks = pool.free_count

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, m, config: EngineConfig, *, graphs: bool | None = None) -> LLMEngine:
        """An engine on the model ``m`` (a ``lib.models.Llama``, e.g. ``Llama.random``), its KV pool
        allocated on the model's device."""
        from lib.engine.runner import ModelRunner, pool_blocks

        pool = m.new_pool(pool_blocks(m, config), config.block_size)
        return cls(config, ModelRunner(m, pool, config, graphs=graphs), pool, vocab=m.cfg.vocab)

    @classmethod
    def from_runner(cls, runner, config: EngineConfig) -> LLMEngine:
        """A fresh engine (empty queues, every block free) on another engine's ``ModelRunner``: its model, its
        pool's storage and its captured graphs, with other scheduling settings. ``block_size``,
        ``max_model_len`` and ``graph_batch_sizes`` must be the runner's."""
        same = ("block_size", "max_model_len", "graph_batch_sizes")
        diff = {k: (getattr(config, k), getattr(runner.config, k)) for k in same
                if getattr(config, k) != getattr(runner.config, k)}
        if diff:
            raise ValueError(f"the runner was built for other settings (new, runner's): {diff}")
        pool = KVPool(runner.pool.num_blocks, config.block_size, storage=False)
        if pool.allocate(1) != [runner.pad_block]:  # the runner's padding block, held for good
            raise RuntimeError("the runner's padding block is not the pool's first block")
        return cls(config, runner, pool, vocab=runner.m.cfg.vocab)

    @classmethod
    def virtual(cls, config: EngineConfig, cost, *, vocab: int = 32000, num_blocks: int | None = None) -> LLMEngine:
        """An engine whose steps last what ``cost`` says, on a virtual clock starting at 0 (see the module);
        its pool has no storage (``num_blocks``: default ``config.num_blocks``, else room for
        ``max_num_seqs`` requests of ``max_model_len``)."""
        n = num_blocks or config.num_blocks or config.max_num_seqs * -(-config.max_model_len // config.block_size)
        pool = KVPool(n, config.block_size, storage=False)
        clock = VirtualClock()
        return cls(config, CostRunner(cost, clock, vocab), pool, vocab=vocab, clock=clock)

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt, sampling: SamplingParams | None = None, *, kind: str = "",
                    arrival: float | None = None) -> int:
        """Queue a request for the tokens ``prompt`` (ids); returns its id. ``arrival``: when it arrived on the
        engine's clock (default: now), from which its latencies count. Raises ``RequestError`` for a bad
        request and ``EngineOverloaded`` when ``max_queue`` requests wait; either way nothing changed, and the
        refusal is counted (``rejects``). ``sampling`` may be the fields of a ``SamplingParams`` as a dict (what a
        request's JSON body holds): a bad field is a refused request like any other. An ``arrival`` after the
        clock's reading now is refused: a request cannot arrive before it is added."""
        sampling = SamplingParams() if sampling is None else sampling
        try:
            if isinstance(sampling, dict):
                fields = set(SamplingParams.__dataclass_fields__)
                unknown = sorted(set(sampling) - fields, key=str)
                if unknown:
                    raise RequestError(f"unknown sampling fields {unknown}: the fields are {sorted(fields)}")
                sampling = SamplingParams(**sampling)
            if not isinstance(sampling, SamplingParams):
                raise RequestError(f"sampling must be a SamplingParams (or a dict of its fields), got "
                                   f"{type(sampling).__name__}")
            try:
                ids = integer_ids(prompt, "token", self.vocab, "the vocabulary")
            except (TypeError, ValueError) as e:
                raise RequestError(f"bad prompt: {e}") from None
            if not ids:
                raise RequestError("the prompt is empty: a request needs at least one token to start from")
            total = len(ids) + sampling.max_tokens
            if total > self.config.max_model_len:
                raise RequestError(f"the prompt ({len(ids)} tokens) plus max_tokens ({sampling.max_tokens}) is {total} "
                                   f"tokens, more than max_model_len {self.config.max_model_len}: shorten the prompt "
                                   "or ask for fewer tokens")
            if self.pool.blocks_for(total) > self.usable_blocks:
                raise RequestError(f"{total} tokens need {self.pool.blocks_for(total)} KV blocks of "
                                   f"{self.pool.block_size}, more than the pool's {self.usable_blocks}: shorten the "
                                   "request or give the engine more blocks")
            if arrival is not None:
                if not (isinstance(arrival, Real) and not isinstance(arrival, bool) and math.isfinite(arrival)):
                    raise RequestError(f"arrival must be a finite time on the engine's clock, got {arrival!r}")
                now = self.clock()
                if arrival > now:
                    raise RequestError(f"arrival {float(arrival)!r} is {float(arrival) - now:.6g} s in the future: the "
                                       f"engine's clock reads {now!r} now; give a time the clock has reached (when "
                                       "the request arrived), or none for now")
        except RequestError:
            self.rejects["invalid"] += 1
            raise
        cap = self.config.max_queue
        if cap is not None and self.scheduler.queued + len(self._inbox) >= cap:
            self.rejects["queue_full"] += 1
            raise EngineOverloaded(f"{cap} requests are waiting already (max_queue): retry later or raise max_queue")
        x = Request(next(self._ids), ids, sampling, self.clock() if arrival is None else float(arrival), kind=kind)
        self._inbox.append(x)
        return x.id

    def abort(self, request_id: int) -> None:
        """Stop a request: it leaves its queue or the running batch, its blocks released. Between two steps that
        happens at once (what the engine and its metrics report counts it no more); asked during a step (from
        a callback), at the next step's start."""
        self._aborts.append(request_id)
        if not self._stepping:
            self._take_inbox()

    def close(self) -> None:
        """No request will be added any more: batches and windows stop waiting for more."""
        self.scheduler.arrivals_done = True

    @property
    def kv_blocks_in_use(self) -> int:
        """KV blocks held by requests now: the usable blocks less those free or cached and unreferenced."""
        return self.usable_blocks - self.pool.free_count - len(self.scheduler.cache.evictable)

    @property
    def unfinished(self) -> int:
        """Requests added and neither finished nor aborted."""
        return len(self._inbox) + self.scheduler.queued + len(self.scheduler.running)

    def on_step(self, fn: Callable[[dict, list[Request]], None]) -> None:
        """Call ``fn(record, finished requests)`` after each step (the metrics exporter does)."""
        self._on_step.append(fn)

    def on_events(self, fn: Callable[[list], None]) -> None:
        """Call ``fn(events)`` after each step with its (request id, token, finished) list, and with [(id, -1,
        True)] when a request is aborted."""
        self._on_events.append(fn)

    def on_token(self, fn: Callable[[int, int, bool], None]) -> None:
        """Call ``fn(request id, token, finished)`` for each token, after the step that made it."""
        self._on_token.append(fn)

    # ------------------------------------------------------------------ the loop
    def _take_inbox(self) -> None:
        while self._inbox:
            x = self._inbox.popleft()
            self.requests[x.id] = x
            self.scheduler.enqueue(x)
        while self._aborts:
            x = self.requests.get(self._aborts.popleft())
            if x is None or x.status in (FINISHED, ABORTED):
                continue
            self.scheduler.remove(x)
            x.status, x.finish, x.finish_reason = ABORTED, self.clock(), "abort"
            self.aborted += 1
            for fn in self._on_token:
                fn(x.id, -1, True)
            for fn in self._on_events:
                fn([(x.id, -1, True)])

    def step(self) -> list[tuple[int, int, bool]]:
        """One step (see the module): the (request id, token, finished) it produced; [] if nothing could run."""
        self._stepping = True
        try:
            return self._step()
        finally:
            self._stepping = False

    def _step(self) -> list[tuple[int, int, bool]]:
        t0 = self.clock()
        self._take_inbox()
        plan = self.scheduler.schedule(t0)
        if plan.empty:
            return []
        taken = [x for x in plan.admitted if x.lease is not None]
        hits, queries = sum(x.lease.hit_tokens for x in taken), sum(x.target for x in taken)
        res = self.runner.run(plan)
        t1 = self.clock()
        finished = self.scheduler.finish_step(plan, res.tokens, t1, t1 - t0)
        events = [(x.id, x.output[-1], x.status == FINISHED) for x in plan.sampled]
        host = self.clock() - t0 - res.wait_s
        s = self.scheduler
        record = {
            "start": t0, "end": t1, "prefill": {x.id: e - st for x, st, e in plan.prefills},
            "decode": [x.id for x in plan.decodes], "yielded": [x.id for x in plan.sampled],
            "finished": [x.id for x in finished], "preempted": [x.id for x in plan.preempted],
            "batch": len(plan.prefills) + len(plan.decodes), "prefill_tokens": plan.prefill_tokens,
            "decode_tokens": len(plan.decodes), "decode_kv": sum(x.length - 1 for x in plan.decodes),
            "decode_ctx_max": max((x.length - 1 for x in plan.decodes), default=0),  # the step appended a token
            "prefill_work": plan.prefill_work,
            "kv_blocks": self.kv_blocks_in_use,
            "cached_blocks": len(s.cache.block_of), "prefix_hit_tokens": hits, "prefix_query_tokens": queries, "queued": s.queued,
            "running": len(s.running), "rejects": sum(self.rejects.values()), "gpu_s": res.gpu_s,
            "host_s": host, "graph": res.graph}
        self.steps.append(record)
        for fn in self._on_step:
            fn(record, finished)
        for fn in self._on_token:
            for e in events:
                fn(*e)
        for fn in self._on_events:
            fn(events)
        return events

    def next_wake(self) -> float | None:
        """When nothing runs: the earliest time a held queue or a dynamic batch stops waiting (None: only a new
        arrival can start a step); ``Scheduler.wake_time``."""
        return self.scheduler.wake_time(self.clock())

    def run(self) -> None:
        """Step until every request added has finished (``close`` first, or a batch may wait for more)."""
        while self.unfinished:
            if not self.step() and not self.scheduler.running and self.unfinished:
                wake = self.next_wake()
                if wake is None:
                    self.stuck()
                if isinstance(self.clock, VirtualClock):
                    self.clock.advance_to(wake)

    def stuck(self) -> None:
        """Raise the error of an engine that has requests waiting, none running, and nothing to wait for."""
        s = self.scheduler
        if not s.arrivals_done:
            raise RuntimeError(f"{s.queued} requests wait for a batch that can only start when more arrive: add more "
                               "or call close()")
        raise RuntimeError(f"{s.queued} requests wait and none can be admitted: {self.pool.free_count} blocks free and "
                           f"{len(s.cache.evictable)} evictable of {self.usable_blocks} usable, nothing running; a "
                           "block was lost, or the policy can admit none of them (bucket limits)")

    # ------------------------------------------------------------------ results
    def results(self) -> list[dict]:
        """The finished requests' metrics (``Request.result``), by id."""
        return [x.result(self.scheduler.policy.bucket_name(x.queue)) for x in sorted(self.requests.values(),
                                                                                     key=lambda y: y.id)
                if x.status == FINISHED]


def replay(engine: LLMEngine, workload: list[dict], prompts: list[list[int]], *, sampling=None) -> list[dict]:
    """Run ``workload`` ({"id", "arrival", "input", "output", "kind"}, as ``lib.workloads.requests`` makes it)
    through ``engine`` on its clock, with ``prompts[i]`` the tokens of request i: each request is added
    when the clock reaches its arrival (offset by the clock at the start) and asks for exactly its
    ``output`` tokens. A virtual clock jumps to the next arrival when nothing runs; a real one waits.
    Returns the finished requests' results (``LLMEngine.results``), arrival times relative to the start."""
    order = sorted(range(len(workload)), key=lambda i: (workload[i]["arrival"], i))
    t0 = engine.clock()
    ids = {}
    nxt = 0
    virtual = isinstance(engine.clock, VirtualClock)
    while nxt < len(order) or engine.unfinished:
        now = engine.clock()
        while nxt < len(order) and t0 + workload[order[nxt]]["arrival"] <= now:
            r = workload[order[nxt]]
            sp = sampling(r) if sampling else SamplingParams(max_tokens=r["output"], ignore_eos=True)
            ids[engine.add_request(prompts[order[nxt]], sp, kind=r.get("kind", ""), arrival=t0 + r["arrival"])] = r["id"]
            nxt += 1
        if nxt == len(order):
            engine.close()
        if engine.step() or engine.scheduler.running or (nxt == len(order) and not engine.unfinished):
            continue
        if not engine.unfinished and nxt < len(order):
            nt = t0 + workload[order[nxt]]["arrival"]
        else:
            nt = engine.next_wake()
            if nxt < len(order):
                nt = min(x for x in (nt, t0 + workload[order[nxt]]["arrival"]) if x is not None)
        if nt is None:
            if nxt == len(order):
                engine.stuck()
            continue
        if virtual:
            engine.clock.advance_to(nt)
        else:
            time.sleep(max(0.0, min(nt - engine.clock(), 0.001)))
    out = []
    for r in engine.results():
        if r["id"] in ids:
            out.append({**r, "id": ids[r["id"]], "arrival": r["arrival"] - t0})
    return sorted(out, key=lambda r: r["id"])
