"""A discrete-event simulator of one LLM serving engine: queues, a batching policy, a cost per step.

The algorithm. Requests arrive on their own clock and wait in a queue (one per bucket). The engine runs
in steps; before each step it

1. moves every request that has arrived by now into its queue (``_Engine.arrive``);
2. admits queued requests as the policy allows (``admit_batch`` for static and dynamic batching,
   ``admit_continuous`` for continuous batching; see below);
3. if nothing runs, jumps the clock to the next moment something can change: the next arrival or the
   end of a batching window (``wake_time``);
4. plans the step (``plan``): each running request either prefills (its whole prompt, or with chunked
   prefill at most ``chunk`` tokens, within the step's ``token_budget``) or decodes one token; with
   ``prefill_first`` a step that prefills runs no decode;
5. asks the cost model how long the step lasts, ``cost.step(M, W, K)`` with M the step's tokens,
   W = sum of new tokens x their mean context over the prefilled chunks, K the tokens of KV the
   decoding requests read (their prompt and the tokens they have generated), and advances the clock by
   it (``advance``). A cost model that also has ``step_detail(M, W, K, prefills=n, decode_ctx_max=c)`` is
   asked that instead: n the requests the step prefills, c the longest decoding request's KV tokens (a
   step's cost can depend on which requests it holds, not only on its token counts). The step that
   completes a prompt's prefill yields that request's next token; a decode yields one token; a request that
   has all its output tokens leaves;
6. pre-empts while the KV held exceeds the capacity (``preempt``).

The policies (``lib.serving.policy``):

- ``static``: a batch starts when ``max_batch`` requests wait or every request has arrived; it runs to
  completion, and nobody joins it meanwhile (the batch is locked).
- ``dynamic``: the same, and a batch also starts once its oldest request has waited ``max_wait`` s.
- ``continuous``: every step, finished requests leave and queued ones join while fewer than
  ``max_running`` run and the prompt tokens admitted stay within ``token_budget`` (the first request of
  a step is admitted whatever its size): B_{t+1} = (B_t minus F_t) plus A_t. Queues are visited by
  priority; a bucket's ``max_running`` caps its running requests. With a batching window (``max_wait`` >
  0, or a bucket's own), a queue is held until its oldest request has waited the window, or its prompts
  fill ``token_budget``, or no more requests will arrive.

KV capacity and pre-emption: a running request holds, while it prefills, the KV of the tokens prefilled
so far; once its prompt is in, the KV of its prompt and of every token it has generated (a token counts
from the step that yields it). Continuous batching admits a request only if the KV in use plus its
prompt (and, after a pre-emption, what it had generated) plus one token fits ``kv_capacity``. Under any
policy, when a step leaves more KV in use than the capacity, the most recently admitted request is
pre-empted (ties: the higher id) until it fits: its KV is dropped and it goes back to the front of its
queue, to prefill its prompt and its generated tokens again (recomputation, as vLLM does by default).

The loop cannot spin. Progress is counted in tokens, not in time (the clock moves on every step, a
loop that throws away what it computed included): a loop turn progresses when a request arrives or
finishes, a token is yielded, or a prompt token is prefilled that its request had never had in its KV
before (``_Request.computed``, the most tokens of KV it ever held from a prefill; recomputing them after
a pre-emption is not progress). Each of these counts is bounded (requests, output tokens, prompt plus
output tokens per request), so a healthy run progresses a bounded number of times. Between two
progressing turns the engine may only wait for a window (at most one wake-up per queue: pre-emption
never empties the engine, so waits come before the first step) or recompute KV it had dropped: a step
that yields nothing only prefills, the first prompt in admission order always gets tokens, and that
request, if pre-empted, cannot fit again until something progresses; so each unfinished request
recomputes at most its ``computed`` tokens as the first, one token a step or more. A run with more
turns without progress than that (plus ``STALL_LIMIT``) raises ``RuntimeError`` naming the state
(clock, running and queued requests, KV in use): a bug in the engine or a policy, never a workload. So
every run ends: it finishes, or it stops with that error. A queue that nothing can ever admit raises too.

Metrics, per request (times in seconds): ``ttft`` arrival to first token; ``e2e`` arrival to last token;
``tpot`` = (e2e - ttft) / (output - 1) (NaN for one output token); ``itl_max`` the longest gap between
two of its tokens; ``queue`` arrival to first admission; ``prefill`` the total time of the steps that
prefilled it before its first token (a stage of its TTFT; recomputing after a pre-emption is not);
``decode`` first token to last; ``preemptions``; ``tokens`` generated.
``lib.serving.metrics`` turns them into percentiles, tokens/s and goodput.

Chapters: 6.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real

from lib.serving.policy import Policy

STALL_LIMIT = 3  # loop turns in a row that may change nothing, besides wake-ups and recomputation (see the module)


@dataclass
class _Request:
    """One request's state in the engine. ``target``: the tokens to prefill, its prompt plus, after a
    pre-emption, the tokens it had generated (their KV is computed again). ``computed``: the most tokens
    it ever had prefilled (what a pre-emption may make it compute again)."""

    id: int
    arrival: float
    kind: str
    input: int
    output: int
    queue: int
    target: int = 0
    prefilled: int = 0
    computed: int = 0
    generated: int = 0
    admitted: float = math.nan
    first_admitted: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    prefill_time: float = 0.0
    preemptions: int = 0
    token_times: list = field(default_factory=list)

    def __post_init__(self):
        self.target = self.input

    @property
    def kv(self) -> int:
        """Tokens of KV it holds: while it prefills, those prefilled; then its prompt's and every token's
        it generated."""
        return self.prefilled if self.prefilled < self.target else self.input + self.generated

    def result(self, bucket: str) -> dict:
        """Its metrics (see the module), once it has finished."""
        ttft = self.first_token - self.arrival
        e2e = self.finish - self.arrival
        gaps = [b - a for a, b in zip(self.token_times, self.token_times[1:])]
        return {"id": self.id, "kind": self.kind, "bucket": bucket, "input": self.input, "output": self.output,
                "arrival": self.arrival, "ttft": ttft, "e2e": e2e,
                "tpot": (e2e - ttft) / (self.output - 1) if self.output > 1 else math.nan,
                "itl_max": max(gaps) if gaps else math.nan, "queue": self.first_admitted - self.arrival,
                "prefill": self.prefill_time, "decode": self.finish - self.first_token,
                "preemptions": self.preemptions, "tokens": self.generated}


@dataclass
class _Step:
    """One engine step: its plan, (request, prompt tokens) for each prefill and the requests that decode;
    once run, the requests that yielded a token and those that finished."""

    prefills: list = field(default_factory=list)
    decodes: list = field(default_factory=list)
    yielded: list = field(default_factory=list)
    finished: list = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the step prefills."""
        return sum(take for _, take in self.prefills)

    @property
    def tokens(self) -> int:
        """Tokens the step runs through the model: its prompt tokens and one per decode."""
        return self.prefill_tokens + len(self.decodes)

    @property
    def prefill_work(self) -> float:
        """Sum of new tokens x their mean context: a chunk of m after c tokens does m (c + m / 2)."""
        return sum((take * (x.prefilled + take / 2) for x, take in self.prefills), 0.0)

    @property
    def decode_kv(self) -> int:
        """Tokens of KV the decodes read: each its prompt's and its generated tokens' (``_Request.kv``)."""
        return sum(x.input + x.generated for x in self.decodes)

    @property
    def decode_ctx_max(self) -> int:
        """KV tokens of the longest decoding request (0: no decode)."""
        return max((x.input + x.generated for x in self.decodes), default=0)


