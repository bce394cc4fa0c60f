"""lib.bench.timing.paired on the CPU: pairs taken in alternation, ratios pair by pair, bad input refused."""

import pytest

from lib.bench import timing
from lib.bench.timing import Paired
from tests.test_timing import FakeClock


def test_paired_measures_known_ratio(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "_now", clock)
    r = timing.paired(clock.work(200.0), clock.work(400.0), device="cpu", pairs=7, warmup=1, target_ms=2.0)
    assert r.method == "cpu-wall pairs"
    assert r.a_us.n == r.b_us.n == r.ratio.n == 7
    assert r.a_us.median == pytest.approx(200.0) and r.b_us.median == pytest.approx(400.0)
    assert r.ratio.median == pytest.approx(2.0) and r.ratio.min == pytest.approx(r.ratio.max)
    n_a, n_b = r.calls_per_sample  # each path's sample lasts about target_ms (one call more at most)
    assert 2000 <= n_a * 200 <= 2200 and 2000 <= n_b * 400 <= 2400


def test_paired_ratio_is_taken_pair_by_pair(monkeypatch):
    """Drift that slows both paths alike between pairs leaves each pair's ratio unchanged."""
    clock = FakeClock()
    monkeypatch.setattr(timing, "_now", clock)

    def work(us):  # the machine slows down as the run goes on: 1 + 100 t times slower after t seconds
        def call():
            clock.t += us * (1.0 + 100.0 * clock.t) * 1e-6
        return call

    r = timing.paired(work(100.0), work(300.0), device="cpu", pairs=8, warmup=0, target_ms=1.0)
    assert r.a_us.max > 5 * r.a_us.min and r.b_us.max > 4 * r.b_us.min  # each path's times drift 4-5 fold
    assert r.ratio.median == pytest.approx(3.0, rel=0.02)  # the pairs' ratio does not: each pair drifts alike
    assert r.ratio.max / r.ratio.min < 1.3


def test_paired_alternates_and_uses_every_buffer():
    log = []
    fa = [lambda i=i: log.append(("a", i)) for i in range(2)]
    fb = [lambda: log.append(("b", 0))]
    r = timing.paired(fa, fb, device="cpu", pairs=4, warmup=0, target_ms=1e-6)
    n_a, n_b = r.calls_per_sample
    assert n_a % 2 == 0 and n_b >= 1
    samples = log[3:]  # after the two estimating rounds (2 calls of a, 1 of b)
    blocks, i = [], 0
    while i < len(samples):
        path = samples[i][0]
        n = n_a if path == "a" else n_b
        assert all(s[0] == path for s in samples[i:i + n])
        blocks.append(path)
        i += n
    assert blocks == ["a", "b", "b", "a", "a", "b", "b", "a"]  # the order within a pair alternates
    assert {s for s in log if s[0] == "a"} == {("a", 0), ("a", 1)}


def test_paired_round_trip(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "_now", clock)
    r = timing.paired(clock.work(50.0), clock.work(70.0), device="cpu", pairs=3, warmup=0, target_ms=0.5)
    assert Paired.from_dict(r.to_dict()) == r


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pairs=0), ValueError, "pairs"),
    (dict(fns_b=[]), TypeError, "callable"),
    (dict(device="tpu"), ValueError, "device"),
    (dict(target_ms=0), ValueError, "target_ms"),
])
def test_paired_rejects_bad_input(kwargs, error, match):
    args = dict(fns_a=lambda: None, fns_b=lambda: None, device="cpu") | kwargs
    with pytest.raises(error, match=match):
        timing.paired(args.pop("fns_a"), args.pop("fns_b"), **args)
