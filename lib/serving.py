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

from lib import costs


@dataclass(frozen=True)
class CostModel:
    """Seconds per engine step from what the step does.

    step = overhead + max(weight_bytes / BW, 2 params M / P)       (the layer stack, M tokens)
                    + attn_flops * sum(prefill tokens x their context) / P
                    + kv_bytes * (tokens of KV the decoding requests read) / BW
    """

    overhead_s: float
    weight_bytes: float
    params: float
    P_flops: float
    BW_Bps: float
    attn_flops_per_token_ctx: float  # 4 layers heads head_dim
    kv_bytes_per_token: float  # 2 layers H_kv head_dim b

    @classmethod
    def llama3_8b(cls, c: dict, overhead_s: float = 0.0) -> CostModel:
        """From chapter 0's ceilings (``lib.ceilings``) and Llama-3-8B's shapes in bf16."""
        m = costs.LLAMA3_8B
        params = m["layers"] * sum(k * n for k, n in m["linears"].values()) + m["vocab"] * m["hidden"]
        return cls(overhead_s=overhead_s, weight_bytes=2 * params, params=params, P_flops=c["bf16_tflops"] * 1e12,
                   BW_Bps=c["copy_bw_GBps"] * 1e9,
                   attn_flops_per_token_ctx=4 * m["layers"] * m["heads"] * m["head_dim"],
                   kv_bytes_per_token=costs.kv_cache_bytes(m["layers"], 1, 1, m["kv_heads"], m["head_dim"], 2))

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        linear = max(self.weight_bytes / self.BW_Bps, 2 * self.params * tokens / self.P_flops)
        return (self.overhead_s + linear + self.attn_flops_per_token_ctx * prefill_ctx_work / self.P_flops
                + self.kv_bytes_per_token * decode_kv_tokens / self.BW_Bps)


@dataclass(frozen=True)
class MeasuredCostModel:
    """Seconds per engine step from measured pieces of one model:

    step = overhead + linear(M)                       (the whole layer stack at M tokens: interpolated, log-log)
                    + attn_flops * sum(prefill tokens x their context) / P
                    + layers * (attn_fixed + kv_bytes * (KV tokens the decoding requests read) / attn_BW)

    ``linear`` comes from measured GEMM times (chapter 1), the decode attention terms from a fit of
    measured decode-attention kernels (chapter 3); prefill attention, not measured, uses the bf16 rate.
    """

    m_points: tuple
    linear_s: tuple
    layers: int
    attn_fixed_s: float
    attn_BW_Bps: float
    attn_flops_per_token_ctx: float
    P_flops: float
    kv_bytes_per_token: float  # all layers
    overhead_s: float = 0.0

    @classmethod
    def fitted(cls, m_points, linear_s, prefill_s_per_work: float, decode_fixed_s: float,
               decode_s_per_kv_token: float, overhead_s: float = 0.0) -> MeasuredCostModel:
        """From a model measured whole: its forward time at M tokens with no context (``linear_s`` at
        ``m_points``), seconds per unit of prefill attention work (new tokens x their context), and a
        decode step's extra cost: fixed, plus per token of KV read."""
        if len(m_points) != len(linear_s) or len(m_points) < 2 or list(m_points) != sorted(m_points):
            raise ValueError("need at least two increasing m_points, one time for each")
        if not all(t > 0 and math.isfinite(t) for t in linear_s):
            raise ValueError(f"every forward time must be positive and finite, got {list(linear_s)}")
        costs = {"prefill_s_per_work": prefill_s_per_work, "decode_fixed_s": decode_fixed_s,
                 "decode_s_per_kv_token": decode_s_per_kv_token, "overhead_s": overhead_s}
        bad = {k: v for k, v in costs.items() if not (v >= 0 and math.isfinite(v))}
        if bad:
            raise ValueError(f"costs must be finite and >= 0, got {bad}: a negative slope fitted from timings means "
                             f"their noise exceeds the effect; take it as 0 or measure larger sizes")
        return cls(m_points=tuple(m_points), linear_s=tuple(linear_s), layers=1, attn_fixed_s=decode_fixed_s,
                   attn_BW_Bps=1.0 / decode_s_per_kv_token if decode_s_per_kv_token else math.inf,
                   attn_flops_per_token_ctx=prefill_s_per_work, P_flops=1.0, kv_bytes_per_token=1.0,
                   overhead_s=overhead_s)

    def linear(self, m: int) -> float:
        ms, ts = self.m_points, self.linear_s
        if m <= ms[0]:
            return ts[0]
        if m >= ms[-1]:
            return ts[-1] * m / ms[-1]  # beyond the table: compute-bound, linear in M
        i = next(j for j in range(1, len(ms)) if ms[j] >= m)
        f = (math.log(m) - math.log(ms[i - 1])) / (math.log(ms[i]) - math.log(ms[i - 1]))
        return math.exp(math.log(ts[i - 1]) + f * (math.log(ts[i]) - math.log(ts[i - 1])))

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        attn = self.layers * (self.attn_fixed_s + self.kv_bytes_per_token / self.layers * decode_kv_tokens
                              / self.attn_BW_Bps) if decode_kv_tokens else 0.0
        return (self.overhead_s + self.linear(tokens) + self.attn_flops_per_token_ctx * prefill_ctx_work / self.P_flops
                + attn)


