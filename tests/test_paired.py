"""lib.bench.timing.paired on the CPU: pairs taken in alternation, ratios pair by pair, bad input refused."""

import time

import pytest

from lib.bench import timing
from lib.bench.timing import Paired


def spin(us):
    """Busy-wait about ``us`` microseconds (sleep is too coarse for short calls)."""
    def f():
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass
    return f


def test_paired_measures_known_ratio():
    r = timing.paired(spin(200), spin(400), device="cpu", pairs=7, warmup=1, target_ms=2.0)
    assert r.method == "cpu-wall pairs"
    assert r.a_us.n == r.b_us.n == r.ratio.n == 7
    assert 200 <= r.a_us.median < 300 and 400 <= r.b_us.median < 550
    assert 1.6 < r.ratio.median < 2.4
    assert r.ratio.min <= r.ratio.q1 <= r.ratio.median <= r.ratio.q3 <= r.ratio.max
    same = timing.paired(spin(300), spin(300), device="cpu", pairs=7, warmup=1, target_ms=2.0)
    assert 0.8 < same.ratio.median < 1.25


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


def test_paired_round_trip():
    r = timing.paired(spin(50), spin(50), device="cpu", pairs=3, warmup=0, target_ms=0.5)
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
