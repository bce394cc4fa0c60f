"""A discrete-event simulator of one serving engine: the engine's own scheduler on a virtual clock, each
step lasting what a cost model says.

The scheduling rules are not here: they are ``lib.engine.scheduler.Scheduler``'s, the same object the
engine runs, under the same ``lib.engine.policy.Policy``. Its KV is ``lib.engine.kv.TokenKV``: tokens up to
the policy's ``kv_capacity`` (None: unbounded), no prefix cache, no tensor. This module only moves time:

1. every request that has arrived by now joins its queue (``Scheduler.enqueue``); once the last has,
   the scheduler is told no more will come (``arrivals_done``: static batches and windows stop waiting);
2. if nothing runs or waits, the clock jumps to the next arrival;
3. the scheduler admits and plans the step (``Scheduler.schedule``); if it plans nothing, the clock jumps
   to the next moment that can change that, the next arrival or the end of a batching window
   (``Scheduler.wake_time``); a queue nothing can ever admit is an error;
4. the cost model gives the step's duration (``lib.engine.cost.step_seconds``: ``step(M, W, K)``, or
   ``step_detail`` when it has one), the clock moves by it, and the scheduler records the step's tokens
   (``Scheduler.finish_step``): each request asks for exactly its ``output`` tokens.

The loop cannot spin. Progress is counted in tokens, not in time (the clock moves on every step, a loop
that throws away what it computed included): a loop turn progresses when a request arrives or finishes, a
token is yielded, or a prompt token is prefilled that its request had never prefilled before (the most it
ever prefilled is its ``computed``; recomputing them after a pre-emption is not progress). Each of these
counts is bounded, so a healthy run progresses a bounded number of times. Between two progressing turns the
engine may only wait for a window (at most one wake-up per queue), plan a step that pre-empts all it runs,
or recompute KV it had dropped, at most the ``computed`` tokens of the unfinished requests, one a step or
more. A run with more turns without progress than that (plus ``STALL_LIMIT``) raises ``RuntimeError``
naming the state (clock, running and queued requests, KV in use): a bug in the scheduler or a policy,
never a workload. So every run ends: it finishes, or it stops with that error.

Metrics, per request: the engine's (``lib.engine.scheduler.Request.result``); ``lib.engine.metrics`` turns
them into percentiles, tokens/s and goodput.

Chapters: 6.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Integral, Real

from lib.engine.config import SamplingParams
from lib.engine.cost import step_seconds
from lib.engine.kv import TokenKV
from lib.engine.policy import Policy
from lib.engine.scheduler import Request, Scheduler

STALL_LIMIT = 3  # loop turns in a row that may change nothing, besides wake-ups and recomputation (see the module)


def _whole(value) -> bool:
    """A whole number (an int or a numpy integer; a bool or a float such as 1.9 or 2.0 is not one)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def requests(reqs, policy: Policy) -> list[Request]:
    """The requests ({"id", "arrival", "input", "output", "kind" (optional)}) checked and made the
    scheduler's: a prompt of ``input`` tokens (their ids do not matter here), asking for ``output``."""
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
        out.append(Request(r["id"], [0] * int(r["input"]), SamplingParams(max_tokens=int(r["output"]), ignore_eos=True),
                           float(arrival), kind=r.get("kind", "")))
    if len({x.id for x in out}) != len(out):
        raise ValueError("request ids must be unique: each result is reported under its request's id")
    return out


