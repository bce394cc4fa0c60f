"""One module per chapter: the sweeps that measure, importable and smoke-tested on the CPU.

Each defines ``sweep(size)`` (the parameters of a "full" or "smoke" run) and ``measure(params, device, ...)``
(the data), called by its notebook through ``lib.bench.results.Run``; the notebook passes in what is timed.
Beside them, modules named for what they hold:

- ``kv_cache_analysis``: chapter 3's tables, numbers and words (its ``page``) from its sweep's data.
- ``grouped_gemm_analysis``: chapter 4's tables, numbers and claims' values from its sweep's data.
- ``unmasked_gemm``: chapter 4's teaching kernel, a grouped GEMM without masks, and what it gets wrong.
- ``ep_traffic``: expert parallelism's traffic model, all-to-all bytes and rank loads (chapters 4, 10).

- ``decode_step_analysis``: chapter 7's tables and page, and its per-kernel latency model of a decode step
  (alpha per kernel plus bytes over the read rate), used by chapter 10 too.
- ``engine_analysis``: chapter 8's tables from the engine's runs (``engine`` measures them).

Chapters: 0-10 (machine 0, matrix_shapes 1, roofline 2, kv_cache 3, grouped_gemm 4, prefix_caching 5,
batching 6, decode_step 7, engine 8, quantization 9, parallelism 10).
"""

from __future__ import annotations

from collections.abc import Iterable


def require(params: dict, keys: Iterable[str]) -> None:
    """Raise a clear error when ``params`` lacks one of a sweep's ``keys``."""
    missing = [k for k in keys if k not in params]
    if missing:
        raise ValueError(f"params lack {missing}: pass sweep('full') or sweep('smoke'), or a copy of one")
