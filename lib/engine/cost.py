"""What one engine step costs, in seconds: the book's one step-cost protocol, its cost models and the fits
that make them from measured steps. Chapters 6 and 8 use it; the simulator (``lib.simulator``) and the
virtual engine (``lib.engine.engine.CostRunner``) ask it through ``step_seconds``.

The protocol. A step runs M tokens through the model (the prompt tokens it prefills plus one token per
request it decodes). A cost model has ``step(M, W, K)``, seconds, with

- W the prefill's attention work, the sum over the prefilled chunks of new tokens x their mean context (a
  chunk of m tokens after c earlier ones: ``work(m, c)`` = m (c + m / 2));
- K the tokens of KV the decoding requests read (each its prompt and its output so far).

A model that also has ``step_detail(M, W, K, prefills=n, decode_ctx_max=c)`` is asked that instead: n the
requests the step prefills, c the longest decoding request's KV tokens (a step's cost can depend on which
requests it holds, not only on its token counts). ``step_seconds(cost, plan)`` takes these numbers from a
scheduler's plan (``lib.engine.scheduler.Plan``) and checks the answer: a finite number of seconds >= 0.

The models:

- ``MeasuredCostModel`` (chapter 6): step = overhead_s + linear(M) + prefill_s_per_work W + [K > 0]
  (decode_fixed_s + decode_s_per_kv_token K), with ``linear(M)`` the forward pass at M tokens and no
  context, measured at ``m_points`` (``linear_s``) and interpolated between them on log-log axes; below the
  first point it is the first time (a small step is as slow as the weights' read), beyond the last it
  grows in proportion to M (compute-bound).
- ``EngineCostModel`` (chapter 8): the engine runs two kinds of step (``lib.engine.runner``). A step that
  prefills (decodes riding along) is one eager forward pass: t = S(M) + alpha W + beta K (a
  ``MeasuredCostModel``); a step that only decodes (W = 0, K > 0) replays a CUDA graph of the smallest
  captured batch size b >= B: t = d0 + d1 b + beta K.
- ``DetailedCostModel``: an ``EngineCostModel`` plus what the token counts cannot say: gamma c added to a
  decode-only step (at a small batch, decode attention takes as long as its longest request), eta (n - 1)
  to a step that prefills (each prompt an attention call and its own host work).

The fits, each from measured steps:

- ``fit_prefill``, the half every calibration shares: from "stack" points (M new tokens, no context) and
  "context" points (M new tokens after ``ctx`` cached ones), alpha is the median over the context points of
  their extra time per unit of work (never below 0), and S(M) the stack's time less alpha W (at least a
  fifth of the stack's time).
- ``fit`` (chapter 8's calibration): ``fit_prefill``, then (d0, d1, beta) a least-squares line through the
  "decode" points (B requests of ``ctx`` tokens) against (b, B ctx), none below 0.
- ``fit_steps`` (chapter 8's service fit): steps of a running engine (``LLMEngine.steps``), each timed
  from its start to the next one's (``periods``): a step that prefills by t = S(M) + alpha W + beta_p K,
  with S(M) = h max(1, M / M*) (a floor of h seconds, the eager pass's host time, up to M* tokens, then
  linear in M; M* searched on a grid), a decode-only step by t = d0 + d1 b + beta K, each branch by least
  squares on the relative error with no coefficient below zero; K counts each decode's new token too. With
  ``detail=True``, gamma and eta too (a ``DetailedCostModel``).

Chapter 6's calibration (``lib.experiments.batching.fit_cost_model``) uses ``fit_prefill`` and fits its
decode terms to a ``MeasuredCostModel`` (lines per batch size).

Chapters: 6, 8.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from numbers import Real

import numpy as np

from lib.bench import fit as least_squares


def work(new: int, ctx: int) -> float:
    """Attention work of ``new`` tokens after ``ctx``: new x their mean context, new (ctx + new / 2)."""
    return new * (ctx + new / 2)


def step_seconds(cost, plan) -> float:
    """Seconds ``cost`` gives the step ``plan`` (see the module): ``step_detail`` when the model has it, else
    ``step``. A cost model must return a finite number of seconds >= 0: anything else raises (TypeError for
    what is not a number, ValueError for a negative or non-finite one)."""
    tokens, w, kv = plan.tokens, plan.prefill_work, plan.decode_kv
    detail = getattr(cost, "step_detail", None)
    dt = (detail(tokens, w, kv, prefills=len(plan.prefills), decode_ctx_max=plan.decode_ctx_max)
          if detail is not None else cost.step(tokens, w, kv))
    if not (isinstance(dt, Real) and not isinstance(dt, bool) and math.isfinite(dt) and dt >= 0):
        asked = "step_detail" if detail is not None else "step"
        raise (TypeError if not isinstance(dt, Real) or isinstance(dt, bool) else ValueError)(
            f"the cost model's {asked}({tokens}, {w}, {kv}) returned {dt!r}: a cost model must return the "
            "step's time in seconds, a finite float >= 0")
    return float(dt)


def _real(value) -> bool:
    """A finite real number (a bool is not one)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class MeasuredCostModel:
    """Seconds per engine step (see the module): ``linear_s[i]`` is the forward time (s) at
    ``m_points[i]`` tokens; the other fields are seconds per unit of prefill attention work, seconds a
    decoding step adds, seconds per token of KV read, and seconds every step adds."""

    m_points: tuple[int, ...]
    linear_s: tuple[float, ...]
    prefill_s_per_work: float
    decode_fixed_s: float
    decode_s_per_kv_token: float
    overhead_s: float = 0.0

    def __post_init__(self):
        ms, ts = tuple(self.m_points), tuple(self.linear_s)
        object.__setattr__(self, "m_points", ms)
        object.__setattr__(self, "linear_s", ts)
        if len(ms) < 2 or len(ms) != len(ts):
            raise ValueError(f"need at least two m_points and one forward time for each, got {len(ms)} points "
                             f"and {len(ts)} times")
        if not all(_real(m) and m > 0 for m in ms) or any(a >= b for a, b in zip(ms, ms[1:])):
            raise ValueError(f"m_points must be positive token counts in increasing order, got {list(ms)}")
        if not all(_real(t) and t > 0 for t in ts):
            raise ValueError(f"every forward time must be positive and finite (seconds), got {list(ts)}")
        terms = {"prefill_s_per_work": self.prefill_s_per_work, "decode_fixed_s": self.decode_fixed_s,
                 "decode_s_per_kv_token": self.decode_s_per_kv_token, "overhead_s": self.overhead_s}
        bad = {k: v for k, v in terms.items() if not (_real(v) and v >= 0)}
        if bad:
            raise ValueError(f"costs must be finite and >= 0, got {bad}: a negative slope fitted from timings means "
                             f"their noise exceeds the effect; take it as 0 or measure larger sizes")

    @classmethod
    def fitted(cls, m_points, linear_s, prefill_s_per_work: float, decode_fixed_s: float,
               decode_s_per_kv_token: float, overhead_s: float = 0.0) -> MeasuredCostModel:
        """From a model measured whole: its forward time at M tokens with no context (``linear_s`` at
        ``m_points``), seconds per unit of prefill attention work (new tokens x their context), and a
        decode step's extra cost: fixed, plus per token of KV read."""
        return cls(tuple(m_points), tuple(linear_s), prefill_s_per_work, decode_fixed_s, decode_s_per_kv_token,
                   overhead_s)

    def linear(self, m: int) -> float:
        """The forward time (s) at ``m`` tokens: log-log interpolation of the measured points."""
        ms, ts = self.m_points, self.linear_s
        if m <= ms[0]:
            return ts[0]
        if m >= ms[-1]:
            return ts[-1] * m / ms[-1]  # beyond the table: compute-bound, linear in M
        i = bisect.bisect_left(ms, m)  # the first point at or beyond m: m lies in (ms[i - 1], ms[i]]
        f = (math.log(m) - math.log(ms[i - 1])) / (math.log(ms[i]) - math.log(ms[i - 1]))
        return math.exp(math.log(ts[i - 1]) + f * (math.log(ts[i]) - math.log(ts[i - 1])))

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        """Seconds for a step of ``tokens`` tokens (prefill plus decode), ``prefill_ctx_work`` units of
        prefill attention work and ``decode_kv_tokens`` tokens of KV read by decoding requests; 0 for an
        empty step."""
        if tokens <= 0:
            return 0.0
        decode = self.decode_fixed_s + self.decode_s_per_kv_token * decode_kv_tokens if decode_kv_tokens else 0.0
        return self.overhead_s + self.linear(tokens) + self.prefill_s_per_work * prefill_ctx_work + decode


