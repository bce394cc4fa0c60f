"""The CUDA timing path on a real GPU (skipped without one): run on the GPU machine before measuring.

``torch.cuda._sleep(cycles)`` keeps the GPU busy for a number of clock cycles, so the ratios of its GPU
times are known without knowing the clock: twice the cycles take twice the time. The tests check
ratios and structure, never an absolute duration.
"""

from __future__ import annotations

import pytest
import torch

from lib.bench import profile, timing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CYCLES = 200_000  # about 0.1 ms at the H200's clocks


def sleeper(cycles):
    return lambda: torch.cuda._sleep(cycles)


def test_bench_gpu_time_scales_with_the_work():
    one = timing.bench(sleeper(CYCLES), device="cuda", reps=7, target_ms=2.0)
    two = timing.bench(sleeper(2 * CYCLES), device="cuda", reps=7, target_ms=2.0)
    assert one.method == "cuda-graph/eager" and one.gpu_us.n == 7
    assert two.gpu_us.median / one.gpu_us.median == pytest.approx(2.0, rel=0.1)
    # a sample lasts about target_ms: enough calls of ~0.1 ms, a whole number of them
    assert one.calls_per_sample * one.gpu_us.median == pytest.approx(2000, rel=0.5)
    # for kernels this long the host's launch cost hides behind the GPU's work: both numbers agree
    assert one.call_us.median / one.gpu_us.median == pytest.approx(1.0, rel=0.1)


def test_a_tiny_kernel_costs_the_host_more_than_the_gpu():
    x = torch.zeros(1, device="cuda")
    t = timing.bench(lambda: x.add_(1.0), device="cuda", reps=7, target_ms=1.0, max_calls=1000)
    assert t.call_us.median > 1.5 * t.gpu_us.median  # eager launches cost more than replaying them


def test_rotation_calls_every_buffer_in_the_graph():
    bufs = [torch.zeros(1, device="cuda") for _ in range(3)]
    fns = [lambda b=b: b.add_(1.0) for b in bufs]
    t = timing.bench(fns, device="cuda", reps=3, warmup=1, target_ms=0.05, max_calls=30)
    assert t.buffers == 3 and t.calls_per_sample % 3 == 0
    counts = [int(b.item()) for b in bufs]
    assert counts[0] == counts[1] == counts[2] > 0  # every buffer set got the same number of calls


def test_paired_recovers_a_known_ratio_on_the_gpu():
    r = timing.paired(sleeper(CYCLES), sleeper(3 * CYCLES), device="cuda", pairs=9, target_ms=1.0)
    assert r.method == "cuda-graph pairs" and r.ratio.n == 9
    assert r.ratio.median == pytest.approx(3.0, rel=0.05)


def test_profile_sees_the_kernels_of_a_call():
    a = torch.randn(256, 256, device="cuda")
    names = profile.kernel_names(lambda: a @ a, "cuda")
    assert names and profile.kernels_per_call(lambda: a @ a, "cuda") == len(names)


def test_trace_times_each_kernel_of_a_call():
    from lib.bench import trace

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, device="cuda")
    listed = trace.kernel_times(lambda: (a @ a).add_(b), "cuda")
    assert listed and len(listed) == len(profile.kernel_names(lambda: (a @ a).add_(b), "cuda"))
    # a 4096^3 float32 product takes far longer on the device than the add of one vector
    assert all(k["us"] > 0 for k in listed) and listed[0]["us"] > listed[-1]["us"]
    assert trace.kernel_times(lambda: a @ a, "cpu") is None
