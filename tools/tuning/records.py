"""Tuning records: a sweep's rows written with where and how they were measured.

``write(out_path, rows, tool=__file__)`` writes ``{"tool", "argv", "provenance", "rows"}`` through
``lib.bench.results.write`` (a temporary file, then a rename: an interrupted sweep never damages the
last record), with ``lib.bench.device.provenance`` (device, driver, versions, date, git commit) taken at
the first write of the process. Sweeps call it after every shape, so a sweep stopped midway leaves the
rows it finished. Values JSON cannot hold (NaN, infinities) are written as null.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lib.bench import device as dev  # noqa: E402
from lib.bench import results  # noqa: E402


@functools.cache
def _provenance(device: str) -> dict:
    return dev.provenance(device)


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write(out_path: str | Path | None, rows: list, *, tool: str | Path, device: str = "cuda") -> None:
    """Write ``rows`` to ``out_path`` (nothing when it is None) as the record of ``tool``'s run."""
    if not out_path:
        return
    tool = Path(tool).resolve()
    name = tool.relative_to(ROOT).as_posix() if tool.is_relative_to(ROOT) else tool.name
    results.write(out_path, {"tool": name, "argv": sys.argv[1:], "provenance": _provenance(device),
                             "rows": _clean(rows)})


def gpu_sweep(rows_default: str, extra=()):
    """What the GEMM sweeps share: their command line (``--out``, ``--rows`` and ``extra`` (flag, default)
    pairs) parsed, chapter 0's read rate (bytes/s), the GPU's L2 size, and a CUDA generator seeded with 0."""
    import argparse

    import torch

    from lib.bench import ceilings

    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rows", default=rows_default)
    for flag, default in extra:
        ap.add_argument(flag, default=default)
    args = ap.parse_args()
    return (args, ceilings.load()["read_bw_GBps"] * 1e9, torch.cuda.get_device_properties(0).L2_cache_size,
            torch.Generator(device="cuda").manual_seed(0))


def launch_search(fn, x, weights: list, ref, grid: dict, skip, time_of, base: dict, rows: list) -> dict | None:
    """Every launch of ``grid`` (a dict of lists) of ``fn(x, w, **launch)``: a launch ``skip(launch)`` rules
    out is passed over, one the GPU refuses is recorded with its error, one whose product is more than 2% off
    ``ref`` (relative, float32) stops the sweep, the rest are timed with ``time_of`` over ``weights`` (copies
    that defeat the L2). Each appends ``{**base, **launch, "gpu_us"}`` to ``rows``; returns the fastest."""
    import itertools

    best = None
    for vals in itertools.product(*grid.values()):
        kw = dict(zip(grid, vals))
        if skip(kw):
            continue
        try:
            y = fn(x, weights[0], **kw)
        except Exception as ex:  # a launch this GPU refuses: recorded, not fatal
            rows.append({**base, **kw, "error": str(ex)[:200]})
            continue
        err = float((y.float() - ref).norm() / ref.norm())
        if not err < 2e-2:
            raise AssertionError(f"{base} {kw}: relative error {err:.3g}")
        row = {**base, **kw, "gpu_us": time_of([lambda q=q, kw=kw: fn(x, q, **kw) for q in weights])}
        rows.append(row)
        if best is None or row["gpu_us"] < best["gpu_us"]:
            best = row
    return best


SHAPES_8B = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}


def time_of(calls) -> float:
    """The median GPU time (us) of ``calls`` used in turn, by CUDA-graph replay (a sweep's quick timing)."""
    from lib.bench import timing

    return timing.bench(calls, device="cuda", reps=3, warmup=1, target_ms=0.5).gpu_us.median


def weight_cases(rows: str, l2: int, gen, shapes=SHAPES_8B):
    """For each product (K, N) of ``shapes`` and each row count of ``rows`` ("1,16"): (name, K, N, ws, M, x,
    bf16_us), with ``ws`` enough copies of bf16 weights (standard deviation 0.02) to defeat the L2, x [M, K]
    bf16 and bf16 cuBLAS's GPU time over them."""
    import torch

    from lib.bench import timing

    for name, (K, N) in shapes.items():
        copies = timing.rotation(K * N * 2, l2)
        ws = [(torch.randn(K, N, device="cuda", generator=gen) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        for M in (int(m) for m in rows.split(",")):
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            yield name, K, N, ws, M, x, time_of([lambda w=w, x=x: x @ w for w in ws])


def rate_columns(rows: list, nbytes: int, read_bw: float, bf16_us: float, **extra) -> None:
    """Add to each timed row the bytes read over its time as a share of the read rate (``read_bw``, bytes/s),
    bf16's time and the speedup over it, and ``extra``."""
    for row in rows:
        if "gpu_us" in row:
            row.update(of_read_rate=nbytes / row["gpu_us"] * 1e6 / read_bw, bf16_us=bf16_us,
                       speedup=bf16_us / row["gpu_us"], **extra)
