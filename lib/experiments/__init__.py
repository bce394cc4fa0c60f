"""One module per chapter: the sweeps that measure, importable and smoke-tested on the CPU.

Each defines ``sweep(size)`` (the parameters of a "full" or "smoke" run) and ``measure(params, device, ...)``
(the data), called by its notebook through ``lib.bench.results.Run``; the notebook passes in what is timed.
Beside them, modules named for what they hold:

- ``grouped_gemm_analysis``: chapter 4's tables, numbers and claims' values from its sweep's data.
- ``unmasked_gemm``: chapter 4's teaching kernel, a grouped GEMM without masks, and what it gets wrong.
- ``ep_traffic``: expert parallelism's traffic model, all-to-all bytes and rank loads (chapters 4, 10).

Chapters: 0-6 (machine, matrix_shapes, roofline, kv_cache, grouped_gemm, prefix_caching, batching).
"""

from __future__ import annotations

from collections.abc import Iterable


def require(params: dict, keys: Iterable[str]) -> None:
    """Raise a clear error when ``params`` lacks one of a sweep's ``keys``."""
    missing = [k for k in keys if k not in params]
    if missing:
        raise ValueError(f"params lack {missing}: pass sweep('full') or sweep('smoke'), or a copy of one")
