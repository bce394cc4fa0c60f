"""lib.bench.timing on the CPU: statistics, rotation, and the benchmark's CPU path."""

import pytest

from lib.bench import timing
from lib.bench.timing import Stats, Timing


def test_stats_of_known_samples():
    s = Stats.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 5.0, 5)
    assert (s.q1, s.q3) == (2.0, 4.0)
    assert s.spread == pytest.approx(2.0 / 3.0)


def test_stats_single_sample_and_errors():
    s = Stats.of([7.0])
    assert s.median == s.q1 == s.q3 == 7.0 and s.spread == 0.0
    with pytest.raises(ValueError, match="at least one sample"):
        Stats.of([])
    with pytest.raises(ValueError, match="not finite"):
        Stats.of([1.0, float("nan")])


def test_timing_round_trip():
    t = Timing(Stats.of([1.0, 2.0, 3.0]), Stats.of([4.0, 5.0]), 10, 2, "cpu-wall")
    assert Timing.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    "bytes_per_set, l2, factor, expected",
    [(1 << 20, 60 << 20, 4, 240), (100 << 20, 60 << 20, 4, 3), (1 << 30, 60 << 20, 4, 1), (7, 10, 1, 2), (5, 0, 4, 1)],
)
def test_rotation_covers_factor_times_l2(bytes_per_set, l2, factor, expected):
    n = timing.rotation(bytes_per_set, l2, factor)
    assert n == expected
    assert n * bytes_per_set >= factor * l2
    assert n == 1 or (n - 1) * bytes_per_set < factor * l2  # the fewest sets that do


def test_rotation_rejects_bad_sizes():
    with pytest.raises(ValueError, match="bytes_per_set"):
        timing.rotation(0, 1 << 20)
    with pytest.raises(ValueError, match="factor"):
        timing.rotation(1, 1 << 20, factor=0)


class FakeClock:
    """A host clock that moves only when a timed call says so: timings become exact, whatever the machine."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def work(self, us):
        def call():
            self.t += us * 1e-6
        return call


def test_bench_cpu_measures_a_known_duration(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "_now", clock)
    t = timing.bench(clock.work(2000.0), device="cpu", reps=5, warmup=1, target_ms=5.0)
    assert t.method == "cpu-wall"
    assert t.gpu_us.n == t.call_us.n == 5
    assert t.calls_per_sample == 3  # ceil(5 ms / 2 ms): a sample lasts about target_ms
    for s in (t.gpu_us, t.call_us):
        assert s.median == pytest.approx(2000.0) and s.min == pytest.approx(s.max)


def test_bench_cpu_rotates_buffers_of_different_cost(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "_now", clock)
    t = timing.bench([clock.work(100.0), clock.work(300.0)], device="cpu", reps=4, warmup=0, target_ms=1.0)
    assert t.calls_per_sample % 2 == 0
    assert t.gpu_us.median == pytest.approx(200.0)  # a block holds as many calls of each buffer set
    assert sorted(t.call_us.to_dict()[k] for k in ("min", "max")) == pytest.approx([100.0, 300.0])


def test_bench_cpu_uses_every_buffer_in_turn():
    calls = [0, 0, 0]
    fns = [lambda i=i: calls.__setitem__(i, calls[i] + 1) for i in range(3)]
    t = timing.bench(fns, device="cpu", reps=4, warmup=2, target_ms=0.05)
    assert t.buffers == 3
    assert t.calls_per_sample % 3 == 0
    # warm-up rounds, one estimating round, the samples' blocks, then single calls taken in turn
    singles = [sum(1 for r in range(4) if r % 3 == i) for i in range(3)]
    assert calls == [2 + 1 + 4 * t.calls_per_sample // 3 + singles[i] for i in range(3)]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(fns=[]), TypeError, "callable"),
        (dict(fns=[1]), TypeError, "callable"),
        (dict(fns=lambda: None, device="tpu"), ValueError, "device"),
        (dict(fns=lambda: None, reps=0), ValueError, "reps"),
        (dict(fns=lambda: None, warmup=-1), ValueError, "warmup"),
        (dict(fns=lambda: None, target_ms=0), ValueError, "target_ms"),
        (dict(fns=lambda: None, max_calls=0), ValueError, "max_calls"),
    ],
)
def test_bench_rejects_bad_input(kwargs, error, match):
    kwargs.setdefault("device", "cpu")
    fns = kwargs.pop("fns")
    with pytest.raises(error, match=match):
        timing.bench(fns, **kwargs)


def test_bench_on_cuda_without_gpu_fails_clearly():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        timing.bench(lambda: None, device="cuda", reps=1)
