"""What the engine measured, as a serving team reads it: latency percentiles, goodput, and Prometheus.

Per request (``Request.result``): TTFT, arrival to first token; TPOT, (last token - first token) /
(output tokens - 1); ITL, every gap between two consecutive tokens; E2E, arrival to last token; and the
stages of the latency decomposition, time queued, time in the steps that prefilled it, decode time.
``percentile`` interpolates linearly between the two nearest ranks (numpy's default), NaNs left out.
``request_summary`` gives the P50, P95 and P99 of TTFT, TPOT, E2E and time queued, and the output tokens
per second over the run's span (first arrival to last finish, the same span for every kind);
``summary`` adds what vLLM's serving benchmark reports besides: ITL over all gaps of all requests pooled,
and the mean of each. ``goodput`` counts only the tokens of requests that met both SLOs (TTFT and TPOT; a
request of one token has no TPOT and meets that SLO), over the same span. A percentile outside [0, 100],
an SLO that is not a positive number of seconds (NaN included) and the goodput of no requests are errors,
never a number. The simulator's results (``lib.simulator``) are the engine's, so all of these read both.
``decomposition`` splits each request's TTFT into its stages.

``PrometheusExporter`` keeps the minimum observability set in the Prometheus text format
(``prometheus_client``): histograms of TTFT, TPOT, ITL and E2E; gauges of requests running and waiting,
KV blocks in use and the batch of the last step; counters of prompt and generated tokens, requests
finished, rejected (by reason) and pre-empted, prefix-cache hit and query tokens, and the step's GPU and
host seconds. ``text()`` is the page a Prometheus server scrapes; ``serve(port)`` serves it over HTTP.
What describes the engine now (requests running and waiting, KV in use, rejects) is read from the engine
when the page is made, so it is right between steps too (after an abort, or a request refused since the
last step); what a step did (its batch, tokens, latencies) is recorded after each step.

Chapters: 6, 8.
"""

from __future__ import annotations

import math
from numbers import Real

# histogram bucket bounds (seconds): from a fast decode step to a long queue
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


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


def request_summary(results: list[dict], kind: str | None = None) -> dict:
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


def summary(results: list[dict], kind: str | None = None) -> dict:
    """``request_summary``, and ITL P50/P95/P99 over every gap pooled and the mean of TTFT, TPOT and E2E."""
    out = request_summary(results, kind)
    if not out:
        return out
    rs = [r for r in results if kind is None or r["kind"] == kind]
    gaps = [g for r in rs for g in r.get("itl", ())]
    for p in (50, 95, 99):
        out[f"itl_p{p}"] = percentile(gaps, p)
    for m in ("ttft", "tpot", "e2e"):
        vals = [r[m] for r in rs if not math.isnan(r[m])]
        out[f"{m}_mean"] = sum(vals) / len(vals) if vals else math.nan
    return out


def decomposition(results: list[dict], kind: str | None = None, q: float = 50) -> dict:
    """Where TTFT goes, at the ``q``-th percentile of each stage over the requests (of ``kind``): time queued
    (arrival to admission), in prefill steps (the steps that computed its prompt, up to its first token), and the rest before
    its first token (admitted, in steps that did not prefill it), with TTFT itself; seconds."""
    rs = [r for r in results if kind is None or r["kind"] == kind]
    if not rs:
        raise ValueError(f"no finished request of kind {kind!r} to decompose")
    other = [r["ttft"] - r["queue"] - r["prefill"] for r in rs]
    return {"queue": percentile([r["queue"] for r in rs], q),
            "prefill": percentile([r["prefill"] for r in rs], q),
            "other": percentile(other, q), "ttft": percentile([r["ttft"] for r in rs], q)}


