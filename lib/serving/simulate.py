"""A discrete-event simulator of one LLM serving engine: queues, a batching policy, a cost per step.

The engine runs in steps. A step takes some new prompt tokens (prefill, possibly a chunk of a prompt)
and one new token for each running request past its prefill (decode), and lasts what the cost model
says. Requests arrive on their own clock and wait in a queue until the policy admits them.

Policies (``Policy.kind``):

- ``static``: wait for ``max_batch`` requests (or the last arrivals), run them to completion together;
  arrivals in between wait for the whole batch to finish.
- ``dynamic``: the same, but a batch also starts once its oldest request has waited ``max_wait`` s.
- ``continuous``: every step, finished requests leave and queued ones join while fewer than
  ``max_running`` run and the step's prompt tokens stay within ``token_budget``:
  B_{t+1} = (B_t minus F_t) plus A_t. With ``chunk`` set, a long prompt is prefilled ``chunk`` tokens per
  step (chunked prefill) instead of in one step. With ``prefill_first``, a step that has prompt tokens to
  prefill runs no decode: running requests wait while new ones are prefilled.
  With ``max_wait`` > 0, a batching window: queued prompts are held back until the oldest has waited
  ``max_wait`` s or together they fill ``token_budget``, so that prefills run in larger batches.
- Buckets (continuous only): ``buckets`` splits the queue by prompt length, each bucket with a priority,
  its own limit of running requests and its own window, so that long documents cannot crowd out short
  chats.

A KV capacity (tokens) bounds what running requests may hold; a request is admitted only if its prompt
and what it has generated fit, and when decode would overflow it, the most recently admitted request is
pre-empted: its KV is dropped and it re-enters the queue to be prefilled again.

Metrics follow serving benchmarks: TTFT (arrival to first token), TPOT = (E2E - TTFT) / (output - 1),
inter-token latencies, E2E, output tokens per second, and goodput (tokens/s of the requests that met
their SLOs); per request, the time queued, in prefill and in decode.

Chapters: 6.
"""


from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from lib.serving.policy import Policy


@dataclass
class _Req:
    id: int
    arrival: float
    kind: str
    input: int
    output: int
    bucket: int = 0
    target: int = 0  # tokens to prefill: the prompt, plus what was generated before a pre-emption
    prefilled: int = 0
    generated: int = 0
    admitted: float = math.nan
    first_admitted: float = math.nan
    first_token: float = math.nan
    finish: float = math.nan
    prefill_time: float = 0.0
    preemptions: int = 0
    token_times: list = field(default_factory=list)