@dataclass(frozen=True)
class EngineCostModel:
    """Seconds per engine step (see the module)."""

    prefill: MeasuredCostModel  # S(M) and alpha (its decode terms: beta per KV token of a mixed step)
    decode_s: float
    decode_s_per_seq: float
    decode_s_per_kv_token: float
    graph_batch_sizes: tuple[int, ...]

    def padded(self, batch: int) -> int:
        """The batch size a decode step of ``batch`` requests runs at: the smallest captured graph's."""
        sizes = self.graph_batch_sizes
        i = bisect.bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) else batch

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        if prefill_ctx_work > 0 or decode_kv_tokens == 0:
            return self.prefill.step(tokens, prefill_ctx_work, decode_kv_tokens)
        return self.decode_s + self.decode_s_per_seq * self.padded(tokens) + self.decode_s_per_kv_token * decode_kv_tokens


def fit_prefill(stack: dict, context) -> tuple[float, list, list]:
    """The prefill half of a calibration (see the module): ``stack`` {M: seconds} of M new tokens alone,
    ``context`` (new, ctx, seconds) of new tokens after ctx cached ones. Returns (alpha, the M in
    increasing order, S(M) for each)."""
    alpha = max(0.0, statistics.median((t - stack[new]) / (work(new, ctx) - work(new, 0)) for new, ctx, t in context))
    ms = sorted(stack)
    return alpha, ms, [max(stack[m] - alpha * work(m, 0), 0.2 * stack[m]) for m in ms]


