"""Serving metrics over simulated (or measured) requests: percentiles, TTFT, TPOT, E2E, tokens/s, goodput.

Each request is a dict as ``lib.serving.simulate`` returns it: "arrival", "ttft", "tpot", "e2e", "queue"
(seconds), "tokens" (output tokens) and "kind". Over a run:

- ``percentile``: the p-th percentile by linear interpolation between the two nearest ranks (numpy's
  default), NaNs left out;
- ``summary``: the P50, P95 and P99 of TTFT, TPOT, E2E and time queued, and the output tokens per second
  over the span of the run (first arrival to last finish, the same span for every kind);
- ``goodput``: the output tokens per second of the requests that met both SLOs (TTFT and TPOT; a request
  of one token has no TPOT and meets that SLO), over the same span.

Arguments are checked: a percentile outside [0, 100], an SLO that is not a positive number of seconds
(NaN included) and the goodput of no requests are errors, never a number.

Chapters: 6.
"""

from __future__ import annotations

import math
from numbers import Real


def _real(value) -> bool:
    """A real number (a bool is not one; NaN is, and fails every comparison after)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def percentile(xs, p: float) -> float:
    """The p-th percentile (0 to 100) of ``xs``: with the n values sorted, rank k = (n - 1) p / 100, and
    between the values at floor(k) and ceil(k) a straight line. NaN when ``xs`` has no number."""
    if not (_real(p) and 0 <= p <= 100):
        raise ValueError(f"p must be a percentile between 0 and 100, got {p!r}")
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
    """Output tokens per second of the requests (of ``kind``, or all) that met both SLOs (TTFT and TPOT,
    in seconds), over the span of the whole run: the throughput that counts for users. Of a run with no
    request there is no span: an error."""
    if not (_real(ttft_slo) and _real(tpot_slo) and ttft_slo > 0 and tpot_slo > 0):
        raise ValueError(f"SLOs must be positive seconds, got TTFT {ttft_slo!r} and TPOT {tpot_slo!r}")
    if not results:
        raise ValueError("goodput of no requests: a run's tokens/s needs its span, from the first arrival to the "
                         "last finish; simulate at least one request")
    span = _span(results)
    good = sum(r["tokens"] for r in results if (kind is None or r["kind"] == kind) and r["ttft"] <= ttft_slo
               and (math.isnan(r["tpot"]) or r["tpot"] <= tpot_slo))
    return good / span if span > 0 else math.nan


def summary(results: list[dict], kind: str | None = None) -> dict:
    """TTFT, TPOT, E2E and queue P50/P95/P99 (``ttft_p50`` ...) and output ``tokens_per_s``, over all
    requests or those of one kind ({} if there are none); ``requests`` counts them."""
    rs = [r for r in results if kind is None or r["kind"] == kind]
    if not rs:
        return {}
    span = _span(results)
    out = {"requests": len(rs), "tokens_per_s": sum(r["tokens"] for r in rs) / span if span > 0 else math.nan}
    for m in ("ttft", "tpot", "e2e", "queue"):
        for p in (50, 95, 99):
            out[f"{m}_p{p}"] = percentile([r[m] for r in rs], p)
    return out
