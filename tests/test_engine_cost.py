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
