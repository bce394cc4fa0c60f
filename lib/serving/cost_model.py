"""What one engine step costs, in seconds: a model fitted to measured steps of one model on one GPU.

A step runs M tokens through the model (the prompt tokens it prefills plus one token per request it
decodes). Its time is

    step = overhead_s + linear(M) + prefill_s_per_work * W + [decode] (decode_fixed_s + decode_s_per_kv_token * K)

- ``linear(M)``: the forward pass at M tokens with no context, measured at ``m_points`` (``linear_s``) and
  interpolated between them on log-log axes (a straight line between neighbours in log M, log t); below
  the first point it is the first time (a small step is as slow as the weights' read), beyond the last
  it grows in proportion to M (compute-bound).
- W: the prefill's attention work, the sum over the prefilled chunks of new tokens x their mean context
  (a chunk of m tokens after c earlier ones: m (c + m / 2)).
- K: the tokens of KV the decoding requests read; the bracket is added only when the step decodes
  (K > 0): a fixed cost and a cost per KV token.
- ``overhead_s``: what every step pays besides (the scheduler, the launch of the step).

Chapter 6 fits the terms to measured steps (``lib.experiments.batching``) and simulates with the result.

Chapters: 6.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from numbers import Real


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
