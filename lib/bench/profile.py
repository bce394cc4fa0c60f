"""Which GPU kernels one call launches, seen by the PyTorch profiler.

A model of an operation's time includes one launch per kernel (chapter 2's launch floor): an eager
operator made of several kernels pays several launches, a cuBLAS product may add a split-K
reduction. Counting them on the device replaces a guess, and their names say which algorithm ran.

Chapters: 1 and 2.
"""

from __future__ import annotations

from collections.abc import Callable


def kernel_names(fn: Callable[[], object], device: str) -> list[str] | None:
    """The names of the GPU activities (kernels, memsets, copies) one call of ``fn`` issues, in order.

    None on the CPU, or where the profiler cannot see the GPU.
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
        names = [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]
    except Exception:  # a profiler that cannot attach must not lose the measurement
        return None
    return names or None


def kernels_per_call(fn: Callable[[], object], device: str) -> int | None:
    """How many GPU activities one call issues (None where they cannot be seen; a model then assumes 1)."""
    names = kernel_names(fn, device)
    return len(names) if names else None
