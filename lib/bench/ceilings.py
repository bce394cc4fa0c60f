"""The machine's measured ceilings, derived from chapter 0's data in one place.

Chapter 0 measures copy and read bandwidth over buffer sizes, dense matmul rates over sizes and
dtypes, and the launch cost of a tiny op. The ceilings are the best rates it saw where the question
is the one the name asks: bandwidths only over footprints at least ``HBM_FACTOR`` times the L2 (so
the L2 cannot serve them), the copy over both ways of copying (``cudaMemcpyAsync`` and an elementwise
kernel), the read over both ways of reading (``torch.sum`` and the book's read-only kernel at each of
its launches), matmul rates over every size (bf16 also over the layer shapes of later chapters). A
floor built on them is the least time the best measured way of doing that work needs. Chapters 1-6 set their measurements against
these (``load``), never against the datasheet alone. ``load`` reads chapter 0's file through
``results.load``, which verifies its digest (a doubled median there stops the replay) and records it
in the results of the chapter being measured, so ``make check-fresh`` reports that chapter stale when
chapter 0's file changes.

Chapters: 0 (derivation); 1, 2, 3, 4 (rooflines and bandwidth fractions).
"""

from __future__ import annotations

from pathlib import Path

from lib.bench import results

NOTEBOOK = "00-the-machine"
HBM_FACTOR = 4  # a buffer this many times the L2 is served by HBM
DTYPES = ("bf16", "fp16", "tf32", "fp32")


def gbps(nbytes: float, t_us: float) -> float:
    """Bytes over microseconds, in GB/s (1e9 bytes per second)."""
    return nbytes / t_us / 1e3


def tflops(flops: float, t_us: float) -> float:
    """FLOPs over microseconds, in TFLOP/s."""
    return flops / t_us / 1e6


def beyond_l2(nbytes: int, l2_bytes: int) -> bool:
    return nbytes >= HBM_FACTOR * l2_bytes


def from_data(data: dict) -> dict:
    """The ceilings chapter 0's data supports (GPU time, the medians of CUDA-graph replays)."""
    l2 = data["l2_bytes"]
    copy = [
        gbps(2 * r["bytes"], r["timing"]["gpu_us"]["median"])
        for r in data["copy"] + data["copy_kernel"]
        if beyond_l2(2 * r["bytes"], l2)
    ]
    read = [gbps(r["bytes"], r["timing"]["gpu_us"]["median"])
            for r in data["read"] + data.get("read_kernel", []) if beyond_l2(r["bytes"], l2)]
    if not copy or not read:
        raise ValueError(
            f"chapter 0's data has no buffer of at least {HBM_FACTOR}x the L2 ({l2} bytes) to take HBM bandwidth from"
        )
    out = {"copy_bw_GBps": max(copy), "read_bw_GBps": max(read)}
    for dt in DTYPES:
        rates = [tflops(2.0 * r["n"] ** 3, r["timing"]["gpu_us"]["median"]) for r in data["matmul"] if r["dtype"] == dt]
        if dt == "bf16":  # the rectangular layer shapes too
            rates += [tflops(2.0 * m * k * n, r["timing"]["gpu_us"]["median"])
                      for r in data.get("matmul_shapes", []) for m, k, n in [r["shape"]]]
        out[f"{dt}_tflops"] = max(rates)
    out["launch_eager_us"] = data["launch"]["timing"]["call_us"]["median"]
    out["launch_graph_us"] = data["launch"]["timing"]["gpu_us"]["median"]
    out["ridge_flop_per_byte"] = out["bf16_tflops"] * 1e12 / (out["copy_bw_GBps"] * 1e9)
    out["l2_bytes"] = l2
    return out


def load(slug: str = results.REFERENCE, results_dir: str | Path | None = None) -> dict:
    """The ceilings of a device's results set (chapter 0 must have been measured for it)."""
    return from_data(results.load(NOTEBOOK, slug, results_dir)["data"])
