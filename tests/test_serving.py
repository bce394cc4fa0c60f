"""lib.serving and lib.workloads: determinism, every request finishing once with every token, bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib import serving, workloads
from lib.bench import fit

CEIL = {"bf16_tflops": 792.0, "copy_bw_GBps": 4244.0}
COST = serving.CostModel.llama3_8b(CEIL, overhead_s=2e-4)
MIX = (("chat", workloads.CHAT, 0.8), ("docs", workloads.LONG_DOC, 0.2))


def test_arrivals_and_requests_are_seeded():
    a = workloads.requests(200, 5.0, mix=MIX, seed=4)
    assert a == workloads.requests(200, 5.0, mix=MIX, seed=4) and a != workloads.requests(200, 5.0, mix=MIX, seed=5)
    times = workloads.arrival_times(20000, 10.0, seed=1)
    assert abs(len(times) / times[-1] - 10.0) < 0.3  # the rate asked for
    gaps = workloads.arrival_times(20000, 10.0, process="gamma", cv=3.0, seed=1)
    g = [b - a for a, b in zip(gaps, gaps[1:])]
    mean = sum(g) / len(g)
    cv = math.sqrt(sum((x - mean) ** 2 for x in g) / len(g)) / mean
    assert 2.5 < cv < 3.5  # bursty: the coefficient of variation asked for
    with pytest.raises(ValueError, match="process must be"):
        workloads.arrival_times(3, 1.0, process="uniform")


def check_accounting(reqs, res):
    assert [r["id"] for r in res] == sorted(q["id"] for q in reqs)  # every request, exactly once
    by_id = {q["id"]: q for q in reqs}
    for r in res:
        q = by_id[r["id"]]
        assert r["tokens"] == q["output"]  # every token accounted for
        assert 0 <= r["queue"] <= r["ttft"] <= r["e2e"] and math.isfinite(r["e2e"])


POLICIES = [
    serving.Policy("static", max_batch=8),
    serving.Policy("dynamic", max_batch=8, max_wait=0.02),
    serving.Policy("continuous", token_budget=4096, max_running=32),
    serving.Policy("continuous", token_budget=4096, chunk=512),
    serving.Policy("continuous", token_budget=4096, chunk=512, kv_capacity=40000),
    serving.Policy("continuous", token_budget=4096, max_running=32, prefill_first=True),
    serving.Policy("continuous", token_budget=4096, chunk=1024, buckets=(
        serving.Bucket("short", 2048, priority=0), serving.Bucket("long", 10**9, priority=1, max_running=2))),
    serving.Policy("continuous", token_budget=16384, max_running=64, max_wait=0.05, prefill_first=True),
    serving.Policy("continuous", token_budget=2048, chunk=1024, kv_capacity=40000, buckets=(
        serving.Bucket("short", 2048, priority=0, max_wait=0.0), serving.Bucket("long", 10**9, priority=1, max_wait=0.1))),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.kind}-{p.chunk}-{p.kv_capacity}-{len(p.buckets)}-{p.max_wait}")
def test_every_request_finishes_once_and_runs_are_reproducible(policy):
    reqs = workloads.requests(300, 4.0, mix=MIX, seed=7)
    res = serving.simulate(reqs, COST, policy)
    check_accounting(reqs, res)
    assert serving.simulate(reqs, COST, policy) == res  # same input, same output, bit for bit


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), rate=st.floats(0.5, 50), seed=st.integers(0, 10**6), which=st.integers(0, len(POLICIES) - 1))
def test_random_workloads_and_policies(n, rate, seed, which):
    reqs = workloads.requests(n, rate, mix=MIX, seed=seed)
    check_accounting(reqs, serving.simulate(reqs, COST, POLICIES[which]))


def test_preemption_recomputes_and_still_finishes():
    reqs = workloads.requests(200, 20.0, mix=MIX, seed=2)
    res = serving.simulate(reqs, COST, serving.Policy("continuous", token_budget=8192, chunk=1024, kv_capacity=40000))
    check_accounting(reqs, res)
    assert sum(r["preemptions"] for r in res) > 0


def test_chunked_prefill_shortens_short_requests_wait_behind_long_ones():
    reqs = workloads.requests(600, 6.0, mix=MIX, seed=3)
    whole = serving.summary(serving.simulate(reqs, COST, serving.Policy("continuous", token_budget=32768)), "chat")
    chunked = serving.summary(serving.simulate(reqs, COST, serving.Policy("continuous", token_budget=32768, chunk=1024)),
                              "chat")
    assert chunked["ttft_p95"] < whole["ttft_p95"]


def test_bad_configuration_and_requests_are_rejected():
    reqs = workloads.requests(5, 1.0, seed=0)
    with pytest.raises(ValueError, match="kind must be"):
        serving.simulate(reqs, COST, serving.Policy("greedy"))
    with pytest.raises(ValueError, match="buckets need"):
        serving.simulate(reqs, COST, serving.Policy("static", buckets=(serving.Bucket("a", 10),)))
    with pytest.raises(ValueError, match="increasing max_input"):
        serving.simulate(reqs, COST, serving.Policy(buckets=(serving.Bucket("a", 10), serving.Bucket("b", 5))))
    with pytest.raises(ValueError, match="more than the capacity"):
        serving.simulate(reqs, COST, serving.Policy(kv_capacity=10))
    with pytest.raises(ValueError, match="at least 1 token"):
        serving.simulate([{"id": 0, "arrival": 0.0, "input": 0, "output": 3}], COST, serving.Policy())


def test_percentiles_and_summary():
    assert serving.percentile([1, 2, 3, 4], 50) == 2.5 and serving.percentile([5], 99) == 5
    assert math.isnan(serving.percentile([], 50))
    reqs = workloads.requests(100, 2.0, mix=MIX, seed=1)
    s = serving.summary(serving.simulate(reqs, COST, serving.Policy()))
    assert s["requests"] == 100 and s["ttft_p50"] <= s["ttft_p95"] <= s["ttft_p99"] and s["tokens_per_s"] > 0


def test_measured_cost_model_interpolates_and_fits():
    a, b = fit.fit_line([0, 1, 2, 3], [1, 3, 5, 7])
    assert (a, b) == (1.0, 2.0)
    with pytest.raises(ValueError):
        fit.fit_line([1], [1])
    m = serving.MeasuredCostModel(m_points=(1, 100), linear_s=(1e-3, 1e-1), layers=2, attn_fixed_s=1e-5,
                                  attn_BW_Bps=1e12, attn_flops_per_token_ctx=100.0, P_flops=1e12, kv_bytes_per_token=2e3)
    assert m.linear(1) == 1e-3 and m.linear(100) == pytest.approx(1e-1)
    assert m.linear(10) == pytest.approx(1e-2)  # log-log between the points
    assert m.linear(200) == pytest.approx(2e-1)  # beyond the table: linear in M
    assert m.step(0, 0, 0) == 0.0
    assert m.step(1, 0, 1000) == pytest.approx(1e-3 + 2 * (1e-5 + 1e3 * 1000 / 1e12))
    reqs = workloads.requests(50, 2.0, mix=MIX, seed=0)
    check_accounting(reqs, serving.simulate(reqs, m, serving.Policy()))


def test_prefill_first_makes_running_requests_wait():
    """With prefill pre-empting decode, steps that prefill run no decode: decode gaps grow."""
    reqs = workloads.requests(300, 6.0, mix=MIX, seed=9)
    mixed = serving.simulate(reqs, COST, serving.Policy("continuous", token_budget=8192))
    first = serving.simulate(reqs, COST, serving.Policy("continuous", token_budget=8192, prefill_first=True))
    check_accounting(reqs, first)
    assert serving.percentile([r["itl_max"] for r in first], 95) > serving.percentile([r["itl_max"] for r in mixed], 95)


def test_fitted_cost_model_adds_its_terms():
    cm = serving.MeasuredCostModel.fitted([1, 100, 1000], [1e-3, 1e-3, 5e-3], prefill_s_per_work=1e-9,
                                          decode_fixed_s=2e-4, decode_s_per_kv_token=1e-8)
    assert cm.step(100, 0.0, 0) == pytest.approx(1e-3)
    assert cm.step(1000, 1000 * 500.0, 0) == pytest.approx(5e-3 + 5e-4)
    assert cm.step(10, 0.0, 10_000) == pytest.approx(1e-3 + 2e-4 + 1e-4)
    with pytest.raises(ValueError, match="increasing"):
        serving.MeasuredCostModel.fitted([100, 1], [1, 1], 0, 0, 1)


def test_a_batching_window_holds_prompts_until_it_closes_or_fills():
    cost = serving.CostModel(0.0, 1.0, 1.0, 1e12, 1e12, 0.0, 0.0)  # steps of 1 us
    reqs = [{"id": 0, "arrival": 0.0, "kind": "a", "input": 10, "output": 2},
            {"id": 1, "arrival": 0.001, "kind": "a", "input": 10, "output": 2},
            {"id": 2, "arrival": 1.0, "kind": "a", "input": 10, "output": 2}]
    held = serving.simulate(reqs, cost, serving.Policy("continuous", max_wait=0.05, token_budget=1000))
    assert held[0]["queue"] == pytest.approx(0.05) and held[1]["queue"] == pytest.approx(0.049)
    assert held[2]["queue"] == 0.0  # the last arrival: nothing more to wait for
    full = serving.simulate(reqs, cost, serving.Policy("continuous", max_wait=0.05, token_budget=20))
    assert full[0]["queue"] == pytest.approx(0.001)  # two prompts fill the budget: the window closes early
    short = serving.Bucket("short", 10, 0, None, 0.0)
    long_ = serving.Bucket("long", 10**6, 1)
    split = serving.simulate(reqs, cost, serving.Policy("continuous", max_wait=0.05, buckets=(short, long_)))
    assert split[0]["queue"] == 0.0  # the short bucket has no window
    with pytest.raises(ValueError, match="max_wait"):
        serving.Policy("continuous", buckets=(serving.Bucket("x", 5, 0, None, -1.0),)).check()


def test_goodput_counts_only_requests_within_their_slos():
    res = [{"kind": "a", "arrival": 0.0, "e2e": 2.0, "ttft": 0.1, "tpot": 0.01, "tokens": 100},
           {"kind": "a", "arrival": 0.0, "e2e": 2.0, "ttft": 0.5, "tpot": 0.01, "tokens": 50},
           {"kind": "b", "arrival": 1.0, "e2e": 1.0, "ttft": 0.1, "tpot": 0.05, "tokens": 30},
           {"kind": "b", "arrival": 1.0, "e2e": 1.0, "ttft": 0.1, "tpot": math.nan, "tokens": 1}]
    assert serving.goodput(res, 0.2, 0.02) == pytest.approx(101 / 2.0)
    assert serving.goodput(res, 1.0, 1.0, kind="a") == pytest.approx(150 / 2.0)
    with pytest.raises(ValueError, match="positive"):
        serving.goodput(res, 0.0, 0.02)


def test_bad_costs_and_times_are_rejected_not_simulated():
    """A NaN rate, a NaN arrival or a cost model that gives a non-positive step would stall or reverse the
    clock: each is refused with a message saying what to fix."""
    with pytest.raises(ValueError, match="finite rate"):
        workloads.arrival_times(3, float("nan"))
    with pytest.raises(ValueError, match="finite rate"):
        workloads.arrival_times(3, math.inf)
    ok = serving.MeasuredCostModel.fitted([1, 64], [1e-3, 2e-3], prefill_s_per_work=1e-9, decode_fixed_s=0.0,
                                          decode_s_per_kv_token=0.0)
    assert ok.step(4, 0.0, 100) == pytest.approx(ok.linear(4))  # no cost per KV token: none added
    for bad in [dict(prefill_s_per_work=-1e-9), dict(decode_s_per_kv_token=float("nan")), dict(decode_fixed_s=-1.0)]:
        kw = dict(prefill_s_per_work=1e-9, decode_fixed_s=0.0, decode_s_per_kv_token=1e-9) | bad
        with pytest.raises(ValueError, match="finite and >= 0"):
            serving.MeasuredCostModel.fitted([1, 64], [1e-3, 2e-3], **kw)
    reqs = [{"id": 0, "arrival": float("nan"), "input": 8, "output": 2}]
    with pytest.raises(ValueError, match="arrival"):
        serving.simulate(reqs, ok, serving.Policy())

    class Broken(serving.MeasuredCostModel):
        def step(self, tokens, prefill_ctx_work, decode_kv_tokens):
            return 0.0

    zero = Broken(**{f: getattr(ok, f) for f in ok.__dataclass_fields__})
    with pytest.raises(ValueError, match="positive, finite time"):
        serving.simulate([{"id": 0, "arrival": 0.0, "input": 8, "output": 2}], zero, serving.Policy())