def simulate(reqs, cost, policy: Policy) -> list[dict]:
    """Run the requests ({"id", "arrival", "kind", "input", "output"}) through the engine; one result per
    request, in id order. Deterministic: the same input gives the same output."""
    policy.check()
    rs = []
    for r in reqs:
        if r["input"] < 1 or r["output"] < 1:
            raise ValueError(f"request {r['id']}: input and output must be at least 1 token")
        if not (math.isfinite(float(r["arrival"])) and float(r["arrival"]) >= 0):
            raise ValueError(f"request {r['id']}: arrival {r['arrival']!r} must be a finite time >= 0 (seconds); a NaN "
                             f"or infinite arrival rate upstream gives such times")
        if policy.kv_capacity is not None and r["input"] + r["output"] > policy.kv_capacity:
            raise ValueError(f"request {r['id']} needs {r['input'] + r['output']} tokens of KV, more than the "
                             f"capacity {policy.kv_capacity}: raise kv_capacity or drop the request")
        b = 0
        for i, bk in enumerate(policy.buckets):
            b = i
            if r["input"] <= bk.max_input:
                break
        rs.append(_Req(r["id"], float(r["arrival"]), r.get("kind", ""), int(r["input"]), int(r["output"]), b,
                       target=int(r["input"])))
    pending = sorted(rs, key=lambda x: (x.arrival, x.id))
    nb = max(1, len(policy.buckets))
    queues = [deque() for _ in range(nb)]
    order = sorted(range(nb), key=lambda i: (policy.buckets[i].priority if policy.buckets else 0, i))
    running: list[_Req] = []
    now, nxt, done = 0.0, 0, 0
    batch_locked = False  # static/dynamic: a batch is running and admits nobody

    def arrive(until):
        nonlocal nxt
        while nxt < len(pending) and pending[nxt].arrival <= until:
            q = pending[nxt]
            queues[q.bucket].append(q)
            nxt += 1

    def kv_used():
        return sum(x.prefilled + x.generated for x in running)

    def window(bi):
        w = policy.buckets[bi].max_wait if policy.buckets else None
        return policy.max_wait if w is None else w

    def held(bi):
        """Continuous batching with a window: the bucket's queue waits to fill (deadline, or None if not held)."""
        q = queues[bi]
        if policy.kind != "continuous" or not q or window(bi) <= 0 or nxt >= len(pending):
            return None
        deadline = q[0].arrival + window(bi)
        if now >= deadline or sum(x.target for x in q) >= policy.token_budget:
            return None
        return deadline

    last_state, stalls = None, 0
    while done < len(rs):
        state = (now, done, nxt, len(running), sum(x.prefilled + x.generated for x in running))
        stalls = stalls + 1 if state == last_state else 0
        if stalls > 3:  # a bug, not a workload: fail loudly instead of spinning
            raise RuntimeError(f"the simulation made no progress at t={now:.6f} s with {len(running)} running and "
                               f"{sum(len(q) for q in queues)} queued")
        last_state = state
        arrive(now)
        queued = sum(len(q) for q in queues)
        if not running and not queued:  # idle: jump to the next arrival
            now = max(now, pending[nxt].arrival)
            continue
        admitted = []
        if policy.kind in ("static", "dynamic"):
            if not running:
                batch_locked = False
            if not batch_locked and queued:
                q = queues[0]
                deadline = q[0].arrival + policy.max_wait  # compared as computed below: no rounding gap
                full = len(q) >= policy.max_batch
                last = nxt >= len(pending)
                if full or last or (policy.kind == "dynamic" and now >= deadline):
                    while q and len(admitted) < policy.max_batch:
                        admitted.append(q.popleft())
                    batch_locked = True
                elif not running:  # wait for the batch to fill, or for the oldest to time out
                    wake = pending[nxt].arrival
                    if policy.kind == "dynamic":
                        wake = min(wake, deadline)
                    now = max(now, wake)
                    continue
        else:
            budget = policy.token_budget
            used = kv_used()
            per_bucket = [0] * nb
            for x in running:
                per_bucket[x.bucket] += 1
            for bi in order:
                q = queues[bi]
                cap = policy.buckets[bi].max_running if policy.buckets else None
                if held(bi):
                    continue
                while q and len(running) + len(admitted) < policy.max_running:
                    x = q[0]
                    if cap is not None and per_bucket[bi] >= cap:
                        break
                    need = x.target if policy.chunk is None else min(x.target, policy.chunk)
                    if admitted and need > budget:
                        break
                    if policy.kv_capacity is not None and used + x.target + 1 > policy.kv_capacity:
                        break
                    q.popleft()
                    admitted.append(x)
                    per_bucket[bi] += 1
                    budget -= need
                    used += x.target
        for x in admitted:
            x.admitted = now
            if math.isnan(x.first_admitted):
                x.first_admitted = now
        running.extend(admitted)
        if not running:
            if nxt >= len(pending):
                raise RuntimeError("requests are queued but the policy can admit none of them: check the bucket "
                                   "limits and the KV capacity")
            wake = pending[nxt].arrival
            deadlines = [d for d in (held(bi) for bi in range(nb)) if d is not None]
            now = max(now, min([wake, *deadlines]))
            continue
        # the step: prefill work (whole prompts, or chunks within the budget) and one decode token each
        budget = policy.token_budget if policy.kind == "continuous" else math.inf
        pf_tokens, pf_work, dec, dec_kv = 0, 0.0, [], 0
        prefilling = []
        for x in running:
            if x.prefilled < x.target:
                left = x.target - x.prefilled
                take = left if policy.chunk is None else min(left, policy.chunk)
                if prefilling and take > budget:
                    continue
                take = min(take, max(1, int(budget))) if policy.chunk is not None else take
                prefilling.append((x, take))
                pf_tokens += take
                pf_work += take * (x.prefilled + take / 2)
                budget -= take
            else:
                dec.append(x)
                dec_kv += x.prefilled + x.generated
        if policy.prefill_first and prefilling:  # a prefill step: the running requests' decode waits
            dec, dec_kv = [], 0
        dt = cost.step(pf_tokens + len(dec), pf_work, dec_kv)
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"the cost model gives {dt!r} s for a step of {pf_tokens} prefill and {len(dec)} decode "
                             f"tokens ({dec_kv} of KV): a step must take a positive, finite time; check its parameters")
        now += dt
        finished = []
        for x, take in prefilling:
            x.prefilled += take
            x.prefill_time += dt
            if x.prefilled == x.target:  # the prompt's last step yields the next token
                x.generated += 1
                x.token_times.append(now)
                if math.isnan(x.first_token):
                    x.first_token = now
                if x.generated >= x.output:
                    finished.append(x)
        for x in dec:
            x.generated += 1
            x.token_times.append(now)
            if x.generated >= x.output:
                finished.append(x)
        for x in finished:
            x.finish = now
            running.remove(x)
            done += 1
        if policy.kv_capacity is not None:  # pre-empt the newest until the KV fits
            while running and kv_used() > policy.kv_capacity:
                victim = max(running, key=lambda y: (y.admitted, y.id))
                running.remove(victim)
                victim.prefilled = 0
                victim.target = victim.input + victim.generated  # its KV must be computed again
                victim.preemptions += 1
                queues[victim.bucket].appendleft(victim)
    out = []
    for x in sorted(rs, key=lambda y: y.id):
        ttft = x.first_token - x.arrival
        e2e = x.finish - x.arrival
        itl = [b - a for a, b in zip(x.token_times, x.token_times[1:])]
        out.append({"id": x.id, "kind": x.kind, "bucket": policy.buckets[x.bucket].name if policy.buckets else "",
                    "input": x.input, "output": x.output, "arrival": x.arrival, "ttft": ttft, "e2e": e2e,
                    "tpot": (e2e - ttft) / (x.output - 1) if x.output > 1 else math.nan,
                    "itl_max": max(itl) if itl else math.nan, "queue": x.first_admitted - x.arrival,
                    "prefill": x.prefill_time, "decode": x.finish - x.first_token, "preemptions": x.preemptions,
                    "tokens": x.generated})
    return out