# The page: (attribute, type, name after the prefix, help, histogram buckets or label name). The names are
# vLLM's where it has one. "scraped" metrics are read from the engine when the page is made (what describes
# the engine now); the others are set after each step (what a step did).
PAGE = (
    ("ttft", "histogram", "time_to_first_token_seconds", "Arrival to first token", TTFT_BUCKETS),
    ("tpot", "histogram", "time_per_output_token_seconds", "Mean gap between tokens after the first, per request",
     TPOT_BUCKETS),
    ("itl", "histogram", "inter_token_latency_seconds", "Every gap between two tokens of a request", TPOT_BUCKETS),
    ("e2e", "histogram", "e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS),
    ("queue_time", "histogram", "request_queue_time_seconds", "Arrival to first admission", TTFT_BUCKETS),
    ("running", "scraped gauge", "num_requests_running", "Requests in the running batch", None),
    ("waiting", "scraped gauge", "num_requests_waiting",
     "Requests waiting for admission (queued, or added since the last step)", None),
    ("kv_usage", "scraped gauge", "kv_cache_usage_perc", "KV blocks held by requests, over the usable blocks", None),
    ("batch", "gauge", "step_batch_size", "Requests in the last step (prefill and decode)", None),
    ("prompt_tokens", "counter", "prompt_tokens", "Prompt tokens prefilled", None),
    ("generation_tokens", "counter", "generation_tokens", "Tokens generated", None),
    ("success", "counter", "request_success", "Requests finished", "finish_reason"),
    ("rejects", "scraped counter", "request_rejects", "Requests turned away", "reason"),
    ("preemptions", "counter", "num_preemptions", "Requests pre-empted (KV dropped, recomputed)", None),
    ("hits", "counter", "prefix_cache_hits", "Prompt tokens found in the prefix cache", None),
    ("queries", "counter", "prefix_cache_queries", "Prompt tokens looked up in the prefix cache", None),
    ("gpu_seconds", "counter", "step_gpu_seconds", "GPU time of the steps", None),
    ("host_seconds", "counter", "step_host_seconds", "Host time of the steps", None),
)


class _Scraped:
    """A metric read from the engine each time the page is made, rather than set by the steps: ``read()``
    gives its value, or with ``label`` a {label value: value} dict. ``kind`` "gauge" or "counter" (a counter's
    reading must only grow, as ``LLMEngine.rejects`` does)."""

    def __init__(self, registry, kind: str, name: str, doc: str, read, label: str | None = None):
        if kind not in ("gauge", "counter"):
            raise ValueError(f"a scraped metric is a 'gauge' or a 'counter', got {kind!r}")
        self.kind, self.name, self.doc, self.read, self.label = kind, name, doc, read, label
        registry.register(self)

    def _family(self, samples):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        if self.label is None:
            return cls(self.name, self.doc) if samples is None else cls(self.name, self.doc, value=samples)
        family = cls(self.name, self.doc, labels=[self.label])
        for key, value in sorted((samples or {}).items()):
            family.add_metric([key], value)
        return family

    def collect(self):
        return [self._family(self.read())]

    def describe(self):
        return [self._family(None)]


class PrometheusExporter:
    """The engine's metrics for Prometheus (see the module and ``PAGE``): the engine's state read at each
    scrape, each step's work recorded after every step of ``engine``."""

    def __init__(self, engine, *, registry=None, prefix: str = "engine"):
        import prometheus_client as pc

        self.engine = engine
        self.registry = registry if registry is not None else pc.CollectorRegistry()
        for attr, kind, name, doc, extra in PAGE:
            full = f"{prefix}_{name}"
            if kind.startswith("scraped "):
                metric = _Scraped(self.registry, kind.split()[1], full, doc, getattr(self, f"_{attr}"), extra)
            elif kind == "histogram":
                metric = pc.Histogram(full, doc, registry=self.registry, buckets=extra)
            else:
                make = pc.Counter if kind == "counter" else pc.Gauge
                metric = make(full, doc, [extra] if extra else (), registry=self.registry)
            setattr(self, attr, metric)
        engine.on_step(self.observe)

    # what describes the engine now, read at each scrape
    def _running(self) -> int:
        return len(self.engine.scheduler.running)

    def _waiting(self) -> int:
        e = self.engine
        return max(0, e.unfinished - len(e.scheduler.running))

    def _kv_usage(self) -> float:
        e = self.engine
        return e.kv_blocks_in_use / e.usable_blocks if e.usable_blocks else 0.0

    def _rejects(self) -> dict:
        return dict(self.engine.rejects)

    def observe(self, record: dict, finished) -> None:
        """Update the metrics with one step's record and the requests it finished."""
        self.batch.set(record["batch"])
        self.prompt_tokens.inc(record["prefill_tokens"])
        self.generation_tokens.inc(len(record["yielded"]))
        self.preemptions.inc(len(record["preempted"]))
        self.hits.inc(record["prefix_hit_tokens"])
        self.queries.inc(record["prefix_query_tokens"])
        if not math.isnan(record["gpu_s"]):
            self.gpu_seconds.inc(record["gpu_s"])
        self.host_seconds.inc(max(0.0, record["host_s"]))
        for x in finished:
            r = x.result()
            self.success.labels(finish_reason=r["finish_reason"]).inc()
            self.ttft.observe(r["ttft"])
            self.e2e.observe(r["e2e"])
            self.queue_time.observe(r["queue"])
            if not math.isnan(r["tpot"]):
                self.tpot.observe(r["tpot"])
            for g in r["itl"]:
                self.itl.observe(g)

    def text(self) -> str:
        """The metrics page in the Prometheus text format."""
        import prometheus_client as pc

        return pc.generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Serve ``text()`` at http://addr:port/metrics (a thread); returns (server, thread)."""
        import prometheus_client as pc

        return pc.start_http_server(port, addr=addr, registry=self.registry)