def fit(points: list[dict], graph_batch_sizes) -> EngineCostModel:
    """Fit the model to measured steps ({"kind", "new", "ctx", "B", "seconds"}; see the module)."""
    stack = {p["new"]: p["seconds"] for p in points if p["kind"] == "stack"}
    ctxp = [p for p in points if p["kind"] == "context"]
    dec = [p for p in points if p["kind"] == "decode"]
    if len(stack) < 2 or not ctxp or len({p["B"] for p in dec}) < 2:
        raise ValueError("the fit needs two stack points or more, a context point and decode points at two batch "
                         f"sizes or more; got {len(stack)}, {len(ctxp)} and {len({p['B'] for p in dec})}")
    missing = sorted({p["new"] for p in ctxp} - set(stack))
    if missing:
        raise ValueError(f"context points of {missing} new tokens have no stack point to compare with")
    alpha, ms, s = fit_prefill(stack, [(p["new"], p["ctx"], p["seconds"]) for p in ctxp])
    sizes = tuple(graph_batch_sizes)
    pad = EngineCostModel(MeasuredCostModel.fitted(ms, s, alpha, 0.0, 0.0), 0.0, 0.0, 0.0, sizes).padded
    A = np.array([[1.0, pad(p["B"]), p["B"] * p["ctx"]] for p in dec])
    y = np.array([p["seconds"] for p in dec])
    d0, d1, beta = (float(v) for v in least_squares.lstsq(A, y))
    d1, beta = max(d1, 0.0), max(beta, 0.0)
    return EngineCostModel(MeasuredCostModel.fitted(ms, s, alpha, 0.0, beta), max(d0, 0.0), d1, beta, sizes)


@dataclass(frozen=True)
class DetailedCostModel:
    """``base`` plus the terms token counts cannot carry (see the module): ``step`` is the base model's,
    ``step_detail`` adds gamma c to a decode-only step and eta (n - 1) to a step that prefills."""

    base: EngineCostModel
    gamma_s_per_ctx_token: float
    eta_s_per_prefill: float

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        return self.base.step(tokens, prefill_ctx_work, decode_kv_tokens)

    def step_detail(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int, *, prefills: int,
                    decode_ctx_max: int) -> float:
        t = self.base.step(tokens, prefill_ctx_work, decode_kv_tokens)
        if tokens <= 0:
            return t
        if prefills:
            return t + self.eta_s_per_prefill * (prefills - 1)
        return t + self.gamma_s_per_ctx_token * decode_ctx_max


