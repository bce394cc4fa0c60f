"""The engine's cost model (lib.engine.cost): fitted to steps drawn from a known model it recovers that model,
it routes a step to the right branch, and it refuses a calibration it cannot fit."""

from __future__ import annotations

import pytest

from lib.engine import cost

SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)
ALPHA, D0, D1, BETA = 2e-9, 5e-3, 2e-5, 3e-8


def S(m):  # a forward pass: flat (host-bound) up to 256 tokens, then linear
    return 0.014 + 3e-5 * max(0, m - 256)


def points():
    pts = [{"kind": "stack", "new": m, "ctx": 0, "B": 1, "seconds": S(m) + ALPHA * cost.work(m, 0)}
           for m in (16, 64, 256, 1024, 4096)]
    pts += [{"kind": "context", "new": n, "ctx": c, "B": 1, "seconds": S(n) + ALPHA * cost.work(n, c)}
            for n in (256, 1024) for c in (4096, 16384)]
    pts += [{"kind": "decode", "new": b, "ctx": c, "B": b, "seconds": D0 + D1 * b + BETA * b * c}
            for b in (1, 8, 32, 64) for c in (512, 2048)]
    return pts


def test_fit_recovers_a_known_model():
    cm = cost.fit(points(), SIZES)
    assert cm.prefill.prefill_s_per_work == pytest.approx(ALPHA)
    assert (cm.decode_s, cm.decode_s_per_seq, cm.decode_s_per_kv_token) == pytest.approx((D0, D1, BETA))
    for m in (16, 1024, 4096):
        assert cm.step(m, cost.work(m, 0), 0) == pytest.approx(S(m) + ALPHA * cost.work(m, 0))
    # a decode-only step (no prefill work) runs at the captured batch size: 20 requests replay the graph of 24
    assert cm.step(20, 0.0, 20 * 1000) == pytest.approx(D0 + D1 * 24 + BETA * 20_000)
    # a step that prefills takes the eager branch, its decodes' KV at beta
    assert cm.step(300, cost.work(290, 0), 10 * 1000) == pytest.approx(cm.prefill.linear(300) + ALPHA * cost.work(
        290, 0) + BETA * 10_000)
    assert cm.step(0, 0.0, 0) == 0.0


def test_work_is_new_tokens_times_their_mean_context():
    assert cost.work(4, 0) == 8.0 and cost.work(2, 10) == 22.0  # 2 new tokens after 10: 2 x (10 + 2 / 2)


@pytest.mark.parametrize("drop,words", [("context", "context point"), ("decode", "two batch"),
                                        ("stack", "two stack")])
def test_an_incomplete_calibration_is_refused(drop, words):
    with pytest.raises(ValueError, match=words):
        cost.fit([p for p in points() if p["kind"] != drop], SIZES)


def test_a_context_point_needs_its_stack_point():
    pts = [p for p in points() if not (p["kind"] == "stack" and p["new"] == 1024)]
    with pytest.raises(ValueError, match="1024"):
        cost.fit(pts, SIZES)


# ------------------------------------------------------------------ the fit to a running engine's steps


H, KNEE, ALPHA_S, BETA_P, D0_S, D1_S, BETA_S = 0.02, 1024.0, 2e-9, 4e-8, 5e-3, 1e-5, 3e-8


GAMMA_S, ETA_S = 2e-7, 4e-3


