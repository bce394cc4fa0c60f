"""Timing: two numbers for every timed call, GPU time and call time, each a median with its spread;
and two paths timed in interleaved pairs, for their ratio under drift.

- GPU time: the calls are captured into a CUDA graph and the graph is replayed; CUDA events around
  each replay, divided by the calls it holds, give the time the GPU spends per call without the
  host's launch cost.
- Call time: the same calls issued eagerly, one after another, timed the same way. When the host
  needs longer to launch a call than the GPU needs to run it, this is the host's time per call.

For a kernel of tens of microseconds the two differ a lot (chapter 0 measures the launch cost of a
tiny op both ways; chapter 3 shows it at a decode-attention shape); for long kernels they agree.

When the question is HBM bandwidth, pass several callables bound to different buffers whose total
is several times the L2 (``rotation``): consecutive calls then find nothing useful in the L2.

Timed one after the other, two paths a few percent apart can trade places: the GPU's clocks and the
memory's state drift over seconds, and each timing catches the drift of its own moment. ``paired``
takes samples of the two in alternation (a, b, then b, a, ...), each sample a CUDA-graph replay of
enough calls to last about ``target_ms``, and keeps the ratio of every adjacent pair: drift slower than
a pair falls on both alike. The median ratio and its spread answer "how much slower is b".

On the CPU (smoke runs) every number comes from the host's clock (``_now``): ``gpu_us`` from blocks of
calls, ``call_us`` from single calls, pairs from blocks, and ``method`` says so.

Chapters: 0 explains the two numbers; 1-6 use ``bench`` for every timing they report; 3 and 4 compare
paths with ``paired``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

_now = time.perf_counter  # the CPU path's clock (seconds); tests replace it with a clock of their own


@dataclass(frozen=True)
class Stats:
    """Median and spread of a list of samples (microseconds per call)."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        xs = sorted(float(x) for x in samples)
        if not xs:
            raise ValueError("Stats.of() needs at least one sample")
        if any(not math.isfinite(x) for x in xs):
            raise ValueError(f"Stats.of() got a sample that is not finite: {xs}")
        if len(xs) == 1:
            q1 = q3 = xs[0]
        else:
            q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(statistics.median(xs), q1, q3, xs[0], xs[-1], len(xs))

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.02 means the middle half lies within 2%."""
        return (self.q3 - self.q1) / self.median if self.median else float("nan")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Stats:
        return cls(**d)


@dataclass(frozen=True)
class Timing:
    """GPU time and call time of one callable (or a rotation of callables), per call."""

    gpu_us: Stats
    call_us: Stats
    calls_per_sample: int
    buffers: int
    method: str  # "cuda-graph/eager" on a GPU, "cpu-wall" on the CPU

    def to_dict(self) -> dict:
        return {
            "gpu_us": self.gpu_us.to_dict(),
            "call_us": self.call_us.to_dict(),
            "calls_per_sample": self.calls_per_sample,
            "buffers": self.buffers,
            "method": self.method,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Timing:
        return cls(
            Stats.from_dict(d["gpu_us"]), Stats.from_dict(d["call_us"]),
            d["calls_per_sample"], d["buffers"], d["method"],
        )


def rotation(bytes_per_set: int, l2_bytes: int, factor: float = 4.0) -> int:
    """How many input sets to cycle through so that together they hold ``factor`` times the L2.

    With that many sets, the data of a call was last touched ``factor`` L2-sizes ago, so a call
    reads HBM, not the L2.
    """
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    if l2_bytes < 0 or factor <= 0:
        raise ValueError(f"need l2_bytes >= 0 and factor > 0, got {l2_bytes} and {factor}")
    return max(1, math.ceil(factor * l2_bytes / bytes_per_set))


def _check_args(fns, device, reps, warmup, target_ms, max_calls):
    if callable(fns):
        fns = [fns]
    fns = list(fns)
    if not fns or not all(callable(f) for f in fns):
        raise TypeError("bench() takes a callable or a non-empty sequence of callables (one per buffer set)")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"bench(device={device!r}): use 'cuda' or 'cpu' (lib.device.resolve picks one)")
    if not (isinstance(reps, int) and reps >= 1):
        raise ValueError(f"reps must be an int >= 1, got {reps!r}")
    if not (isinstance(warmup, int) and warmup >= 0):
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    if not target_ms > 0:
        raise ValueError(f"target_ms must be > 0, got {target_ms!r}")
    if not (isinstance(max_calls, int) and max_calls >= 1):
        raise ValueError(f"max_calls must be an int >= 1, got {max_calls!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(
                "bench(device='cuda') needs a CUDA GPU and torch sees none; time on the CPU with "
                "device='cpu' (lib.device.resolve('auto') picks what is there)"
            )
    return fns


def _calls_per_sample(est_us: float, nbuf: int, target_ms: float, max_calls: int) -> int:
    """Enough calls that one sample lasts about target_ms, a whole number of rotations."""
    n = math.ceil(target_ms * 1e3 / max(est_us, 1e-3))
    n = max(1, min(n, max_calls))
    return nbuf * math.ceil(n / nbuf)


def bench(
    fns: Callable[[], object] | Sequence[Callable[[], object]],
    *,
    device: str = "cuda",
    reps: int = 30,
    warmup: int = 3,
    target_ms: float = 2.0,
    max_calls: int = 2000,
) -> Timing:
    """Time ``fns`` (one callable, or several bound to different buffers, used in turn).

    Each sample times ``calls_per_sample`` calls (chosen so a sample lasts about ``target_ms``,
    at most ``max_calls``, at least one per buffer set); ``reps`` samples give the median and
    spread. ``warmup`` rounds over every callable run first (compilation, caches, handles).
    """
    fns = _check_args(fns, device, reps, warmup, target_ms, max_calls)
    if device == "cuda":
        return _bench_cuda(fns, reps, warmup, target_ms, max_calls)
    return _bench_cpu(fns, reps, warmup, target_ms, max_calls)


def _bench_cpu(fns, reps, warmup, target_ms, max_calls) -> Timing:
    nbuf = len(fns)
    run_a, n = _block(fns, warmup, target_ms, max_calls)
    block = [_wall_us(run_a) / n for _ in range(reps)]
    single = [_wall_us(fns[r % nbuf]) for r in range(reps)]
    return Timing(Stats.of(block), Stats.of(single), n, nbuf, "cpu-wall")


def _bench_cuda(fns, reps, warmup, target_ms, max_calls) -> Timing:
    _warm_cuda(fns, warmup)
    replay, n = _graph(fns, target_ms, max_calls)
    gpu = [_cuda_us(replay) / n for _ in range(reps)]

    def eager():
        for i in range(n):
            fns[i % len(fns)]()

    eager()
    call = [_cuda_us(eager) / n for _ in range(reps)]
    return Timing(Stats.of(gpu), Stats.of(call), n, len(fns), "cuda-graph/eager")


# ---------------------------------------------------------------------------- the clocks and the runs they time

def _wall_us(run) -> float:
    """Microseconds one call of ``run`` takes on the host's clock."""
    t0 = _now()
    run()
    return (_now() - t0) * 1e6


