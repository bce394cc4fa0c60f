"""How many GPU kernels one call launches, counted by the PyTorch profiler.

A model of an operation's time includes one launch per kernel (chapter 2's launch floor): an eager
RMSNorm made of several elementwise kernels pays several launches, a cuBLAS product may add a
split-K reduction. Counting them on the device replaces a guess.

Chapters: 1 and 2.
"""

from __future__ import annotations

from collections.abc import Callable


def kernels_per_call(fn: Callable[[], object], device: str) -> int | None:
    """The number of GPU activities (kernels, memsets, copies) one call of ``fn`` issues.

    None on the CPU, or where the profiler cannot see the GPU (then a model assumes one kernel).
    """
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
        n = sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    except Exception:  # a profiler that cannot attach must not lose the measurement
        return None
    return n or None
