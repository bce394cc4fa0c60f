"""Serving metrics over simulated (or measured) requests: percentiles, TTFT, TPOT, E2E, tokens/s, goodput.

Chapters: 6.
"""

from __future__ import annotations

import math


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