def service_run(gap: float = 2e-4, detail: bool = False):
    """Steps drawn from a known model, one after another with ``gap`` seconds between two steps while
    requests run (what the front end takes), and an idle second after the last of each burst; with
    ``detail``, the longest decode and the prompts prefilled cost GAMMA_S per token and ETA_S per prompt
    after the first."""
    pad = cost.EngineCostModel(None, 0, 0, 0, SIZES).padded
    run, t = [], 0.0
    shapes = [(m, c, b, n) for m in (16, 200, 900, 2048, 6000) for c in (0, 3000) for b in (0, 5) for n in (1, 3)]
    for i, (m, c, b, n) in enumerate(shapes):
        kv = b * 700
        dt = H * max(1.0, (m + b) / KNEE) + ALPHA_S * cost.work(m, c) + BETA_P * (kv + b)  # M counts the decodes
        dt += ETA_S * (n - 1) if detail else 0.0
        run.append({"start": t, "end": t + dt - gap, "running": 1, "prefill_tokens": m, "decode_tokens": b,
                    "decode_kv": kv, "prefill_work": cost.work(m, c), "batch": n + b, "decode_ctx_max": 700 if b else 0})
        t += dt
        for B in (1, 3, 8, 20, 48, 64):
            kv = B * (500 + 40 * i)
            longest = 500 + 40 * i + (7 * i * B) % 3000  # not a function of B and K alone
            dt = D0_S + D1_S * pad(B) + BETA_S * (kv + B) + (GAMMA_S * longest if detail else 0.0)
            last = B == 64 and i % 4 == 3
            run.append({"start": t, "end": t + dt - (0 if last else gap), "running": 0 if last else B,
                        "prefill_tokens": 0, "decode_tokens": B, "decode_kv": kv, "prefill_work": 0.0, "batch": B,
                        "decode_ctx_max": longest})
            t += dt + (1.0 if last else 0.0)
    return run


def test_service_fit_recovers_a_known_model_timed_start_to_start():
    cm = cost.fit_steps([service_run()], SIZES)
    assert (cm.decode_s, cm.decode_s_per_seq, cm.decode_s_per_kv_token) == pytest.approx((D0_S, D1_S, BETA_S), rel=1e-6)
    p = cm.prefill
    assert p.prefill_s_per_work == pytest.approx(ALPHA_S, rel=1e-6)
    assert p.decode_s_per_kv_token == pytest.approx(BETA_P, rel=1e-6)
    for m in (16, 512, 1024, 3000, 100_000):
        assert p.linear(m) == pytest.approx(H * max(1.0, m / KNEE), rel=1e-6)


def test_periods_run_to_the_next_start_only_while_requests_run():
    run = service_run(gap=0.001)
    per = cost.periods(run)
    for s, nxt, p in zip(run, run[1:], per):
        if s["running"]:
            assert p["period"] == pytest.approx(nxt["start"] - s["start"])
        else:  # the engine waited for arrivals: the wait is no step's cost
            assert p["period"] == pytest.approx(s["end"] - s["start"]) and nxt["start"] - s["end"] > 0.5
    # timed by their own length the steps come out shorter than the model: the gaps are part of the cost
    short = cost.fit_steps([[{**s, "running": 0} for s in run]], SIZES)
    assert short.decode_s < D0_S - 5e-4


def test_service_fit_refuses_too_few_steps():
    with pytest.raises(ValueError, match="longer run"):
        cost.fit_steps([service_run()[:3]], SIZES)


def test_detailed_service_fit_recovers_the_terms_token_counts_cannot_carry():
    run = service_run(detail=True)
    cm = cost.fit_steps([run], SIZES, detail=True)
    assert (cm.gamma_s_per_ctx_token, cm.eta_s_per_prefill) == pytest.approx((GAMMA_S, ETA_S), rel=1e-6)
    assert cm.base.decode_s == pytest.approx(D0_S, rel=1e-6)
    # asked as the simulator asks it, it gives each step's period back
    for s, p in zip(run, cost.periods(run)):
        if s["running"]:
            got = cm.step_detail(s["prefill_tokens"] + s["decode_tokens"], s["prefill_work"],
                                 s["decode_kv"] + s["decode_tokens"], prefills=s["batch"] - s["decode_tokens"],
                                 decode_ctx_max=s["decode_ctx_max"])
            assert got == pytest.approx(p["period"], rel=1e-6)
    # the fit of token counts alone cannot: it misses steps by more
    plain = cost.fit_steps([run], SIZES)
    worst = max(abs(plain.step(s["prefill_tokens"] + s["decode_tokens"], s["prefill_work"], s["decode_kv"]
                               + s["decode_tokens"]) / p["period"] - 1) for s, p in zip(run, cost.periods(run))
                if s["running"])
    assert worst > 0.05


def test_a_detailed_fit_of_records_without_the_detail_is_refused():
    run = [{k: v for k, v in s.items() if k != "decode_ctx_max"} for s in service_run()]
    with pytest.raises(ValueError, match="detail=False"):
        cost.fit_steps([run], SIZES, detail=True)
