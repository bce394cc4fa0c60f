"""Chapter 6's experiment: what one engine step costs on the GPU, a cost model fitted to it, and the
batching policies simulated with that cost model.

Measuring (``measure``): chapter 5's Llama-style model (``lib.models``) with a paged KV pool filled with
random values is timed (``lib.bench.timing.bench``: GPU time and call time) in three kinds of step:

- stack: a prefill of M tokens with no earlier context, for each M of ``stack``;
- context: a prefill of ``new`` tokens after ``ctx`` tokens already in the pool, for each pair;
- decode: one decode step of B requests of L tokens of context each, for each (B, L) with B L at most
  ``max_kv_tokens``.

The timed calls are the notebook's ``prefill`` and ``decode`` paths. Before a path is timed its output is
checked against the model's other path, which computes the same logits another way: the last logits of a
prefill against a decode step of the last token over the same pool (the paged decode-attention kernel), and
a decode step's logits for its first and last request against a one-token prefill at that request's last
position (attention over the pages gathered whole), within ``lib.models.LOGITS_TOLERANCE`` of the largest logit.

Fitting (``fit_cost_model``): a step that prefills M tokens whose attention work is
W = sum(new tokens x their mean context) and decodes requests reading K tokens of KV costs
t = S(M) + alpha W + [decode] (delta + beta K) (``lib.engine.cost.MeasuredCostModel``): alpha and S(M) as
every calibration fits them (``lib.engine.cost.fit_prefill``: alpha the median over the context points of
their extra time per unit of work, S(M) the stack's time less alpha W, log-log interpolated), beta the
median slope of a line per batch size through the decode times against K, delta the median of those lines'
intercepts less S(B).

Simulating (``capacity_rps``, ``load_sweep``, ``incident``, ``offline``): ``lib.simulator.simulate`` runs seeded
workloads (``lib.workloads.requests``) through the fitted cost model under each policy. A policy's capacity is
its output tokens/s with every request queued at once over the mean output of a request; ``load_sweep`` runs
every policy at the same arrival rates and states each rate as a load on that policy's own capacity, so a
policy run at or above its capacity (load >= 1) is marked saturated rather than compared as if it kept up. Every simulation's
size is a number of requests given by the caller, never derived from a measured cost, so a smoke run's
arbitrary CPU costs cannot make it long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from lib import models, simulator, workloads
from lib.bench import fit, timing
from lib.engine.cost import fit_prefill, work
from lib.experiments import require

# largest |logit difference| a checked path may show against the other way of computing the same logits, as a
# fraction of the largest |logit|, by dtype and device: float32 agrees to rounding on the CPU, while on a GPU
# Triton's dots of float32 run in TF32 (10 bits of mantissa); bf16 keeps 7 bits of mantissa everywhere
PARAM_KEYS = ("config", "dtype", "block", "seed", "reps", "target_ms", "stack", "context", "decode")


def sweep(size: str) -> dict:
    """The parameters of a run: "full" (the 1B model in bf16 on a GPU) or "smoke" (the tiny model in float32,
    seconds on a CPU)."""
    if size == "full":
        return {"config": "1b", "dtype": "bfloat16", "block": 16, "seed": 0, "reps": 5, "target_ms": 1.0,
                "stack": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
                "context": {"new": [256, 1024, 4096], "ctx": [4096, 16384]},
                "decode": {"B": [1, 4, 16, 64, 256], "ctx": [128, 1024, 4096, 16384], "max_kv_tokens": 524288}}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "block": 4, "seed": 0, "reps": 2, "target_ms": 0.2,
                "stack": [4, 8, 16, 32], "context": {"new": [4, 8], "ctx": [16]},
                "decode": {"B": [1, 4], "ctx": [8, 32], "max_kv_tokens": 1024}}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def check_params(p: dict) -> None:
    """Reject parameters ``measure`` cannot run, saying which and why."""
    require(p, PARAM_KEYS)
    models.config_for(p["config"], p["dtype"])
    sizes = {"stack": p["stack"], "context new": p["context"]["new"], "context ctx": p["context"]["ctx"],
             "decode B": p["decode"]["B"], "decode ctx": p["decode"]["ctx"]}
    bad = {k: v for k, v in sizes.items() if not v or any(not (isinstance(x, int) and x >= 1) for x in v)}
    if bad:
        raise ValueError(f"every size list must hold positive ints, got {bad}")
    if len(p["stack"]) < 2 or sorted(p["stack"]) != p["stack"] or len(set(p["stack"])) < len(p["stack"]):
        raise ValueError(f"stack must hold at least two increasing M (the cost model interpolates), got {p['stack']}")
    if not set(p["context"]["new"]) <= set(p["stack"]):
        raise ValueError(f"every context point's new tokens {p['context']['new']} must also be a stack M "
                         f"{p['stack']}: the fit compares the two")


def measure(params: dict, device: str, *, prefill, decode) -> dict:
    """Time the steps of the sweep (see the module) on ``device`` ("cuda" or "cpu") through the paths

    - ``prefill(m, pool, tokens, blocks, cached)``: the last token's logits [1, vocab] of a prefill of
      ``tokens`` after ``cached`` tokens already in the pool;
    - ``decode(m, pool, tokens, table, lens)``: logits [B, vocab] of one decode step of B requests.

    Returns {"points": [{"kind", "new", "ctx", "timing"}, ...], "params_count"}."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    check_params(params)
    p, dev = params, device
    torch.manual_seed(p["seed"])
    cfg = models.CONFIGS[p["config"]]
    m = models.Llama.random(cfg, seed=p["seed"], dtype=getattr(torch, p["dtype"]), device=dev)
    bs = p["block"]
    longest = max(max(p["stack"]), max(p["context"]["new"]) + max(p["context"]["ctx"]))
    blocks_needed = max(longest // bs + 1, p["decode"]["max_kv_tokens"] // bs + max(p["decode"]["B"]))
    pool = m.new_pool(blocks_needed, bs)
    pool.k.normal_()
    pool.v.normal_()
    all_blocks = torch.arange(blocks_needed, device=dev)

    def bench(fn):
        return timing.bench([fn], device=dev, reps=p["reps"], warmup=1, target_ms=p["target_ms"]).to_dict()

    def checked_prefill(toks, c):
        """The prefill path's last logits against a decode step of the last token over the pool it filled."""
        n = len(toks)
        got = prefill(m, pool, toks, all_blocks, c)  # writes the K and V of positions c .. n - 1
        table = all_blocks[: -(-n // bs)].to(torch.int32)[None, :]
        expected = m.decode(toks[-1:], pool, table, torch.tensor([n], dtype=torch.int32, device=dev))
        models.check_logits(f"prefill of {n - c} tokens after {c}", got, expected, p["dtype"], dev)

    rows = []
    for M in p["stack"]:
        toks = torch.randint(0, cfg.vocab, (M,), device=dev)
        checked_prefill(toks, 0)
        rows.append({"kind": "stack", "new": M, "ctx": 0,
                     "timing": bench(lambda toks=toks: prefill(m, pool, toks, all_blocks, 0))})
    for c in p["context"]["ctx"]:
        for new in p["context"]["new"]:
            toks = torch.randint(0, cfg.vocab, (c + new,), device=dev)
            checked_prefill(toks, c)
            rows.append({"kind": "context", "new": new, "ctx": c,
                         "timing": bench(lambda toks=toks, c=c: prefill(m, pool, toks, all_blocks, c))})
    print("prefill done", flush=True)
    for B in p["decode"]["B"]:
        for L in p["decode"]["ctx"]:
            if B * L > p["decode"]["max_kv_tokens"]:
                continue
            pages = -(-L // bs)
            table = torch.arange(B * pages, device=dev, dtype=torch.int32).view(B, pages)
            lens = torch.full((B,), L, device=dev, dtype=torch.int32)
            toks = torch.randint(0, cfg.vocab, (B,), device=dev)
            out = decode(m, pool, toks, table, lens)
            for b in sorted({0, B - 1}):  # the first and the last request: a one-token prefill at position L - 1
                expected = m.prefill(toks[b].repeat(L), pool, table[b].long(), L - 1, last_only=True)
                models.check_logits(f"decode step of {B} requests of {L} tokens, request {b}", out[b : b + 1], expected,
                             p["dtype"], dev)
            rows.append({"kind": "decode", "new": B, "ctx": L, "timing": bench(
                lambda toks=toks, table=table, lens=lens: decode(m, pool, toks, table, lens))})
    return {"points": rows, "params_count": cfg.params()}


# ---------------------------------------------------------------------------- the cost model

@dataclass
class Calibration:
    """The fitted cost model and what it was fitted from.

    ``points``: one row per measured step (kind, new, ctx, GPU time (ms), call time (ms), spread, model (ms),
    model / measured); ``lines``: per decode batch size B, the intercept (ms) and slope (ns per KV token) of
    its line; ``alpha`` (s per unit of attention work), ``beta`` (s per KV token read), ``delta`` (s, a decode
    step's fixed cost); ``stack_s``: the stack's measured time (s) at each M; ``fit_err``: |model / measured - 1|
    per point."""

    points: pd.DataFrame
    lines: pd.DataFrame
    stack_s: pd.Series
    alpha: float
    beta: float
    delta: float
    cost: simulator.MeasuredCostModel
    fit_err: pd.Series


def points_frame(points: list[dict]) -> pd.DataFrame:
    """The measured steps as a table: GPU and call time (ms, medians) and the GPU time's spread (IQR / median)."""
    pts = pd.DataFrame(points)
    pts["GPU time (ms)"] = [t["gpu_us"]["median"] / 1e3 for t in pts["timing"]]
    pts["call time (ms)"] = [t["call_us"]["median"] / 1e3 for t in pts["timing"]]
    pts["spread"] = [(t["gpu_us"]["q3"] - t["gpu_us"]["q1"]) / t["gpu_us"]["median"] for t in pts["timing"]]
    return pts


def fit_cost_model(points: list[dict]) -> Calibration:
    """Fit t = S(M) + alpha W + [decode] (delta + beta K) to the measured steps (see the module)."""
    pts = points_frame(points)
    kinds = set(pts["kind"])
    if not {"stack", "context", "decode"} <= kinds:
        raise ValueError(f"the fit needs stack, context and decode points, got {sorted(kinds)}")
    stack = pts[pts["kind"] == "stack"].set_index("new")["GPU time (ms)"] / 1e3
    ctxp = pts[pts["kind"] == "context"]
    dec = pts[pts["kind"] == "decode"]
    # alpha and S(M): the prefill half every calibration shares (lib.engine.cost.fit_prefill)
    alpha, ms, s_of_m = fit_prefill(stack.to_dict(), [(r["new"], r["ctx"], r["GPU time (ms)"] / 1e3)
                                                     for _, r in ctxp.iterrows()])
    S = dict(zip(ms, s_of_m))
    # decode: per batch size a line through (K, t); delta = intercept minus S(B), beta = the slopes' median
    lines = []
    for B, g in dec.groupby("new"):
        K = (g["new"] * g["ctx"]).tolist()
        a0, b1 = fit.fit_line(K, (g["GPU time (ms)"] / 1e3).tolist()) if len(g) > 1 else (g["GPU time (ms)"].iloc[0] / 1e3, 0.0)
        lines.append({"B": B, "intercept (ms)": a0 * 1e3, "slope (ns per KV token)": b1 * 1e9})
    lines = pd.DataFrame(lines).set_index("B")
    beta = max(0.0, float(lines["slope (ns per KV token)"].median()) / 1e9)
    ms = sorted(S)
    cost = simulator.MeasuredCostModel.fitted(ms, [S[M] for M in ms], prefill_s_per_work=alpha, decode_fixed_s=0.0,
                                            decode_s_per_kv_token=beta)
    delta = max(0.0, float(pd.Series([lines.loc[B, "intercept (ms)"] / 1e3 - cost.linear(B) for B in lines.index]).median()))
    cost = simulator.MeasuredCostModel.fitted(ms, [S[M] for M in ms], prefill_s_per_work=alpha, decode_fixed_s=delta,
                                            decode_s_per_kv_token=beta)

    def predict(r):
        if r["kind"] == "decode":
            return cost.step(r["new"], 0.0, r["new"] * r["ctx"])
        return cost.step(r["new"], work(r["new"], r["ctx"]), 0)

    pts["model (ms)"] = [predict(r) * 1e3 for _, r in pts.iterrows()]
    pts["model / measured"] = pts["model (ms)"] / pts["GPU time (ms)"]
    fit_err = (pts["model / measured"] - 1).abs()
    return Calibration(pts, lines, stack, alpha, beta, delta, cost, fit_err)


# ---------------------------------------------------------------------------- simulations

def _count(name: str, n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be a positive int (requests per simulation), got {n!r}")
    return n


def saturated(cost, policy, mix, n: int, seed: int = 0) -> float:
    """Output tokens per second with all ``n`` requests queued at once: what a throughput benchmark reports."""
    reqs = workloads.requests(_count("n", n), 1e6, mix=mix, seed=seed)
    return simulator.summary(simulator.simulate(reqs, cost, policy))["tokens_per_s"]


def at_rate(cost, policy, rate: float, mix, n: int, seed: int = 0) -> tuple[list[dict], dict]:
    """``n`` requests of ``mix`` arriving at ``rate`` per second: the simulated requests, and their summaries
    {"all": ..., kind: ... for each kind of the mix} (``lib.simulator.summary``)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate!r}")
    res = simulator.simulate(workloads.requests(_count("n", n), rate, mix=mix, seed=seed), cost, policy)
    return res, {"all": simulator.summary(res), **{kind: simulator.summary(res, kind) for kind, _, _ in mix}}


def capacity_rps(cost, policy, mix, n_saturated: int, n: int) -> float:
    """Requests per second the policy sustains: its saturated tokens/s over the mean output of ``n`` requests."""
    mean_output = sum(r["output"] for r in workloads.requests(_count("n", n), 1.0, mix=mix)) / n
    return saturated(cost, policy, mix, n_saturated) / mean_output


def capacities(cost, policies: dict, mix, n_saturated: int, n: int) -> dict:
    """Each policy's own capacity (``capacity_rps``), by name: the rate above which its queue grows without
    bound."""
    return {name: capacity_rps(cost, pol, mix, n_saturated, n) for name, pol in policies.items()}


def load_sweep(cost, policies: dict, rates, capacities: dict, mix, n: int) -> pd.DataFrame:
    """Each policy at each arrival rate (requests/s, the same rates for every policy): the load against the
    policy's own capacity, whether it is saturated (load >= 1: arrivals outpace what it can serve, so its
    queue, and with it TTFT, grows with the length of the run), tokens/s and TTFT, TPOT, E2E percentiles,
    indexed by (rate, policy)."""
    missing = set(policies) - set(capacities)
    if missing:
        raise ValueError(f"every policy needs its own capacity (requests/s); none given for {sorted(missing)}")
    rows = []
    for rate in rates:
        for name, pol in policies.items():
            _, s = at_rate(cost, pol, rate, mix, n)
            s_all = s["all"]
            load = rate / capacities[name]
            rows.append({"rate (requests/s)": rate, "policy": name, "load": load, "saturated": load >= 1,
                         "tokens/s": s_all["tokens_per_s"],
                         "TTFT p50 (ms)": s_all["ttft_p50"] * 1e3, "TTFT p99 (ms)": s_all["ttft_p99"] * 1e3,
                         "TPOT p50 (ms)": s_all["tpot_p50"] * 1e3, "TPOT p99 (ms)": s_all["tpot_p99"] * 1e3,
                         "E2E p99 (s)": s_all["e2e_p99"]})
    return pd.DataFrame(rows).set_index(["rate (requests/s)", "policy"])


def running_over_time(results: list[dict], bins: int) -> tuple[list[float], list[int]]:
    """Requests running (admitted, not finished) at ``bins`` evenly spaced times from 0 to the last finish."""
    if not results or bins < 1:
        raise ValueError(f"need simulated requests and at least one bin, got {len(results)} and {bins}")
    span = max(r["arrival"] + r["e2e"] for r in results)
    edges = [span * i / bins for i in range(bins)]
    return edges, [sum(1 for r in results if r["arrival"] + r["queue"] <= t < r["arrival"] + r["e2e"]) for t in edges]


def incident(cost, configs: dict, rate: float, mix, n: int, n_saturated: int, slo_ttft: float,
             slo_tpot: float) -> tuple[pd.DataFrame, dict]:
    """Each configuration at ``rate`` requests/s of ``mix`` (a "chat" and a "doc" kind): benchmark (saturated),
    production, per-kind and goodput tokens/s, and chat and doc TTFT and TPOT percentiles, indexed by config;
    and each configuration's simulated requests as a DataFrame."""
    kinds = {kind for kind, _, _ in mix}
    if not {"chat", "doc"} <= kinds:
        raise ValueError(f"the incident compares chat and doc requests; the mix has {sorted(kinds)}")
    rows, per_config = [], {}
    for name, pol in configs.items():
        r_, s = at_rate(cost, pol, rate, mix, n)
        s_all, s_chat, s_doc = s["all"], s["chat"], s["doc"]
        per_config[name] = pd.DataFrame(r_)
        rows.append({"config": name, "benchmark tokens/s": saturated(cost, pol, mix, n_saturated),
                     "production tokens/s": s_all["tokens_per_s"],
                     "chat tokens/s": s_chat["tokens_per_s"], "doc tokens/s": s_doc["tokens_per_s"],
                     "goodput tokens/s": simulator.goodput(r_, slo_ttft, slo_tpot),
                     "chat TTFT p50 (ms)": s_chat["ttft_p50"] * 1e3, "chat TTFT p95 (ms)": s_chat["ttft_p95"] * 1e3,
                     "chat TTFT p99 (ms)": s_chat["ttft_p99"] * 1e3, "doc TTFT p95 (ms)": s_doc["ttft_p95"] * 1e3,
                     "chat TPOT p95 (ms)": s_chat["tpot_p95"] * 1e3, "doc TPOT p95 (ms)": s_doc["tpot_p95"] * 1e3})
    return pd.DataFrame(rows).set_index("config"), per_config


def breakdown(per_config: dict) -> pd.DataFrame:
    """Where the slowest 5% of chats (by TTFT) spent their time before the first token, against all chats."""
    rows = []
    for name, d in per_config.items():
        chat = d[d["kind"] == "chat"]
        slow = chat[chat["ttft"] >= chat["ttft"].quantile(0.95)]
        rows.append({"config": name, "chat TTFT p95 (ms)": chat["ttft"].quantile(0.95) * 1e3,
                     "slowest 5%: queued (ms)": slow["queue"].mean() * 1e3,
                     "slowest 5%: in prefill steps (ms)": slow["prefill"].mean() * 1e3,
                     "all chats: queued (ms)": chat["queue"].mean() * 1e3,
                     "all chats: in prefill steps (ms)": chat["prefill"].mean() * 1e3})
    return pd.DataFrame(rows).set_index("config")


def offline(cost, policies: dict, mix, n: int) -> pd.DataFrame:
    """Each policy with all ``n`` requests queued at once: tokens/s, the time to finish them all, TTFT p50."""
    rows = []
    for name, pol in policies.items():
        r_ = simulator.simulate(workloads.requests(_count("n", n), 1e6, mix=mix, seed=0), cost, pol)
        s_ = simulator.summary(r_)
        rows.append({"policy": name, "tokens/s": s_["tokens_per_s"],
                     "all done (s)": max(r["arrival"] + r["e2e"] for r in r_), "TTFT p50 (s)": s_["ttft_p50"]})
    return pd.DataFrame(rows).set_index("policy")


# ---------------------------------------------------------------------------- the page

def incident_ratios(incident: pd.DataFrame) -> dict:
    """The incident's ratios, from ``incident``'s table: the benchmark tokens/s gain of "after" over "before"
    ("gain"), chat TTFT P95 after / before ("ttft_ratio") and fix / before ("fix_ratio"), and the share of
    the benchmark gain the fix keeps ("kept")."""
    bench, p95 = incident["benchmark tokens/s"], incident["chat TTFT p95 (ms)"]
    return {"gain": bench["after"] / bench["before"] - 1,
            "ttft_ratio": p95["after"] / p95["before"],
            "fix_ratio": p95["fix"] / p95["before"],
            "kept": (bench["fix"] - bench["before"]) / (bench["after"] - bench["before"])}


def incident_targets(incident: pd.DataFrame) -> pd.DataFrame:
    """The chapter's targets for the incident and its fix (``incident_ratios``): target, measured, goal, met."""
    r = incident_ratios(incident)
    gain, ttft_ratio, fix_ratio, kept = r["gain"], r["ttft_ratio"], r["fix_ratio"], r["kept"]
    return pd.DataFrame([
        {"target": "incident: tokens/s gain", "measured": gain, "goal": "0.15 to 0.30", "met": 0.15 <= gain <= 0.30},
        {"target": "incident: chat TTFT P95, after / before", "measured": ttft_ratio, "goal": ">= 1.5",
         "met": ttft_ratio >= 1.5},
        {"target": "fix: chat TTFT P95, fix / before", "measured": fix_ratio, "goal": "<= 1.2", "met": fix_ratio <= 1.2},
        {"target": "fix: share of the throughput gain kept", "measured": kept, "goal": ">= 0.9", "met": kept >= 0.9},
    ])


def load_analysis(load_table: pd.DataFrame, caps: dict, mean_output: float, batch_limit: int,
                  n: int) -> pd.DataFrame:
    """``load_sweep``'s table with (rate, policy) as columns and what queueing theory expects beside it: the
    policy's capacity in tokens/s (its requests/s times ``mean_output``); static batching's fill wait below
    capacity, (B - 1) / (2 rate) for batches of B = ``batch_limit``; and, saturated (load = rho >= 1), the
    wait of the last of ``n`` arrivals, n (1 - 1 / rho) / capacity, since the queue grows at rate - capacity."""
    lt = load_table.reset_index()
    lt["capacity tokens/s"] = [caps[p] * mean_output for p in lt["policy"]]
    lt["fill wait (ms)"] = (batch_limit - 1) / (2 * lt["rate (requests/s)"]) * 1e3
    lt["queue wait (s)"] = [n * (1 - 1 / r["load"]) / caps[r["policy"]] if r["saturated"] else float("nan")
                            for _, r in lt.iterrows()]
    return lt


# the worked incident's numbers, as the source gives them, beside the simulated ones
WORKED = {"tps_gain": 0.22, "ttft_p95_before_s": 1.1, "ttft_p95_after_s": 2.0}


def page(res, cal: Calibration, lt: pd.DataFrame, incident: pd.DataFrame, breakdown: pd.DataFrame,
         offline: pd.DataFrame, few_ttft_ms: dict, knobs: dict):
    """Every number, word and table chapter 6's page quotes, by name: from the results ``res`` (provenance,
    date, the model's parameter count), the calibration ``cal``, ``load_analysis``'s table ``lt``, the
    ``incident`` and ``breakdown`` tables, the ``offline`` table, the largest TTFT (ms) of each policy in the
    eight-request example ``few_ttft_ms``, and the simulations' ``knobs``: caps (each policy's capacity,
    requests/s), capacity_rps (the incident's engine), prod_rate, batch_limit, kv_budget_tokens,
    load_requests, window_s, slo_ttft_s, slo_tpot_s, mean_output; a ``Page`` (``lib.bench.page``)."""
    from lib.bench.page import Page

    pts, fit_err, stack, k = cal.points, cal.fit_err, cal.stack_s, knobs
    caps, B_MAX, mean_output, window = k["caps"], k["batch_limit"], k["mean_output"], k["window_s"]
    worst = pts.loc[fit_err.idxmax()]
    worst_point = (f"decode step of {worst['new']} request(s) over {worst['ctx']} tokens of context"
                   if worst["kind"] == "decode" else f"prefill of {worst['new']} tokens after {worst['ctx']} cached tokens")
    d1 = pts[(pts["kind"] == "decode") & (pts["new"] == 1)]
    by_rate = {rate: g.set_index("policy") for rate, g in lt.groupby("rate (requests/s)")}
    lo, hi = by_rate[min(by_rate)], by_rate[max(by_rate)]
    # the highest rate at which static batching is still below capacity (the lowest if it never is)
    ok = by_rate[max((r for r, g in by_rate.items() if not g.loc["static", "saturated"]), default=min(by_rate))]
    shown_table = lt.assign(**{"rate (requests/s)": lt["rate (requests/s)"].round(1), "saturated": lt["saturated"].map(
        {True: "yes", False: "no"})})[["rate (requests/s)", "policy", "load", "saturated", "tokens/s", "TTFT p50 (ms)",
                                       "TTFT p99 (ms)", "TPOT p99 (ms)"]]
    inc, slow = incident, breakdown
    incident_scale = WORKED["ttft_p95_before_s"] * 1e3 / inc.loc["before", "chat TTFT p95 (ms)"]
    r, targets = incident_ratios(inc), incident_targets(inc)
    long_i = (stack.index.to_series() - 8192).abs().argmin()  # the stack point nearest a prompt of 8192 tokens
    numbers = {
        "params_billion": res.data["params_count"] / 1e9,
        "alpha_ps": cal.alpha * 1e12,
        "beta_ns": cal.beta * 1e9,
        "delta_ms": cal.delta * 1e3,
        "fit_err_max": fit_err.max(),
        "fit_err_median": fit_err.median(),
        "worst_new": worst["new"],
        "worst_ctx": worst["ctx"],
        "worst_ratio": worst["model / measured"],
        "decode_b1_ratio_max": d1["model / measured"].max(),
        "decode_b1_ms": d1["GPU time (ms)"].min(),
        "decode_call_ms": pts[pts["kind"] == "decode"]["call time (ms)"].median(),
        "stack_1_ms": stack.iloc[0] * 1e3,
        "stack_max_ms": stack.iloc[-1] * 1e3,
        "stack_max_M": stack.index[-1],
        "capacity_rps": k["capacity_rps"],
        "prod_rate": k["prod_rate"],
        "incident_tps_gain": r["gain"],
        "incident_ttft_p95_ratio": r["ttft_ratio"],
        "fix_ttft_p95_ratio": r["fix_ratio"],
        "fix_tps_kept": r["kept"],
        "chat_ttft_p95_before_ms": inc.loc["before", "chat TTFT p95 (ms)"],
        "chat_ttft_p95_after_ms": inc.loc["after", "chat TTFT p95 (ms)"],
        "chat_ttft_p95_fix_ms": inc.loc["fix", "chat TTFT p95 (ms)"],
        "bench_tps_before": inc.loc["before", "benchmark tokens/s"],
        "bench_tps_after": inc.loc["after", "benchmark tokens/s"],
        "bench_tps_fix": inc.loc["fix", "benchmark tokens/s"],
        "prod_tps_before": inc.loc["before", "production tokens/s"],
        "prod_tps_after": inc.loc["after", "production tokens/s"],
        "prod_tps_fix": inc.loc["fix", "production tokens/s"],
        "goodput_before": inc.loc["before", "goodput tokens/s"],
        "goodput_after": inc.loc["after", "goodput tokens/s"],
        "goodput_fix": inc.loc["fix", "goodput tokens/s"],
        "slow_queue_after_ms": slow.loc["after", "slowest 5%: queued (ms)"],
        "slow_prefill_after_ms": slow.loc["after", "slowest 5%: in prefill steps (ms)"],
        "slow_queue_before_ms": slow.loc["before", "slowest 5%: queued (ms)"],
        "slow_prefill_before_ms": slow.loc["before", "slowest 5%: in prefill steps (ms)"],
        "static_ttft_p99_hi_ms": hi.loc["static", "TTFT p99 (ms)"],
        "dynamic_ttft_p99_hi_ms": hi.loc["dynamic", "TTFT p99 (ms)"],
        "cont_ttft_p99_hi_ms": hi.loc["continuous", "TTFT p99 (ms)"],
        "batch_limit": B_MAX,
        "kv_budget_tokens": k["kv_budget_tokens"],
        "cap_static_rps": caps["static"],
        "cap_dynamic_rps": caps["dynamic"],
        "cap_cont_rps": caps["continuous"],
        "cap_static_tps": caps["static"] * mean_output,
        "rate_lo": lo["rate (requests/s)"].iloc[0],
        "rate_ok": ok["rate (requests/s)"].iloc[0],
        "rate_hi": hi["rate (requests/s)"].iloc[0],
        "static_load_ok": ok.loc["static", "load"],
        "static_load_hi": hi.loc["static", "load"],
        "static_load_min_saturated": lt[lt["saturated"] & (lt["policy"] == "static")]["load"].min(),
        "cont_load_hi": hi.loc["continuous", "load"],
        "static_tps_hi": hi.loc["static", "tokens/s"],
        "cont_tps_hi": hi.loc["continuous", "tokens/s"],
        "static_ttft_p50_lo_ms": lo.loc["static", "TTFT p50 (ms)"],
        "static_ttft_p50_ok_ms": ok.loc["static", "TTFT p50 (ms)"],
        "static_ttft_p99_lo_ms": lo.loc["static", "TTFT p99 (ms)"],
        "static_ttft_p99_ok_ms": ok.loc["static", "TTFT p99 (ms)"],
        "fill_wait_lo_ms": lo.loc["static", "fill wait (ms)"],
        "fill_wait_ok_ms": ok.loc["static", "fill wait (ms)"],
        "dynamic_ttft_p50_lo_ms": lo.loc["dynamic", "TTFT p50 (ms)"],
        "dynamic_ttft_p99_ok_ms": ok.loc["dynamic", "TTFT p99 (ms)"],
        "cont_ttft_p99_lo_ms": lo.loc["continuous", "TTFT p99 (ms)"],
        "cont_ttft_p99_ok_ms": ok.loc["continuous", "TTFT p99 (ms)"],
        "ttft_p99_gap_ok": ok.loc["static", "TTFT p99 (ms)"] / ok.loc["continuous", "TTFT p99 (ms)"],
        "static_tpot_p99_hi_ms": hi.loc["static", "TPOT p99 (ms)"],
        "cont_tpot_p99_lo_ms": lo.loc["continuous", "TPOT p99 (ms)"],
        "cont_tpot_p99_hi_ms": hi.loc["continuous", "TPOT p99 (ms)"],
        "tpot_p99_ratio_hi": hi.loc["continuous", "TPOT p99 (ms)"] / hi.loc["static", "TPOT p99 (ms)"],
        "queue_wait_hi_s": hi.loc["static", "queue wait (s)"],
        "static_ttft_p99_hi_s": hi.loc["static", "TTFT p99 (ms)"] / 1e3,
        "load_requests": k["load_requests"],
        "few_static_ttft_max_ms": few_ttft_ms["static, batches of 4"],
        "few_cont_ttft_max_ms": few_ttft_ms["continuous, at most 4 running, chunks of 1024"],
        "worked_tps_gain": WORKED["tps_gain"],
        "worked_ttft_p95_before_s": WORKED["ttft_p95_before_s"],
        "worked_ttft_p95_after_s": WORKED["ttft_p95_after_s"],
        "worked_ttft_p95_ratio": WORKED["ttft_p95_after_s"] / WORKED["ttft_p95_before_s"],
        "incident_scale": incident_scale,
        "incident_params_billion": res.data["params_count"] / 1e9 * incident_scale,
        "long_prefill_ms": stack.iloc[long_i] * 1e3,
        "long_prefill_M": stack.index[long_i],
        "slo_ttft_ms": k["slo_ttft_s"] * 1e3,
        "slo_tpot_ms": k["slo_tpot_s"] * 1e3,
        "static_fill_ratio_ok": ok.loc["static", "TTFT p50 (ms)"] / ok.loc["static", "fill wait (ms)"],
        "static_fill_ratio_lo": lo.loc["static", "TTFT p50 (ms)"] / lo.loc["static", "fill wait (ms)"],
        "queue_ratio_hi": hi.loc["static", "TTFT p99 (ms)"] / 1e3 / hi.loc["static", "queue wait (s)"],
        "fill_wait_lo_double_ms": (2 * B_MAX - 1) / (2 * lo["rate (requests/s)"].iloc[0]) * 1e3,
        "window_ms": window * 1e3,
        "window_over_ttft_before": window * 1e3 / inc.loc["before", "chat TTFT p95 (ms)"],
        "mean_output": mean_output,
        "offline_gain": offline["tokens/s"].max() / offline.loc["continuous, 32", "tokens/s"],
        "offline_ttft_p50_max_s": offline["TTFT p50 (s)"].max(),
        "targets_met": int(targets["met"].sum()),
    }
    texts = {"device_name": res.provenance["name"], "measured_date": res.date, "worst_point": worst_point}
    tables = {"calibration_table": pts[["kind", "new", "ctx", "GPU time (ms)", "call time (ms)", "spread", "model (ms)",
                                        "model / measured"]].round(3),
              "load_table": shown_table.round(2), "incident_table": inc.round(1), "breakdown_table": slow.round(1),
              "offline_table": offline.round(2), "targets_table": targets.round(3)}
    return Page(numbers=numbers, texts=texts, tables=tables)