def periods(run: list[dict]) -> list[dict]:
    """A run's steps, in order, each with its "period": from its start to the next step's start when requests
    were still running after it (the engine went straight on; the time between the two, handing tokens to
    the front end and taking new requests in, is part of what a step costs the timeline), else its own
    length (the engine then waited for arrivals)."""
    out = []
    for i, s in enumerate(run):
        busy = i + 1 < len(run) and s["running"] > 0
        out.append({**s, "period": (run[i + 1]["start"] if busy else s["end"]) - s["start"]})
    return out


def _relative(rows: list[dict], X) -> tuple[np.ndarray, np.ndarray]:
    """Each row of X divided by its step's period, against ones: least squares on the relative error."""
    t = np.array([s["period"] for s in rows], dtype=float)
    return np.asarray(X, dtype=float) / t[:, None], np.ones(len(rows))


def fit_steps(runs: list[list[dict]], graph_batch_sizes, *, detail: bool = False):
    """Fit the model to the step records of one or more runs (each a list of the engine's steps in order:
    "start", "end", "running", "prefill_tokens", "decode_tokens", "decode_kv", "prefill_work"; with
    ``detail``, "batch" and "decode_ctx_max" too), each step's time its period (``periods``; see the
    module). An ``EngineCostModel``, or with ``detail`` a ``DetailedCostModel``."""
    steps = [s for run in runs for s in periods(run)]
    pre = [s for s in steps if s["prefill_tokens"]]
    dec = [s for s in steps if not s["prefill_tokens"] and s["decode_tokens"]]
    if len(pre) < 4 or len({s["decode_tokens"] for s in dec}) < 2:
        raise ValueError(f"the fit needs 4 steps that prefill or more and decode-only steps at 2 batch sizes or more; "
                         f"got {len(pre)} and {len({s['decode_tokens'] for s in dec})}: record a longer run")
    sizes = tuple(graph_batch_sizes)
    pad = EngineCostModel(None, 0.0, 0.0, 0.0, sizes).padded
    if detail and not all("decode_ctx_max" in s and "batch" in s for s in steps):
        raise ValueError("a detailed fit needs each step's batch and decode_ctx_max: these records do not hold "
                         "them (measured before the engine recorded them); fit with detail=False")
    A, y = _relative(dec, [[1.0, pad(s["decode_tokens"]), s["decode_kv"] + s["decode_tokens"]]
                           + ([s["decode_ctx_max"]] if detail else []) for s in dec])
    d0, d1, beta, *gamma = (float(v) for v in least_squares.nonneg_lstsq(A, y))
    M = np.array([s["prefill_tokens"] + s["decode_tokens"] for s in pre], dtype=float)
    rest = np.array([[s["prefill_work"], s["decode_kv"] + s["decode_tokens"]]
                     + ([s["batch"] - s["decode_tokens"] - 1] if detail else []) for s in pre], dtype=float)
    best = None
    for knee in (2.0 ** (e / 4) for e in range(16, 65)):  # M* from 16 to 65,536 tokens, four per octave
        A, y = _relative(pre, np.column_stack([np.maximum(1.0, M / knee), rest]))
        x = least_squares.nonneg_lstsq(A, y)
        err = least_squares.residual(A, x, y)
        if best is None or err < best[0]:
            best = (err, float(knee), x)
    _, knee, (h, alpha, beta_p, *eta) = best
    ms = sorted({2 ** i for i in range(17)} | {knee})
    s_of_m = [max(h * max(1.0, m / knee), 1e-6) for m in ms]
    base = EngineCostModel(MeasuredCostModel.fitted(ms, s_of_m, float(alpha), 0.0, float(beta_p)), d0, d1, beta, sizes)
    return DetailedCostModel(base, gamma[0], float(eta[0])) if detail else base