def _whole(value) -> bool:
    """A whole number (an int or a numpy integer; a bool or a float such as 1.9 or 2.0 is not one)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _requests(reqs, policy: Policy) -> list[_Request]:
    """The requests ({"id", "arrival", "input", "output", "kind" (optional)}) checked and put in their queues."""
    out = []
    for i, r in enumerate(reqs):
        missing = [k for k in ("id", "arrival", "input", "output") if not (isinstance(r, Mapping) and k in r)]
        if missing:
            raise ValueError(f"request #{i} ({r!r}) lacks {missing}: each request is a dict with an 'id', an 'arrival' "
                             f"(s), an 'input' and an 'output' (tokens), as lib.workloads.requests makes them")
        for k in ("input", "output"):
            if not _whole(r[k]):
                raise ValueError(f"request {r['id']}: {k} must be a whole number of tokens, got {r[k]!r}: round "
                                 f"lengths before simulating (a fraction of a token is not a token)")
            if r[k] < 1:
                raise ValueError(f"request {r['id']}: {k} must be at least 1 token, got {r[k]!r}")
        arrival = r["arrival"]
        if not (isinstance(arrival, Real) and not isinstance(arrival, bool) and math.isfinite(arrival) and arrival >= 0):
            raise ValueError(f"request {r['id']}: arrival {arrival!r} must be a finite time >= 0 (seconds); a NaN "
                             f"or infinite arrival rate upstream gives such times")
        if policy.kv_capacity is not None and r["input"] + r["output"] > policy.kv_capacity:
            raise ValueError(f"request {r['id']} needs {r['input'] + r['output']} tokens of KV, more than the "
                             f"capacity {policy.kv_capacity}: raise kv_capacity or drop the request")
        out.append(_Request(r["id"], float(arrival), r.get("kind", ""), int(r["input"]), int(r["output"]),
                            policy.bucket_of(int(r["input"]))))
    if len({x.id for x in out}) != len(out):
        raise ValueError("request ids must be unique: each result is reported under its request's id")
    return out


class _Engine:
    """The engine's state (clock, queues, running requests) and the moves of the algorithm in the module."""

    def __init__(self, requests: list[_Request], cost, policy: Policy, trace: list | None):
        self.cost, self.policy, self.trace = cost, policy, trace
        self.requests = requests
        self.pending = sorted(requests, key=lambda x: (x.arrival, x.id))  # in order of arrival
        self.arrived = 0  # how many of ``pending`` are in a queue (or beyond)
        self.queues = [deque() for _ in range(policy.queue_count)]
        self.running: list[_Request] = []
        self.now = 0.0
        self.done = 0
        self.kv_in_use = 0  # tokens of KV the running requests hold: the sum of their ``kv``
        self.yielded = 0  # tokens yielded, over all requests
        self.computed = 0  # the sum of every request's ``computed``
        self.recomputable = 0  # the same over the unfinished requests: the KV a run may have to compute again
        self._last_progress, self._stalls = None, 0

    # ------------------------------------------------------------------ the loop

    def run(self) -> list[dict]:
        while self.done < len(self.requests):
            self.check_progress()
            self.arrive()
            if not self.running and not self.queued:  # idle: jump to the next arrival
                self.now = max(self.now, self.pending[self.arrived].arrival)
                continue
            admitted = self.admit_batch() if self.policy.kind in ("static", "dynamic") else self.admit_continuous()
            for x in admitted:
                x.admitted = self.now
                if math.isnan(x.first_admitted):
                    x.first_admitted = self.now
            self.running.extend(admitted)
            if not self.running:
                self.now = max(self.now, self.wake_time())
                continue
            start = self.now
            step = self.plan()
            self.advance(step)
            preempted = self.preempt()
            if self.trace is not None:
                self.trace.append({"start": start, "end": self.now,
                                   "prefill": {x.id: take for x, take in step.prefills},
                                   "decode": [x.id for x in step.decodes], "yielded": [x.id for x in step.yielded],
                                   "finished": [x.id for x in step.finished], "preempted": [x.id for x in preempted],
                                   "kv": self.kv_in_use})
        return [x.result(self.policy.bucket_name(x.queue)) for x in sorted(self.requests, key=lambda y: y.id)]

    def check_progress(self) -> None:
        """Fail loudly, never spin (see the module): count the loop turns in a row in which no request
        arrived or finished, no token was yielded and no prompt token was prefilled for the first time; more
        than ``stall_limit`` of them is a bug (in the engine, a policy or the cost model), not a workload."""
        progress = (self.arrived, self.done, self.yielded, self.computed)  # each only grows
        self._stalls = self._stalls + 1 if progress == self._last_progress else 0
        self._last_progress = progress
        if self._stalls > self.stall_limit:
            raise RuntimeError(f"the simulation made no progress in {self._stalls} loop turns (no arrival, no token, "
                               f"no prompt token prefilled for the first time) at t={self.now:.6f} s: {self.state()}; "
                               f"a bug in the engine or the policy, not in the workload")

    @property
    def stall_limit(self) -> int:
        """Loop turns in a row that may pass without progress: a wake-up per queue, ``STALL_LIMIT`` more, and
        one step per token of KV that a pre-emption may have made the unfinished requests compute again."""
        return STALL_LIMIT + self.policy.queue_count + self.recomputable

    def state(self) -> str:
        """The engine's state in words, for an error: running requests (id, prefilled of target, generated of
        output), queued and done counts, KV in use."""
        shown = ", ".join(f"{x.id} (prefilled {x.prefilled}/{x.target}, generated {x.generated}/{x.output})"
                          for x in self.running[:8])
        shown = f": {shown}" if shown else ""
        more = f" and {len(self.running) - 8} more" if len(self.running) > 8 else ""
        cap = "unbounded" if self.policy.kv_capacity is None else f"of {self.policy.kv_capacity}"
        return (f"{len(self.running)} running{shown}{more}; {self.queued} queued; {self.done} of "
                f"{len(self.requests)} done; {self.kv_in_use} tokens of KV in use ({cap})")

    @property
    def queued(self) -> int:
        """Requests waiting in the queues."""
        return sum(len(q) for q in self.queues)

    @property
    def all_arrived(self) -> bool:
        """Every request has reached a queue: no arrival is left to wait for."""
        return self.arrived >= len(self.pending)

    def arrive(self) -> None:
        """Queue every request that has arrived by now, in order of arrival."""
        while not self.all_arrived and self.pending[self.arrived].arrival <= self.now:
            x = self.pending[self.arrived]
            self.queues[x.queue].append(x)
            self.arrived += 1

    # ------------------------------------------------------------------ admission

    def batch_deadline(self) -> float:
        """Dynamic batching: when the oldest queued request has waited ``max_wait``."""
        return self.queues[0][0].arrival + self.policy.max_wait

    def admit_batch(self) -> list[_Request]:
        """Static and dynamic batching: a running batch is locked (nobody joins it until all of it has
        finished); when none runs, start one of up to ``max_batch`` requests if that many wait, or every
        request has arrived, or (dynamic) the oldest has waited ``max_wait``."""
        q = self.queues[0]
        if self.running or not q:
            return []
        ready = len(q) >= self.policy.max_batch or self.all_arrived
        if not ready and not (self.policy.kind == "dynamic" and self.now >= self.batch_deadline()):
            return []
        return [q.popleft() for _ in range(min(len(q), self.policy.max_batch))]

    def held(self, queue: int) -> float | None:
        """Continuous batching with a window: the time the queue's window closes if the queue is held now,
        else None. A queue is held while its oldest request has waited less than the window, its prompts
        fill less than ``token_budget`` and more requests will arrive (a window of 0 s never holds: the
        oldest has always waited that long)."""
        q = self.queues[queue]
        if not q or self.all_arrived:
            return None
        deadline = q[0].arrival + self.policy.window(queue)
        if self.now >= deadline or sum(x.target for x in q) >= self.policy.token_budget:
            return None
        return deadline

    def admit_continuous(self) -> list[_Request]:
        """Continuous batching: from each queue in priority order (skipping held ones), admit from the front
        while fewer than ``max_running`` run, the bucket's cap allows, the prompt tokens fit what is left
        of ``token_budget`` (the step's first admission always fits; with chunking a prompt needs only its
        first chunk) and its KV plus one token fits the capacity."""
        p = self.policy
        budget, kv = p.token_budget, self.kv_in_use
        per_queue = [0] * p.queue_count
        for x in self.running:
            per_queue[x.queue] += 1
        admitted = []
        for qi in p.admission_order():
            q, cap = self.queues[qi], p.running_cap(qi)
            if self.held(qi) is not None:
                continue
            while q and len(self.running) + len(admitted) < p.max_running:
                x = q[0]
                if cap is not None and per_queue[qi] >= cap:
                    break
                need = x.target if p.chunk is None else min(x.target, p.chunk)
                if admitted and need > budget:
                    break
                if p.kv_capacity is not None and kv + x.target + 1 > p.kv_capacity:
                    break
                admitted.append(q.popleft())
                per_queue[qi] += 1
                budget -= need
                kv += x.target
        return admitted

    def wake_time(self) -> float:
        """Nothing runs: the next moment that can change that, the next arrival or a window's end."""
        if self.all_arrived:
            raise RuntimeError("requests are queued but the policy can admit none of them: check the bucket "
                               "limits and the KV capacity")
        if self.policy.kind == "continuous":
            deadlines = [d for d in map(self.held, range(self.policy.queue_count)) if d is not None]
        elif self.policy.kind == "dynamic":
            deadlines = [self.batch_deadline()]
        else:
            deadlines = []
        return min([self.pending[self.arrived].arrival, *deadlines])

    # ------------------------------------------------------------------ one step

    def plan(self) -> _Step:
        """Who prefills how many tokens and who decodes. In order of admission, a request with prompt left
        prefills it whole, or its next chunk; once a step prefills something, a later prompt that does
        not fit the rest of the budget waits for a later step (static and dynamic: no budget). A chunk
        is cut to the budget. Requests past their prefill decode, unless ``prefill_first`` and the step
        prefills."""
        p = self.policy
        budget = p.token_budget if p.kind == "continuous" else math.inf
        step = _Step()
        for x in self.running:
            if x.prefilled < x.target:
                take = x.target - x.prefilled
                if p.chunk is not None:
                    take = min(take, p.chunk)
                if step.prefills and take > budget:  # does not fit what is left: a later step takes it
                    continue
                if p.chunk is not None:  # only the step's first prompt can exceed the budget: cut it
                    take = min(take, budget)
                step.prefills.append((x, take))
                budget -= take
            else:
                step.decodes.append(x)
        if p.prefill_first and step.prefills:  # a prefill step: the running requests' decode waits
            step.decodes = []
        return step

    def advance(self, step: _Step) -> None:
        """Run the step: the clock moves by its cost; prefills progress; the requests whose prompt it
        completes and those that decode yield a token each (``step.yielded``; the KV in use grows by every
        prompt token and every yielded token); requests with all their tokens leave (``step.finished``)."""
        tokens, prefill_tokens, decode_kv = step.tokens, step.prefill_tokens, step.decode_kv
        if not tokens:
            raise RuntimeError(f"an empty step at t={self.now:.6f} s with {len(self.running)} running: the engine "
                               f"planned no prefill and no decode")
        detail = getattr(self.cost, "step_detail", None)
        dt = (detail(tokens, step.prefill_work, decode_kv, prefills=len(step.prefills),
                     decode_ctx_max=step.decode_ctx_max)
              if detail is not None else self.cost.step(tokens, step.prefill_work, decode_kv))
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"the cost model gives {dt!r} s for a step of {prefill_tokens} prefill and "
                             f"{len(step.decodes)} decode tokens ({decode_kv} of KV): a step must take a positive, "
                             f"finite time; check its parameters")
        now = self.now = self.now + dt
        yielded, finished = step.yielded, step.finished
        for x, take in step.prefills:
            x.prefilled += take
            if math.isnan(x.first_token):  # a stage of its TTFT; recomputing after a pre-emption comes after it
                x.prefill_time += dt
            if x.prefilled > x.computed:  # KV it never had: progress (see check_progress)
                self.computed += x.prefilled - x.computed
                self.recomputable += x.prefilled - x.computed
                x.computed = x.prefilled
            if x.prefilled == x.target:  # the step that completes a prompt yields its next token
                yielded.append(x)
                if math.isnan(x.first_token):
                    x.first_token = now
        yielded += step.decodes
        self.yielded += len(yielded)
        for x in yielded:
            x.generated += 1
            x.token_times.append(now)
            if x.generated >= x.output:
                finished.append(x)
        self.kv_in_use += prefill_tokens + len(yielded)
        for x in finished:
            x.finish = now
            self.running.remove(x)
            self.kv_in_use -= x.kv
            self.recomputable -= x.computed
            self.done += 1

    def preempt(self) -> list[_Request]:
        """While the running requests hold more KV than the capacity, pre-empt the most recently admitted
        (ties: the higher id): drop its KV and put it at the front of its queue, to prefill its prompt and
        the tokens it generated again. Returns the pre-empted requests."""
        out = []
        if self.policy.kv_capacity is None:
            return out
        while self.running and self.kv_in_use > self.policy.kv_capacity:
            victim = max(self.running, key=lambda y: (y.admitted, y.id))
            self.running.remove(victim)
            self.kv_in_use -= victim.kv
            victim.prefilled = 0
            victim.target = victim.input + victim.generated
            victim.preemptions += 1
            self.queues[victim.queue].appendleft(victim)
            out.append(victim)
        return out


def simulate(reqs, cost, policy: Policy, *, trace: list | None = None) -> list[dict]:
    """Run the requests ({"id", "arrival", "kind", "input", "output"}; arrival in seconds, input and output
    in tokens) through the engine under ``policy``, each step lasting ``cost.step(tokens,
    prefill_ctx_work, decode_kv_tokens)`` seconds (a ``lib.serving.MeasuredCostModel`` or anything with
    that method); one result per request, in id order (keys in the module's docstring). Deterministic: the
    same input gives the same output.

    ``trace``: a list to which one record per step is appended: its "start" and "end" (s), "prefill"
    {id: prompt tokens}, "decode" [ids], "yielded" [ids of the requests that got a token], "finished"
    [ids], "preempted" [ids] and "kv", the tokens of KV the running requests hold after it."""
    policy.check()
    return _Engine(_requests(reqs, policy), cost, policy, trace).run()