def fit_line(xs, ys) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    n = len(xs)
    if n < 2:
        raise ValueError("fit_line needs at least two points")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


@dataclass(frozen=True)
class Bucket:
    name: str
    max_input: int  # prompts up to this many tokens (the last bucket should take the rest)
    priority: int = 0  # lower is admitted first
    max_running: int | None = None
    max_wait: float | None = None  # this bucket's batching window (None: the policy's max_wait)


@dataclass(frozen=True)
class Policy:
    kind: str = "continuous"
    max_batch: int = 32
    max_wait: float = 0.0
    max_running: int = 256
    token_budget: int = 8192
    chunk: int | None = None
    buckets: tuple[Bucket, ...] = ()
    kv_capacity: int | None = None
    prefill_first: bool = False  # steps with prefill work run no decode (prefill pre-empts decode)

    def check(self) -> None:
        if self.kind not in ("static", "dynamic", "continuous"):
            raise ValueError(f"kind must be 'static', 'dynamic' or 'continuous', got {self.kind!r}")
        if self.max_batch < 1 or self.max_running < 1 or self.token_budget < 1 or self.max_wait < 0:
            raise ValueError("max_batch, max_running and token_budget must be >= 1 and max_wait >= 0")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"chunk must be >= 1 tokens or None, got {self.chunk}")
        if self.buckets and self.kind != "continuous":
            raise ValueError("buckets need the continuous policy")
        if self.buckets and sorted(b.max_input for b in self.buckets) != [b.max_input for b in self.buckets]:
            raise ValueError("buckets must be listed by increasing max_input")
        if any(b.max_running is not None and b.max_running < 1 for b in self.buckets):
            raise ValueError("a bucket's max_running must be at least 1 (or None)")
        if any(b.max_wait is not None and b.max_wait < 0 for b in self.buckets):
            raise ValueError("a bucket's max_wait must be >= 0 s (or None)")
        if self.kv_capacity is not None and self.kv_capacity < 1:
            raise ValueError("kv_capacity must be a positive number of tokens or None")


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


def simulate(reqs, cost: CostModel, policy: Policy) -> list[dict]:
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


def percentile(xs, p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation, as numpy's default."""
    v = sorted(x for x in xs if not math.isnan(x))
    if not v:
        return math.nan
    k = (len(v) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _span(results: list[dict]) -> float:
    """Seconds from the first arrival to the last finish: the denominator of every tokens/s."""
    return max(r["arrival"] + r["e2e"] for r in results) - min(r["arrival"] for r in results)


def goodput(results: list[dict], ttft_slo: float, tpot_slo: float, kind: str | None = None) -> float:
    """Output tokens per second of the requests that met both SLOs (TTFT and TPOT, in seconds), over the
    span of the whole run: the throughput that counts for users."""
    if ttft_slo <= 0 or tpot_slo <= 0:
        raise ValueError(f"SLOs must be positive seconds, got TTFT {ttft_slo} and TPOT {tpot_slo}")
    span = _span(results)
    good = sum(r["tokens"] for r in results if (kind is None or r["kind"] == kind) and r["ttft"] <= ttft_slo
               and (math.isnan(r["tpot"]) or r["tpot"] <= tpot_slo))
    return good / span if span > 0 else math.nan


def summary(results: list[dict], kind: str | None = None) -> dict:
    """TTFT, TPOT and E2E percentiles and output tokens per second, over all requests or one kind."""
    rs = [r for r in results if kind is None or r["kind"] == kind]
    if not rs:
        return {}
    span = _span(results)
    out = {"requests": len(rs), "tokens_per_s": sum(r["tokens"] for r in rs) / span if span > 0 else math.nan}
    for m in ("ttft", "tpot", "e2e", "queue"):
        for p in (50, 95, 99):
            out[f"{m}_p{p}"] = percentile([r[m] for r in rs], p)
    return out
