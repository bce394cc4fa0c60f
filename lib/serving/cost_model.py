"""What one engine step costs: a model fitted to measured steps of one model on one GPU.

Chapters: 6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
