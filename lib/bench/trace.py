"""Where the GPU time of one call goes, kernel by kernel, seen by the PyTorch profiler.

A step made of hundreds of small kernels (a decode step of a whole model, chapter 5) spends its time in
many places; the profiler lists every GPU activity of one call with its time on the device, so that they
can be grouped (GEMMs, attention, elementwise) and summed against the step's GPU time.

Chapter: 5.
"""

from __future__ import annotations

from collections.abc import Callable


def kernel_times(fn: Callable[[], object], device: str) -> list[dict] | None:
    """Each GPU activity one call of ``fn`` issues, in order: {"name", "us"} with its time on the device in
    microseconds (from the profiler's device timestamps, one call, run eagerly after one warm-up call).

    None on the CPU, or where the profiler cannot see the GPU."""
    if device != "cuda":
        return None
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
        out = [{"name": e.name, "us": float(e.time_range.end - e.time_range.start)} for e in events]
    except Exception:  # a profiler that cannot attach must not lose the measurement
        return None
    return out or None
