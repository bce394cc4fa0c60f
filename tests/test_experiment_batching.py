"""lib.experiments.batching (chapter 6): the smoke sweep measured on the CPU, its checks of the timed paths,
the cost-model fit against known constants, and the simulations' sizes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lib import models, simulator, workloads
from lib.experiments import batching as bt


def prefill_step(m, pool, tokens, blocks, cached):
    return m.prefill(tokens, pool, blocks, cached, last_only=True)


def decode_step(m, pool, tokens, table, lens):
    return m.decode(tokens, pool, table, lens, check=False)


# a sweep smaller than the smoke run's, for the checks that must raise
SMALL = {**bt.sweep("smoke"), "stack": [4, 8], "context": {"new": [4], "ctx": [8]},
         "decode": {"B": [3], "ctx": [8], "max_kv_tokens": 64}}
MIX = (("chat", workloads.CHAT, 0.85), ("doc", workloads.LONG_DOC, 0.15))


@pytest.fixture(scope="module")
def smoke():
    p = bt.sweep("smoke")
    return p, bt.measure(p, "cpu", prefill=prefill_step, decode=decode_step)


def test_smoke_data_structure(smoke):
    p, d = smoke
    assert set(d) == {"points", "params_count"} and d["params_count"] == models.CONFIGS["tiny"].params()
    expected = ([("stack", M, 0) for M in p["stack"]]
                + [("context", new, c) for c in p["context"]["ctx"] for new in p["context"]["new"]]
                + [("decode", B, L) for B in (1, 4) for L in (8, 32)])  # B L <= 1024 everywhere
    assert [(r["kind"], r["new"], r["ctx"]) for r in d["points"]] == expected
    for r in d["points"]:
        assert r["timing"]["gpu_us"]["n"] == p["reps"] and r["timing"]["gpu_us"]["median"] > 0
    assert len(bt.fit_cost_model(d["points"]).points) == len(expected)


def timed(kind, new, ctx, seconds):
    us = seconds * 1e6
    return {"kind": kind, "new": new, "ctx": ctx,
            "timing": {"gpu_us": {"median": us, "q1": us, "q3": us, "n": 1}, "call_us": {"median": us}}}


def test_the_fit_recovers_the_constants_its_points_were_made_from():
    """Points worked from known constants: S(M) = 1 ms + 1 us M, alpha 2 ps per unit of work, a decode step of
    B requests over L tokens S(B) + delta + beta B L with delta 0.5 ms and beta 3 ns (B a stack M, so S(B) is
    a measured point). A stack point is S(M) + alpha M^2 / 2, a context point S(new) + alpha new (ctx + new / 2).
    The fit must give back alpha, beta, delta and S, and predict every point."""
    alpha, beta, delta = 2e-12, 3e-9, 5e-4

    def s_of(m):
        return 1e-3 + 1e-6 * m

    pts = [timed("stack", m, 0, s_of(m) + alpha * m * m / 2) for m in (1, 4, 16, 64)]
    pts += [timed("context", n, c, s_of(n) + alpha * n * (c + n / 2)) for n in (4, 16) for c in (1000, 4000)]
    pts += [timed("decode", b, n, s_of(b) + delta + beta * b * n) for b in (1, 4) for n in (100, 1000)]
    cal = bt.fit_cost_model(pts)
    assert cal.alpha == pytest.approx(alpha, rel=1e-6)
    assert cal.beta == pytest.approx(beta, rel=1e-6)
    assert cal.delta == pytest.approx(delta, rel=1e-6)
    assert list(cal.cost.linear_s) == pytest.approx([s_of(m) for m in (1, 4, 16, 64)], rel=1e-9)
    assert cal.fit_err.max() < 1e-6


def test_decode_points_beyond_the_kv_limit_are_skipped():
    # B L above max_kv_tokens is not measured: 3 x 8 = 24 tokens fit in 24, 3 x 16 does not
    p = {**SMALL, "decode": {"B": [3], "ctx": [8, 16], "max_kv_tokens": 24}}
    d = bt.measure(p, "cpu", prefill=prefill_step, decode=decode_step)
    assert [(r["new"], r["ctx"]) for r in d["points"] if r["kind"] == "decode"] == [(3, 8)]


def test_a_prefill_returning_the_first_position_raises():
    def first_position(m, pool, tokens, blocks, cached):
        return m.prefill(tokens, pool, blocks, cached)[:1]

    with pytest.raises(AssertionError, match="prefill of 4 tokens after 0.*computes something else"):
        bt.measure(SMALL, "cpu", prefill=first_position, decode=decode_step)


def test_a_prefill_that_ignores_the_context_raises():
    def no_context(m, pool, tokens, blocks, cached):  # the new tokens as if nothing came before them
        return m.prefill(tokens[cached:], pool, blocks, 0, last_only=True)

    with pytest.raises(AssertionError, match="prefill of 4 tokens after 8"):
        bt.measure(SMALL, "cpu", prefill=no_context, decode=decode_step)


def test_a_decode_step_that_mixes_up_requests_raises():
    def swapped(m, pool, tokens, table, lens):  # request b gets request B-1-b's pages
        return m.decode(tokens, pool, table.flip(0), lens, check=False)

    with pytest.raises(AssertionError, match="decode step of 3 requests of 8 tokens, request 0"):
        bt.measure(SMALL, "cpu", prefill=prefill_step, decode=swapped)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="'full' or 'smoke'"):
        bt.sweep("large")
    with pytest.raises(ValueError, match="device must be"):
        bt.measure(SMALL, "mps", prefill=prefill_step, decode=decode_step)
    with pytest.raises(ValueError, match="lack.*stack"):
        bt.measure({k: v for k, v in SMALL.items() if k != "stack"}, "cpu", prefill=prefill_step, decode=decode_step)
    with pytest.raises(ValueError, match="must also be a stack M"):
        bt.measure({**SMALL, "context": {"new": [5], "ctx": [8]}}, "cpu", prefill=prefill_step, decode=decode_step)
    with pytest.raises(ValueError, match="positive ints"):
        bt.measure({**SMALL, "decode": {"B": [0], "ctx": [8], "max_kv_tokens": 64}}, "cpu", prefill=prefill_step,
                   decode=decode_step)


def timing(t_s):
    us = t_s * 1e6
    stats = {"median": us, "q1": us, "q3": us, "min": us, "max": us, "n": 5}
    return {"gpu_us": stats, "call_us": stats, "calls_per_sample": 1, "buffers": 1, "method": "synthetic"}


def test_fit_recovers_known_constants():
    # steps timed by a known model: S(M) = 1 ms + 2 us M, alpha = 3e-12 s per unit of work, delta = 0.5 ms,
    # beta = 4e-9 s per KV token; decode batch sizes are stack points, so S(B) is read exactly
    alpha, delta, beta = 3e-12, 5e-4, 4e-9

    def S(M):
        return 1e-3 + 2e-6 * M

    pts = [{"kind": "stack", "new": M, "ctx": 0, "timing": timing(S(M) + alpha * bt.work(M, 0))}
           for M in (1, 16, 256, 4096)]
    pts += [{"kind": "context", "new": m, "ctx": c, "timing": timing(S(m) + alpha * bt.work(m, c))}
            for c in (1024, 8192) for m in (16, 256)]
    pts += [{"kind": "decode", "new": B, "ctx": L, "timing": timing(S(B) + delta + beta * B * L)}
            for B in (1, 16, 256) for L in (128, 1024)]
    cal = bt.fit_cost_model(pts)
    assert cal.alpha == pytest.approx(alpha, rel=1e-6)
    assert cal.beta == pytest.approx(beta, rel=1e-6)
    assert cal.delta == pytest.approx(delta, rel=1e-6)
    assert cal.fit_err.max() < 1e-6  # the model reproduces every point it was fitted to
    assert cal.cost.step(4096, 0.0, 0) == pytest.approx(S(4096), rel=1e-6)
    with pytest.raises(ValueError, match="stack, context and decode"):
        bt.fit_cost_model([p for p in pts if p["kind"] != "context"])


def flat_cost(step_s):
    """Every step takes step_s seconds, whatever it does."""
    return simulator.MeasuredCostModel.fitted([1, 10**9], [step_s, step_s], prefill_s_per_work=0.0, decode_fixed_s=0.0,
                                            decode_s_per_kv_token=0.0)


def test_simulations_run_the_requests_asked_for_whatever_a_step_costs():
    cont = simulator.Policy("continuous", max_running=16, token_budget=4096, chunk=1024)
    for step_s in (1e-3, 1e3):  # a step of a millisecond or of a quarter of an hour: the same work
        cost = flat_cost(step_s)
        res, s = bt.at_rate(cost, cont, 5.0, MIX, n=20)
        assert len(res) == 20 and set(s) == {"all", "chat", "doc"} and s["all"]["requests"] == 20
        loads = bt.load_sweep(cost, {"static": simulator.Policy("static", max_batch=8), "continuous": cont},
                              rates=(0.5, 1.0), capacities={"static": 1.0, "continuous": 4.0}, mix=MIX, n=12)
        assert list(loads.index) == [(0.5, "static"), (0.5, "continuous"), (1.0, "static"), (1.0, "continuous")]
        # each rate is a load on the policy's own capacity; at or above it the policy is saturated
        assert list(loads["load"]) == [0.5, 0.125, 1.0, 0.25]
        assert list(loads["saturated"]) == [False, False, True, False]
        off = bt.offline(cost, {"continuous": cont}, MIX, n=12)
        assert list(off.index) == ["continuous"] and off.loc["continuous", "all done (s)"] > 0
    # with every step alike, the tokens per second of all requests queued at once scale as 1 / step
    assert bt.saturated(flat_cost(1e-3), cont, MIX, 30) == pytest.approx(1e6 * bt.saturated(flat_cost(1e3), cont, MIX, 30))


def test_incident_and_breakdown_tables():
    cost = flat_cost(2e-3)
    configs = {"before": simulator.Policy("continuous", max_running=8, token_budget=2048, prefill_first=True),
               "fix": simulator.Policy("continuous", max_running=8, token_budget=2048, chunk=512)}
    table, per_config = bt.incident(cost, configs, 4.0, MIX, n=30, n_saturated=20, slo_ttft=0.05, slo_tpot=0.01)
    assert list(table.index) == ["before", "fix"] and set(per_config) == {"before", "fix"}
    assert all(len(d) == 30 for d in per_config.values())
    assert (table["goodput tokens/s"] <= table["production tokens/s"] + 1e-9).all()
    br = bt.breakdown(per_config)
    assert list(br.index) == ["before", "fix"]
    chats = per_config["before"][per_config["before"]["kind"] == "chat"]
    assert br.loc["before", "all chats: queued (ms)"] == pytest.approx(chats["queue"].mean() * 1e3)
    with pytest.raises(ValueError, match="chat and doc"):
        bt.incident(cost, configs, 4.0, (("chat", workloads.CHAT, 1.0),), n=5, n_saturated=5, slo_ttft=1, slo_tpot=1)


def test_running_over_time_hand_worked():
    # one request runs over [0, 2), another arrives at 1 and runs over [1, 3): the span is 3 s; at 0, 1 and 2 s
    # one, two and one request run
    res = [{"arrival": 0.0, "queue": 0.0, "e2e": 2.0}, {"arrival": 1.0, "queue": 0.0, "e2e": 2.0}]
    assert bt.running_over_time(res, bins=3) == ([0.0, 1.0, 2.0], [1, 2, 1])
    # queued time is not running time: admitted at 1.5 s, the second is not running at 1 s
    res[1]["queue"] = 0.5
    assert bt.running_over_time(res, bins=3)[1] == [1, 1, 1]


def test_simulation_sizes_must_be_positive_request_counts():
    cost, cont = flat_cost(1e-3), simulator.Policy("continuous")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive int"):
            bt.saturated(cost, cont, MIX, bad)
    with pytest.raises(ValueError, match="rate must be"):
        bt.at_rate(cost, cont, math.inf, MIX, n=5)
    with pytest.raises(ValueError, match="at least one bin"):
        bt.running_over_time([], bins=10)


def test_points_frame_columns():
    pts = bt.points_frame([{"kind": "stack", "new": 4, "ctx": 0, "timing": timing(2e-3)}])
    assert isinstance(pts, pd.DataFrame)
    assert pts.loc[0, "GPU time (ms)"] == pytest.approx(2.0) and pts.loc[0, "spread"] == 0


def test_load_sweep_needs_every_policys_capacity():
    with pytest.raises(ValueError, match="own capacity.*'static'"):
        bt.load_sweep(flat_cost(1e-3), {"static": simulator.Policy("static", max_batch=8)}, rates=(1.0,),
                      capacities={"continuous": 4.0}, mix=MIX, n=5)


def test_capacity_is_where_a_policy_saturates():
    # every step 10 ms: a batch of at most 4 requests of a fixed output of 10 tokens. Queued all at once, the
    # continuous policy yields 4 tokens a step whenever four decode, so its capacity is at most
    # 4 / 0.01 / 10 = 40 requests/s; above it, delivered tokens/s cannot follow the arrivals
    fixed = (("chat", {"input": (64, 0.0, 64, 64), "output": (10, 0.0, 10, 10)}, 1.0),)
    cont = simulator.Policy("continuous", max_running=4, token_budget=4096)
    cap = bt.capacities(flat_cost(1e-2), {"continuous": cont}, fixed, n_saturated=40, n=40)["continuous"]
    assert 0.8 * 40 <= cap <= 40
    over = bt.load_sweep(flat_cost(1e-2), {"continuous": cont}, rates=(2 * cap,), capacities={"continuous": cap},
                         mix=fixed, n=200)
    assert bool(over["saturated"].iloc[0]) and over["tokens/s"].iloc[0] <= 1.05 * cap * 10


# ---------------------------------------------------------------------------- the page's numbers

def pasted_names(notebook: str) -> set[str]:
    """The names chapter pages paste from ``notebook`` ({glue:text}`../notebooks/NB.ipynb::name:fmt`, ...)."""
    import re
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    return {m for p in book.glob("*.md") for m in re.findall(rf"{notebook}\.ipynb::(\w+)", p.read_text())}


def test_the_incident_ratios_and_targets_worked_by_hand():
    """Benchmark tokens/s 100, 125, 124 and chat TTFT P95 100, 200, 110 ms before, after and with the fix:
    a gain of 25/100, a P95 twice as long, a fix at 1.1 of before that keeps 24 of the 25 tokens/s gained."""
    inc = pd.DataFrame({"config": ["before", "after", "fix"], "benchmark tokens/s": [100.0, 125.0, 124.0],
                        "chat TTFT p95 (ms)": [100.0, 200.0, 110.0]}).set_index("config")
    r = bt.incident_ratios(inc)
    assert r == pytest.approx({"gain": 0.25, "ttft_ratio": 2.0, "fix_ratio": 1.1, "kept": 0.96})
    t = bt.incident_targets(inc)
    assert t["measured"].tolist() == pytest.approx([0.25, 2.0, 1.1, 0.96]) and t["met"].all()
    inc.loc["fix", "chat TTFT p95 (ms)"] = 130.0  # 1.3 of before: the fix misses its target
    assert bt.incident_targets(inc)["met"].tolist() == [True, True, False, True]


def load_table(caps: dict, rates) -> pd.DataFrame:
    rows = [{"rate (requests/s)": rate, "policy": p, "load": rate / caps[p], "saturated": rate / caps[p] >= 1,
             "tokens/s": 10.0 * min(rate, caps[p]), "TTFT p50 (ms)": 100.0 * i + 10 * j, "TTFT p99 (ms)": 200.0 * i + 10 * j,
             "TPOT p99 (ms)": 5.0 + i + j} for j, rate in enumerate(rates) for i, p in enumerate(caps)]
    return pd.DataFrame(rows).set_index(["rate (requests/s)", "policy"])


def test_load_analysis_worked_by_hand():
    """Batches of B = 5 at 2 requests/s: a request waits (5 - 1) / (2 x 2) = 1 s for its batch to fill. Static
    with a capacity of 4 requests/s at 8 requests/s is saturated at load 2: the last of 100 arrivals waits
    100 (1 - 1/2) / 4 = 12.5 s."""
    caps = {"static": 4.0, "dynamic": 5.0, "continuous": 10.0}
    lt = bt.load_analysis(load_table(caps, (2.0, 8.0)), caps, mean_output=50.0, batch_limit=5, n=100)
    row = lt.set_index(["rate (requests/s)", "policy"])
    assert row.loc[(2.0, "static"), "fill wait (ms)"] == pytest.approx(1000.0)
    assert row.loc[(8.0, "static"), "fill wait (ms)"] == pytest.approx(250.0)
    assert row.loc[(8.0, "static"), "queue wait (s)"] == pytest.approx(12.5)
    assert row.loc[(8.0, "dynamic"), "queue wait (s)"] == pytest.approx(7.5)  # load 1.6: 100 (1 - 1/1.6) / 5
    assert math.isnan(row.loc[(8.0, "continuous"), "queue wait (s)"])  # load 0.8: not saturated
    assert row.loc[(2.0, "continuous"), "capacity tokens/s"] == pytest.approx(500.0)


def test_the_page_holds_what_the_book_pastes_worked_by_hand():
    """A small synthetic chapter: the page's numbers worked by hand, and every name the book pastes from
    notebook 06 either on the page or glued by another cell of the notebook."""
    from types import SimpleNamespace

    pts = pd.DataFrame([
        {"kind": "stack", "new": 1, "ctx": 0, "GPU time (ms)": 2.0, "call time (ms)": 3.0, "spread": 0.01},
        {"kind": "stack", "new": 8000, "ctx": 0, "GPU time (ms)": 40.0, "call time (ms)": 41.0, "spread": 0.01},
        {"kind": "stack", "new": 16000, "ctx": 0, "GPU time (ms)": 90.0, "call time (ms)": 91.0, "spread": 0.01},
        {"kind": "decode", "new": 1, "ctx": 64, "GPU time (ms)": 4.0, "call time (ms)": 6.0, "spread": 0.02},
        {"kind": "decode", "new": 1, "ctx": 512, "GPU time (ms)": 5.0, "call time (ms)": 8.0, "spread": 0.02}])
    pts["model (ms)"] = pts["GPU time (ms)"] * [1.0, 1.1, 1.0, 0.8, 1.05]
    pts["model / measured"] = pts["model (ms)"] / pts["GPU time (ms)"]
    fit_err = (pts["model / measured"] - 1).abs()
    stack = pts[pts["kind"] == "stack"].set_index("new")["GPU time (ms)"] / 1e3
    cal = bt.Calibration(pts, None, stack, alpha=2e-12, beta=3e-9, delta=5e-4, cost=None, fit_err=fit_err)
    caps = {"static": 4.0, "dynamic": 5.0, "continuous": 10.0}
    lt = bt.load_analysis(load_table(caps, (2.0, 3.0, 8.0)), caps, mean_output=50.0, batch_limit=5, n=100)
    inc = pd.DataFrame({"config": ["before", "after", "fix"], "benchmark tokens/s": [100.0, 125.0, 124.0],
                        "production tokens/s": [50.0, 51.0, 52.0], "goodput tokens/s": [40.0, 30.0, 45.0],
                        "chat TTFT p95 (ms)": [100.0, 200.0, 110.0]}).set_index("config")
    slow = pd.DataFrame({"config": ["before", "after"], "slowest 5%: queued (ms)": [1.0, 2.0],
                         "slowest 5%: in prefill steps (ms)": [3.0, 4.0]}).set_index("config")
    off = pd.DataFrame({"policy": ["static, 32", "continuous, 32", "continuous, 256"], "tokens/s": [500.0, 1000.0, 3000.0],
                        "TTFT p50 (s)": [1.0, 2.0, 7.5]}).set_index("policy")
    few = {"static, batches of 4": 30.0, "continuous, at most 4 running, chunks of 1024": 12.0}
    res = SimpleNamespace(data={"params_count": 2.2e9}, provenance={"name": "a GPU"}, date="2025-01-02")
    knobs = dict(caps=caps, capacity_rps=9.0, prod_rate=2.7, batch_limit=5, kv_budget_tokens=1024, load_requests=100,
                 window_s=0.05, slo_ttft_s=0.05, slo_tpot_s=0.01, mean_output=50.0)
    page = bt.page(res, cal, lt, inc, slow, off, few, knobs)
    n, t = page.numbers, page.texts

    glued_elsewhere = {"sim_10k_seconds", "claims_table", "claims_held", "claims_total", "book_targets",
                       "book_targets_table"}
    glued_elsewhere |= {k for k in pasted_names("06-batching") if k.startswith(("fig_", "timeline_"))}
    assert pasted_names("06-batching") - glued_elsewhere <= set(n) | set(t) | set(page.tables)
    # the worst point: the decode step at 0.8 of its measurement
    assert t["worst_point"] == "decode step of 1 request(s) over 64 tokens of context" and n["worst_ratio"] == 0.8
    assert (n["fit_err_max"], n["decode_b1_ratio_max"], n["decode_b1_ms"], n["decode_call_ms"]) == \
        pytest.approx((0.2, 1.05, 4.0, 7.0))
    assert (n["alpha_ps"], n["beta_ns"], n["delta_ms"], n["params_billion"]) == pytest.approx((2.0, 3.0, 0.5, 2.2))
    assert (n["stack_1_ms"], n["stack_max_ms"], n["stack_max_M"]) == pytest.approx((2.0, 90.0, 16000))
    assert (n["long_prefill_M"], n["long_prefill_ms"]) == pytest.approx((8000, 40.0))  # nearest 8192 tokens
    # rates 2, 3, 8: static (capacity 4) is below capacity at 3 (ok), saturated at 8 (hi)
    assert (n["rate_lo"], n["rate_ok"], n["rate_hi"]) == (2.0, 3.0, 8.0)
    assert (n["static_load_ok"], n["static_load_hi"], n["static_load_min_saturated"]) == pytest.approx((0.75, 2.0, 2.0))
    assert n["fill_wait_lo_ms"] == pytest.approx(1000.0) and n["fill_wait_ok_ms"] == pytest.approx(4 / 6 * 1e3)
    assert n["fill_wait_lo_double_ms"] == pytest.approx(9 / 4 * 1e3)  # batches of 2 B = 10
    assert n["queue_wait_hi_s"] == pytest.approx(12.5) and n["static_ttft_p99_hi_s"] == pytest.approx(0.02)
    assert n["static_ttft_p50_ok_ms"] == 10.0 and n["static_fill_ratio_ok"] == pytest.approx(10 / (4 / 6 * 1e3))
    assert n["cap_static_tps"] == pytest.approx(200.0) and n["ttft_p99_gap_ok"] == pytest.approx(10 / 410)
    assert n["tpot_p99_ratio_hi"] == pytest.approx(9 / 7)  # continuous 5 + 2 + 2, static 5 + 0 + 2
    # the incident: the worked example's 1.1 s P95 over the simulated 100 ms scales the model by 11
    assert (n["incident_tps_gain"], n["incident_ttft_p95_ratio"], n["fix_ttft_p95_ratio"], n["fix_tps_kept"]) == \
        pytest.approx((0.25, 2.0, 1.1, 0.96))
    assert n["incident_scale"] == pytest.approx(11.0) and n["incident_params_billion"] == pytest.approx(24.2)
    assert n["worked_ttft_p95_ratio"] == pytest.approx(2.0 / 1.1) and n["targets_met"] == 4
    assert n["window_over_ttft_before"] == pytest.approx(0.5) and (n["slo_ttft_ms"], n["slo_tpot_ms"]) == (50.0, 10.0)
    assert (n["offline_gain"], n["offline_ttft_p50_max_s"]) == (3.0, 7.5)
    assert (n["few_static_ttft_max_ms"], n["few_cont_ttft_max_ms"]) == (30.0, 12.0)
    assert page.tables["load_table"]["saturated"].tolist().count("yes") == 2  # static and dynamic at 8 requests/s