class Simulation:
    """The clock, the arrivals and the scheduler (see the module). ``on_plan``: called with each plan the
    scheduler makes, before it runs (what a test or a diagram may watch)."""

    def __init__(self, reqs: list[Request], cost, policy: Policy, trace: list | None = None, on_plan=None):
        self.cost, self.trace, self.on_plan = cost, trace, on_plan
        self.scheduler = Scheduler(policy, TokenKV(policy.kv_capacity))
        self.requests = reqs
        self.pending = sorted(reqs, key=lambda x: (x.arrival, x.id))  # in order of arrival
        self.arrived = 0  # how many of ``pending`` are in a queue (or beyond)
        self.now = 0.0
        self.done = 0
        self.yielded = 0  # tokens yielded, over all requests
        self.computed = {x.id: 0 for x in reqs}  # the most prompt tokens each ever prefilled
        self.computed_total = 0
        self.recomputable = 0  # the same over the unfinished requests: the KV a run may have to compute again
        self._last_progress, self._stalls = None, 0

    @property
    def all_arrived(self) -> bool:
        return self.arrived >= len(self.pending)

    def run(self) -> list[dict]:
        s = self.scheduler
        while self.done < len(self.requests):
            self.check_progress()
            self.arrive()
            if not s.running and not s.queued:  # idle: jump to the next arrival
                self.now = max(self.now, self.pending[self.arrived].arrival)
                continue
            plan = s.schedule(self.now)
            if self.on_plan is not None:
                self.on_plan(plan)
            if plan.empty:
                if not plan.preempted:  # nothing could run: wait for what can change that
                    self.now = max(self.now, self.wake_time())
                continue
            self.advance(plan)
        return [x.result(s.policy.bucket_name(x.queue)) for x in sorted(self.requests, key=lambda y: y.id)]

    def arrive(self) -> None:
        """Queue every request that has arrived by now, in order of arrival."""
        while not self.all_arrived and self.pending[self.arrived].arrival <= self.now:
            self.scheduler.enqueue(self.pending[self.arrived])
            self.arrived += 1
        self.scheduler.arrivals_done = self.all_arrived

    def wake_time(self) -> float:
        """Nothing runs: the next arrival or the end of a window, whichever comes first."""
        times = [self.scheduler.wake_time(self.now)]
        if not self.all_arrived:
            times.append(self.pending[self.arrived].arrival)
        times = [t for t in times if t is not None]
        if not times:
            raise RuntimeError("requests are queued but the policy can admit none of them: check the bucket "
                               "limits and the KV capacity")
        return min(times)

    def advance(self, plan) -> None:
        """Run the step: the clock moves by its cost, the scheduler records a token for every request the step
        samples, the progress counts grow (see the module)."""
        s, start = self.scheduler, self.now
        dt = step_seconds(self.cost, plan)
        if not dt > 0:
            raise ValueError(f"the cost model gives {dt!r} s for a step of {plan.prefill_tokens} prefill and "
                             f"{len(plan.decodes)} decode tokens ({plan.decode_kv} of KV): a step must take a "
                             f"positive, finite time; check its parameters")
        self.now = start + dt
        sampled = plan.sampled
        finished = s.finish_step(plan, [0] * len(sampled), self.now, dt)
        self.yielded += len(sampled)
        for x, _, end in plan.prefills:
            new = end - self.computed[x.id]
            if new > 0:  # KV it never had: progress
                self.computed[x.id] = end
                self.computed_total += new
                self.recomputable += new
        for x in finished:
            self.recomputable -= self.computed[x.id]
            self.done += 1
        if self.trace is not None:
            self.trace.append({"start": start, "end": self.now,
                               "prefill": {x.id: end - st for x, st, end in plan.prefills},
                               "decode": [x.id for x in plan.decodes], "yielded": [x.id for x in sampled],
                               "finished": [x.id for x in finished], "preempted": [x.id for x in plan.preempted],
                               "kv": s.kv.used})

    def check_progress(self) -> None:
        """Fail loudly, never spin (see the module): count the loop turns in a row in which no request
        arrived or finished, no token was yielded and no prompt token was prefilled for the first time; more
        than ``stall_limit`` of them is a bug (in the scheduler, a policy or the cost model), not a workload."""
        progress = (self.arrived, self.done, self.yielded, self.computed_total)  # each only grows
        self._stalls = self._stalls + 1 if progress == self._last_progress else 0
        self._last_progress = progress
        if self._stalls > self.stall_limit:
            raise RuntimeError(f"the simulation made no progress in {self._stalls} loop turns (no arrival, no token, "
                               f"no prompt token prefilled for the first time) at t={self.now:.6f} s: {self.state()}; "
                               f"a bug in the scheduler or the policy, not in the workload")

    @property
    def stall_limit(self) -> int:
        """Loop turns in a row that may pass without progress: a wake-up per queue, ``STALL_LIMIT`` more, and
        one step per token of KV that a pre-emption may have made the unfinished requests compute again."""
        return STALL_LIMIT + self.scheduler.policy.queue_count + self.recomputable

    def state(self) -> str:
        """The state in words, for an error: running requests (id, prefilled of target, generated of output),
        queued and done counts, KV in use."""
        s = self.scheduler
        shown = ", ".join(f"{x.id} (prefilled {min(x.prefilled, x.target)}/{x.target}, generated "
                          f"{len(x.output)}/{x.params.max_tokens})" for x in s.running[:8])
        shown = f": {shown}" if shown else ""
        more = f" and {len(s.running) - 8} more" if len(s.running) > 8 else ""
        cap = "unbounded" if s.kv.capacity is None else f"of {s.kv.capacity}"
        return (f"{len(s.running)} running{shown}{more}; {s.queued} queued; {self.done} of "
                f"{len(self.requests)} done; {s.kv.used} tokens of KV in use ({cap})")


def simulate(reqs, cost, policy: Policy, *, trace: list | None = None, on_plan=None) -> list[dict]:
    """Run the requests ({"id", "arrival", "kind", "input", "output"}; arrival in seconds, input and output
    in tokens) through the engine's scheduler under ``policy``, each step lasting what ``cost`` says
    (``lib.engine.cost``'s protocol: ``step(tokens, prefill_ctx_work, decode_kv_tokens)``); one result per
    request, in id order (``lib.engine.scheduler.Request.result``). Deterministic: the same input gives the
    same output.

    ``trace``: a list to which one record per step is appended: its "start" and "end" (s), "prefill"
    {id: prompt tokens}, "decode" [ids], "yielded" [ids of the requests that got a token], "finished"
    [ids], "preempted" [ids pre-empted while planning it] and "kv", the tokens of KV held after it.
    ``on_plan``: called with every ``lib.engine.scheduler.Plan`` the scheduler makes."""
    policy.check()
    return Simulation(requests(reqs, policy), cost, policy, trace, on_plan).run()
