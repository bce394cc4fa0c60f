"""What one step of this engine costs, fitted to its own measured steps: the cost model chapter 6's
simulator needs to predict the engine.

The engine runs two kinds of step (``lib.engine.runner``), and they cost differently:

- a step that prefills (with or without decodes) is one eager forward pass of M tokens:
  t = S(M) + alpha W + beta K, with S(M) the pass at M tokens and no context (log-log interpolated between
  measured points, as ``lib.serving.MeasuredCostModel.linear``), W the prefill's attention work (new
  tokens x their mean context) and K the tokens of KV its decodes read;
- a step that only decodes replays a CUDA graph of the smallest captured batch size b >= B:
  t = d0 + d1 b + beta K.

Both include the engine's host work (a measured step is the engine's whole step, scheduling included).
The simulator (``lib.serving.simulate``) calls ``step(tokens, W, K)``: W > 0 means a prefill step (a chunk
of m >= 1 tokens after c has W = m (c + m / 2) > 0), W = 0 a decode-only step of B = tokens requests.

``fit`` takes measured steps: "stack" (M new tokens, no context), "context" (M new tokens after ``ctx``
cached ones) and "decode" (B requests of ``ctx`` tokens), each with its time in seconds: alpha is the
median over the context points of their extra time per unit of work, S(M) the stack's time less
alpha W, and (d0, d1, beta) a least-squares line through the decode points against (b, K).

Chapters: 8.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass

import numpy as np

from lib.bench import fit as least_squares
from lib.serving.cost_model import MeasuredCostModel


def work(new: int, ctx: int) -> float:
    """Attention work of ``new`` tokens after ``ctx``: new x their mean context, new (ctx + new / 2)."""
    return new * (ctx + new / 2)


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
    alpha = max(0.0, statistics.median((p["seconds"] - stack[p["new"]]) / (work(p["new"], p["ctx"]) - work(p["new"], 0))
                                       for p in ctxp))
    ms = sorted(stack)
    s = [max(stack[m] - alpha * work(m, 0), 0.2 * stack[m]) for m in ms]
    sizes = tuple(graph_batch_sizes)
    pad = EngineCostModel(MeasuredCostModel.fitted(ms, s, alpha, 0.0, 0.0), 0.0, 0.0, 0.0, sizes).padded
    A = np.array([[1.0, pad(p["B"]), p["B"] * p["ctx"]] for p in dec])
    y = np.array([p["seconds"] for p in dec])
    d0, d1, beta = (float(v) for v in least_squares.lstsq(A, y))
    d1, beta = max(d1, 0.0), max(beta, 0.0)
    return EngineCostModel(MeasuredCostModel.fitted(ms, s, alpha, 0.0, beta), max(d0, 0.0), d1, beta, sizes)
