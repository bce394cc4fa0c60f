"""Which device runs an experiment: detection, a stable slug, its properties, and provenance.

Chapter 0 ("The machine") explains the properties (SMs, L2, memory) and sets them against the
datasheet; every chapter's results file carries the provenance record built here.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Vendor datasheet figures (dense, no sparsity), kept only to set measurements against them.
DATASHEETS: dict[str, dict] = {
    "nvidia-h200": {
        "source": "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
        "hbm_GBps": 4800.0,
        "hbm_GB": 141.0,
        "bf16_tflops": 989.0,
        "fp16_tflops": 989.0,
        "tf32_tflops": 494.5,
        "fp32_tflops": 67.0,
    },
}


def slug(name: str) -> str:
    """A stable folder name for a device name: 'NVIDIA H200' -> 'nvidia-h200'."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not s:
        raise ValueError(f"cannot make a device slug from the name {name!r}: it has no letters or digits")
    return s


def resolve(device: str = "auto") -> str:
    """'auto' -> 'cuda' when torch sees a CUDA GPU, else 'cpu'; an explicit request is checked."""
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device={device!r} is not one of 'auto', 'cuda', 'cpu'")
    has_gpu = torch.cuda.is_available()
    if device == "auto":
        return "cuda" if has_gpu else "cpu"
    if device == "cuda" and not has_gpu:
        raise RuntimeError(
            "device='cuda' was asked for, but torch sees no CUDA GPU here "
            "(torch.cuda.is_available() is False). Run on a machine with a GPU and a CUDA build of "
            "torch, pass device='cpu' for a smoke run, or mode='replay' to render stored results."
        )
    return device


def properties(device: str) -> dict:
    """Name, slug and the properties the book uses (SMs, L2 bytes, memory bytes, capability)."""
    import torch

    if device == "cuda":
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return {
            "kind": "cuda",
            "name": p.name,
            "slug": slug(p.name),
            "sms": p.multi_processor_count,
            "l2_bytes": int(p.L2_cache_size),
            "memory_bytes": int(p.total_memory),
            "compute_capability": f"{p.major}.{p.minor}",
        }
    if device == "cpu":
        return {
            "kind": "cpu",
            "name": "cpu",
            "slug": "cpu",
            "cores": os.cpu_count(),
            "machine": platform.machine(),
        }
    raise ValueError(f"properties() takes 'cuda' or 'cpu', not {device!r}; call resolve() first")


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def commit() -> dict:
    """The code's git commit and whether the tree had uncommitted changes.

    BOOK_COMMIT, when set, names it instead: a copy of the tree sent to a GPU node may carry a git
    history whose HEAD is not the commit the copy was made from.
    """
    if os.environ.get("BOOK_COMMIT"):
        return {"commit": os.environ["BOOK_COMMIT"], "dirty": None}
    head = _git("rev-parse", "HEAD")
    if head:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head, "dirty": bool(status)}
    return {"commit": os.environ.get("BOOK_COMMIT", "unknown"), "dirty": None}


def provenance(device: str) -> dict:
    """Everything needed to say where and with what a result was measured."""
    import numpy
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    rec = properties(device)
    rec.update(
        driver=_nvidia_driver() if device == "cuda" else None,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=triton_version,
        numpy=numpy.__version__,
        python=platform.python_version(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **commit(),
    )
    rec["platform"] = sys.platform
    return rec


def clocks() -> dict | None:
    """The GPU's SM clock (MHz), power draw (W) and temperature (C) now, through NVML.

    Read right after a timing, it shows whether the GPU was boosting or held back by power or
    heat. None where NVML (the nvidia-ml-py package) or a GPU is not available.
    """
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            return {
                "sm_MHz": int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "power_W": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temp_C": int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
            }
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, NVMLError, no GPU: the reading is optional
        return None