def _cuda_us(run) -> float:
    """Microseconds of GPU time between CUDA events recorded around one call of ``run``."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _one_round(fns):
    def run():
        for f in fns:
            f()
    return run


def _block(fns, warmup, target_ms, max_calls):
    """(a callable running ``n`` calls in turn over ``fns``, n): enough calls to last about target_ms of
    host time, after ``warmup`` rounds; one round estimates the time per call."""
    for _ in range(warmup):
        _one_round(fns)()
    n = _calls_per_sample(_wall_us(_one_round(fns)) / len(fns), len(fns), target_ms, max_calls)

    def block():
        for i in range(n):
            fns[i % len(fns)]()
    return block, n


def _warm_cuda(fns, warmup):
    """Warm up on a side stream, as graph capture requires (allocator, cuBLAS handles, compilation)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            _one_round(fns)()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def _graph(fns, target_ms, max_calls):
    """(the replay of a CUDA graph of ``n`` calls in turn over ``fns``, n): enough calls to last about
    target_ms of GPU time, a whole number of rotations; the best of three rounds estimates one call."""
    import torch

    est_us = min(_cuda_us(_one_round(fns)) for _ in range(3)) / len(fns)
    n = _calls_per_sample(est_us, len(fns), target_ms, max_calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, n


# ---------------------------------------------------------------------------- two paths in pairs

@dataclass(frozen=True)
class Paired:
    """Per-call GPU times of paths a and b from samples taken in alternation, and b / a pair by pair."""

    a_us: Stats
    b_us: Stats
    ratio: Stats  # b over a, one value per adjacent pair of samples
    calls_per_sample: tuple[int, int]
    method: str  # "cuda-graph pairs" on a GPU, "cpu-wall pairs" on the CPU

    def to_dict(self) -> dict:
        return {"a_us": self.a_us.to_dict(), "b_us": self.b_us.to_dict(), "ratio": self.ratio.to_dict(),
                "calls_per_sample": list(self.calls_per_sample), "method": self.method}

    @classmethod
    def from_dict(cls, d: dict) -> Paired:
        return cls(Stats.from_dict(d["a_us"]), Stats.from_dict(d["b_us"]), Stats.from_dict(d["ratio"]),
                   tuple(d["calls_per_sample"]), d["method"])


def paired(
    fns_a: Callable[[], object] | Sequence[Callable[[], object]],
    fns_b: Callable[[], object] | Sequence[Callable[[], object]],
    *,
    device: str = "cuda",
    pairs: int = 15,
    warmup: int = 3,
    target_ms: float = 1.0,
    max_calls: int = 2000,
) -> Paired:
    """Time path a and path b (each one callable, or several bound to different buffers, used in turn, as
    for ``bench``) in ``pairs`` alternating pairs of samples; the order within a pair alternates too, so
    neither path always goes first."""
    if not (isinstance(pairs, int) and pairs >= 1):
        raise ValueError(f"pairs must be an int >= 1 (samples of each path), got {pairs!r}")
    fns_a = _check_args(fns_a, device, pairs, warmup, target_ms, max_calls)
    fns_b = _check_args(fns_b, device, pairs, warmup, target_ms, max_calls)
    if device == "cuda":
        _warm_cuda([*fns_a, *fns_b], warmup)
        (run_a, n_a), (run_b, n_b) = (_graph(fns, target_ms, max_calls) for fns in (fns_a, fns_b))
        clock, method = _cuda_us, "cuda-graph pairs"
    else:
        (run_a, n_a), (run_b, n_b) = (_block(fns, warmup, target_ms, max_calls) for fns in (fns_a, fns_b))
        clock, method = _wall_us, "cpu-wall pairs"
    a, b = [], []
    for i in range(pairs):
        order = [(run_a, n_a, a), (run_b, n_b, b)]
        for run, n, samples in (order if i % 2 == 0 else order[::-1]):
            samples.append(clock(run) / n)
    return Paired(Stats.of(a), Stats.of(b), Stats.of([y / x for x, y in zip(a, b)]), (n_a, n_b), method)
