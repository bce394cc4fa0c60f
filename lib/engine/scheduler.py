"""The scheduler: queues, admission, the plan of each step, KV and pre-emption; the one set of scheduling
rules of the book, run by the engine (``lib.engine.engine``) and by chapter 6's simulator (``lib.simulator``).

It consults a batching policy (``lib.engine.policy.Policy``: static, dynamic or continuous batching,
queues by prompt length with priorities and caps, windows) and holds KV through a small protocol
(``lib.engine.kv``: the engine's paged blocks with a prefix cache, or the simulator's counted tokens).
Each step:

1. ``enqueue``: a request joins its queue (one per bucket) when it arrives;
2. ``admit``: continuous batching admits from each queue in priority order while fewer than
   ``max_running`` run, the bucket's own cap allows, the prompt tokens to compute fit what is left of
   ``token_budget`` (the step's first admission always fits; with chunked prefill a prompt needs only its
   first chunk) and the KV can hold the tokens to prefill; a queue with a batching window is held until
   its oldest request has waited the window, or its prompts fill the budget, or no more will arrive
   (``arrivals_done``). Static and dynamic batching start a locked batch of up to ``max_batch`` when none
   runs and that many wait, or no more will come, or (dynamic) the oldest has waited ``max_wait``.
   Admission takes the prompt's cached prefix (the prefilled tokens start at the cached ones);
3. ``schedule``: in admission order, a request with prompt left prefills it whole or its next chunk
   within the budget (static and dynamic: no budget); once a step prefills, a later prompt that does not
   fit the rest waits; the others decode one token (none, with ``prefill_first``, in a step that
   prefills);
4. KV for the decodes: a request whose next token needs more room gets a block; when none is left, the
   most recently admitted running request (ties: the higher id) is pre-empted: its KV is released and it
   goes back to the front of its queue, to prefill its prompt and the tokens it generated again
   (recomputation, as vLLM does by default; the engine's committed blocks stay cached, so it often finds
   them again);
5. ``finish_step``: after the step ran, prefills advance, the requests whose prompt is complete and the
   decodes get their token, and a request ends at ``max_tokens`` or a stop token; its KV is released.

``wake_time`` says, when nothing runs, when a held queue or a dynamic batch stops waiting. Everything here
is host bookkeeping: no tensor, no clock of its own (the caller passes ``now``).

Chapters: 6, 8.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from lib.engine.config import SamplingParams
from lib.engine.cost import work
from lib.engine.kv import EngineCache  # noqa: F401  (where it was: the engine's tests import it from here)
from lib.engine.policy import Policy
from lib.prefix_cache import Lease

WAITING, RUNNING, FINISHED, ABORTED = "waiting", "running", "finished", "aborted"


@dataclass
class Request:
    """One request and everything the engine records about it (times on the engine's clock, seconds)."""

    id: int
    prompt: list[int]
    params: SamplingParams
    arrival: float
    kind: str = ""
    queue: int = 0
    output: list[int] = field(default_factory=list)
    status: str = WAITING
    lease: Lease | None = None
    target: int = 0  # tokens to prefill: the prompt, plus after a pre-emption the tokens generated
    prefilled: int = 0  # tokens whose KV is in its blocks
    admitted: float = math.nan
    first_admitted: float = math.nan
    token_times: list[float] = field(default_factory=list)
    prefill_chunks: list[tuple[float, int]] = field(default_factory=list)  # (step end, tokens)
    prefill_time: float = 0.0
    preemptions: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache, over its admissions
    finish: float = math.nan
    finish_reason: str = ""
    keys: list[bytes] = field(default_factory=list, repr=False)  # block keys of tokens[:keys_for]
    keys_for: int = -1

    def __post_init__(self):
        self.target = len(self.prompt)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    @property
    def decoding(self) -> bool:
        return self.status == RUNNING and self.prefilled >= self.target

    def result(self, bucket: str = "") -> dict:
        """Its metrics (times in seconds): ``ttft`` arrival to first token; ``e2e`` arrival to last token;
        ``tpot`` = (e2e - ttft) / (output - 1) (NaN for one output token); ``itl`` every gap between two of
        its tokens and ``itl_max`` the longest; ``queue`` arrival to first admission; ``prefill`` the time
        of the steps that prefilled it before its first token (a stage of its TTFT; recomputing after a
        pre-emption is not); ``decode`` first token to last; ``preemptions``; ``tokens`` generated;
        ``cached`` prompt tokens found in the prefix cache; ``finish_reason``."""
        ttft = self.token_times[0] - self.arrival if self.token_times else math.nan
        e2e = self.finish - self.arrival
        n = len(self.output)
        gaps = [b - a for a, b in zip(self.token_times, self.token_times[1:])]
        return {"id": self.id, "kind": self.kind, "bucket": bucket, "input": len(self.prompt), "output": n,
                "arrival": self.arrival, "ttft": ttft, "e2e": e2e,
                "tpot": (e2e - ttft) / (n - 1) if n > 1 else math.nan, "itl": gaps,
                "itl_max": max(gaps) if gaps else math.nan, "queue": self.first_admitted - self.arrival,
                "prefill": self.prefill_time, "decode": self.token_times[-1] - self.token_times[0] if n else math.nan,
                "preemptions": self.preemptions, "tokens": n, "cached": self.cached_tokens,
                "finish_reason": self.finish_reason}


@dataclass
class Plan:
    """One step: (request, start, end) for each prefill chunk (tokens[start:end] computed), the requests
    that decode, and those pre-empted while planning it."""

    prefills: list[tuple[Request, int, int]] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def prefill_tokens(self) -> int:
        return sum(end - start for _, start, end in self.prefills)

    @property
    def tokens(self) -> int:
        """Tokens the step runs through the model: its prompt tokens and one per decode."""
        return self.prefill_tokens + len(self.decodes)

    @property
    def prefill_work(self) -> float:
        """The prefill's attention work: each chunk's new tokens x their mean context (``lib.engine.cost.work``)."""
        return sum((work(end - start, start) for _, start, end in self.prefills), 0.0)

    @property
    def decode_kv(self) -> int:
        """Tokens of KV the decodes read, each its prompt and its output so far (the token it decodes from
        included)."""
        return sum(x.length for x in self.decodes)

    @property
    def decode_ctx_max(self) -> int:
        """KV tokens of the longest decode (0: no decode)."""
        return max((x.length for x in self.decodes), default=0)

    @property
    def sampled(self) -> list[Request]:
        """The requests that get a token from this step, in the order of the model's output rows: each
        prefill that completes its prompt, then each decode."""
        return [x for x, _, end in self.prefills if end == x.target] + self.decodes


class Scheduler:
    """Queues and running requests under ``policy``, their KV held in ``kv`` (``lib.engine.kv``: the
    engine's ``BlockKV`` or the simulator's ``TokenKV``); see the module."""

    def __init__(self, policy: Policy, kv):
        self.policy, self.kv = policy, kv
        self.queues: list[deque[Request]] = [deque() for _ in range(self.policy.queue_count)]
        self.running: list[Request] = []
        self.arrivals_done = False  # no request will be added any more (static batches and windows stop waiting)
        self.preemptions = 0

    @property
    def cache(self):
        """The engine's prefix cache (a ``BlockKV``'s)."""
        return self.kv.cache

    # ------------------------------------------------------------------ queues
    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def enqueue(self, x: Request) -> None:
        x.queue = self.policy.bucket_of(len(x.prompt))
        self.queues[x.queue].append(x)

    def remove(self, x: Request) -> None:
        """Take ``x`` out of the engine (aborted): out of its queue or the running batch, its blocks released."""
        if x.status == WAITING:
            self.queues[x.queue].remove(x)
        elif x.status == RUNNING:
            self.running.remove(x)
            self._release(x)

    def _release(self, x: Request) -> None:
        self.kv.release(x)

    # ------------------------------------------------------------------ admission
    def _held(self, qi: int, now: float) -> bool:
        """A queue waits for its batching window: its oldest request has waited less than the window, its prompts
        fill less than the budget and more requests may come."""
        q = self.queues[qi]
        if not q or self.arrivals_done:
            return False
        return now < q[0].arrival + self.policy.window(qi) and sum(x.target for x in q) < self.policy.token_budget

    def _take(self, x: Request, now: float) -> bool:
        """Admit ``x`` if the KV can hold its tokens to prefill (its cached prefix taken from the cache)."""
        hit = self.kv.admit(x)
        if hit is None:
            return False
        x.prefilled, x.status, x.admitted = hit, RUNNING, now
        x.cached_tokens += hit
        if math.isnan(x.first_admitted):
            x.first_admitted = now
        self.running.append(x)
        return True

    def admit(self, now: float) -> list[Request]:
        p = self.policy
        if p.kind != "continuous":
            return self._admit_batch(now)
        budget = p.token_budget
        per_queue = [0] * p.queue_count
        for x in self.running:
            per_queue[x.queue] += 1
        admitted = []
        for qi in p.admission_order():
            q, cap = self.queues[qi], p.running_cap(qi)
            if self._held(qi, now):
                continue
            while q and len(self.running) < p.max_running:
                x = q[0]
                if cap is not None and per_queue[qi] >= cap:
                    break
                hit = self.kv.cached(x)
                need = x.target - min(hit, x.target - 1)
                need = need if p.chunk is None else min(need, p.chunk)
                if admitted and need > budget:
                    break
                if not self._take(x, now):
                    break
                q.popleft()
                admitted.append(x)
                per_queue[qi] += 1
                budget -= need
        return admitted

    def _admit_batch(self, now: float) -> list[Request]:
        """Static and dynamic batching: a locked batch of up to ``max_num_seqs`` starts when none runs and that
        many wait, or no more will come, or (dynamic) the oldest has waited ``max_wait``."""
        q, p = self.queues[0], self.policy
        if self.running or not q:
            return []
        ready = len(q) >= p.max_batch or self.arrivals_done or (p.kind == "dynamic" and now >= q[0].arrival + p.max_wait)
        admitted = []
        while ready and q and len(admitted) < p.max_batch and self._take(q[0], now):
            admitted.append(q.popleft())
        return admitted

    # ------------------------------------------------------------------ planning
    def schedule(self, now: float) -> Plan:
        """Admit, plan the step and give its decodes their blocks (pre-empting if the pool runs out)."""
        plan = Plan(admitted=self.admit(now))
        p = self.policy
        budget = p.token_budget if p.kind == "continuous" else math.inf
        for x in self.running:
            if x.prefilled < x.target:
                take = x.target - x.prefilled
                if p.chunk is not None:
                    take = min(take, p.chunk)
                if plan.prefills and take > budget:
                    continue
                if p.chunk is not None:
                    take = min(take, budget)
                plan.prefills.append((x, x.prefilled, x.prefilled + take))
                budget -= take
            else:
                plan.decodes.append(x)
        if p.prefill_first and plan.prefills:
            plan.decodes = []
        for x in list(plan.decodes):
            while x.status == RUNNING and self.kv.room(x) < x.length:
                if not self.kv.grow(x):
                    victim = max(self.running, key=lambda y: (y.admitted, y.id))
                    self.preempt(victim)
                    plan.preempted.append(victim)
        plan.decodes = [x for x in plan.decodes if x.status == RUNNING]
        plan.prefills = [c for c in plan.prefills if c[0].status == RUNNING]
        return plan

    def wake_time(self, now: float) -> float | None:
        """When nothing runs: the earliest time after ``now`` a held queue or a dynamic batch stops waiting
        (None: only a new arrival can start a step)."""
        p = self.policy
        if self.running or self.arrivals_done:
            return None
        if p.kind == "dynamic" and self.queues[0]:
            return self.queues[0][0].arrival + p.max_wait
        if p.kind == "continuous":
            times = [q[0].arrival + p.window(i) for i, q in enumerate(self.queues) if q]
            times = [t for t in times if t > now]
            return min(times) if times else None
        return None

    def preempt(self, x: Request) -> None:
        """Drop ``x``'s KV and put it at the front of its queue, to prefill its prompt and output again."""
        self.running.remove(x)
        self._release(x)
        x.status, x.prefilled, x.target = WAITING, 0, len(x.prompt) + len(x.output)
        x.preemptions += 1
        self.preemptions += 1
        self.queues[x.queue].appendleft(x)

    # ------------------------------------------------------------------ after the step
    def finish_step(self, plan: Plan, tokens: list[int], now: float, duration: float) -> list[Request]:
        """Record the step's results: prefills advance (their full blocks enter the prefix cache when a prompt
        is complete), each request of ``plan.sampled`` gets its token of ``tokens``, requests that are done
        leave. Returns the requests that finished."""
        sampled = plan.sampled
        if len(tokens) != len(sampled):
            raise RuntimeError(f"the model gave {len(tokens)} tokens for a step that samples {len(sampled)}")
        for x, start, end in plan.prefills:
            x.prefilled = end
            if not x.token_times:  # a stage of its TTFT; recomputing after a pre-emption comes after it
                x.prefill_time += duration
            x.prefill_chunks.append((now, end - start))
            if end == x.target:
                self.kv.commit(x)
        for x in plan.decodes:
            x.prefilled += 1  # the step wrote the KV of the token it decoded from
        finished = []
        for x, t in zip(sampled, tokens):
            x.output.append(int(t))
            x.token_times.append(now)
            reason = ""
            if len(x.output) >= x.params.max_tokens:
                reason = "length"
            elif not x.params.ignore_eos and int(t) in x.params.stop_token_ids:
                reason = "stop"
            if reason:
                x.finish_reason = reason
                finished.append(x)
        for x in finished:
            self.running.remove(x)
            self._release(x)
            x.status, x.finish = FINISHED, now
        return finished
