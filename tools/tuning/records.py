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
