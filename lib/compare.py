"""Two paths timed in interleaved pairs: how much slower one is than the other, under drift.

Timed one after the other, two paths a few percent apart can trade places: the GPU's clocks and the
memory's state drift over seconds, and each timing catches the drift of its own moment. ``paired``
takes samples of the two in alternation (a, b, then b, a, ...), each sample a CUDA-graph replay of
enough calls to last about ``target_ms``, and keeps the ratio of every adjacent pair: drift slower than
a pair falls on both alike. The median ratio and its spread answer "how much slower is b"; the two
paths' own GPU times come with it.

On the CPU (smoke runs) the samples are wall-clock blocks of calls, and ``method`` says so.

Chapters: 3 (pages against the contiguous cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lib.timing import Stats, _calls_per_sample, _check_args


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
    for ``lib.timing.bench``) in ``pairs`` alternating pairs of samples; the order within a pair
    alternates too, so neither path always goes first."""
    if not (isinstance(pairs, int) and pairs >= 1):
        raise ValueError(f"pairs must be an int >= 1 (samples of each path), got {pairs!r}")
    fns_a = _check_args(fns_a, device, pairs, warmup, target_ms, max_calls)
    fns_b = _check_args(fns_b, device, pairs, warmup, target_ms, max_calls)
    if device == "cuda":
        (run_a, n_a), (run_b, n_b) = _graphs(fns_a, fns_b, warmup, target_ms, max_calls)
        clock, method = _cuda_clock, "cuda-graph pairs"
    else:
        (run_a, n_a), (run_b, n_b) = _blocks(fns_a, fns_b, warmup, target_ms, max_calls)
        clock, method = _wall_clock, "cpu-wall pairs"
    a, b = [], []
    for i in range(pairs):
        order = [(run_a, n_a, a), (run_b, n_b, b)]
        for run, n, samples in (order if i % 2 == 0 else order[::-1]):
            samples.append(clock(run) / n)
    return Paired(Stats.of(a), Stats.of(b), Stats.of([y / x for x, y in zip(a, b)]), (n_a, n_b), method)


def _cuda_clock(run) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _wall_clock(run) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e6


def _graphs(fns_a, fns_b, warmup, target_ms, max_calls):
    """For each path, a CUDA graph of enough calls (a whole number of rotations) to last about target_ms."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            for f in (*fns_a, *fns_b):
                f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    out = []
    for fns in (fns_a, fns_b):
        def one_round(fns=fns):
            for f in fns:
                f()
        est_us = min(_cuda_clock(one_round) for _ in range(3)) / len(fns)
        n = _calls_per_sample(est_us, len(fns), target_ms, max_calls)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                fns[i % len(fns)]()
        graph.replay()
        torch.cuda.synchronize()
        out.append((graph.replay, n))
    return out


def _blocks(fns_a, fns_b, warmup, target_ms, max_calls):
    """For each path, a block of enough calls to last about target_ms of wall-clock time."""
    out = []
    for fns in (fns_a, fns_b):
        for _ in range(warmup):
            for f in fns:
                f()
        t0 = time.perf_counter()
        for f in fns:
            f()
        n = _calls_per_sample((time.perf_counter() - t0) * 1e6 / len(fns), len(fns), target_ms, max_calls)

        def block(fns=fns, n=n):
            for i in range(n):
                fns[i % len(fns)]()
        out.append((block, n))
    return out
