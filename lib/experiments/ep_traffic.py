"""Expert parallelism's traffic model (theory, not measured on one GPU): the all-to-all bytes a token moves
per MoE layer when the experts are spread over several GPUs (``ep_bytes_per_token``), and the token-expert
pairs each GPU computes under contiguous expert placement (``ep_rank_loads``). Chapter 4 works them for its
routings; chapter 10 measures the all-to-all.

Chapters: 4, 10.
"""

from __future__ import annotations

import numpy as np


def ep_bytes_per_token(K: int, top_k: int, ranks: int, b: int = 2) -> dict:
    """All-to-all bytes one token moves per MoE layer under expert parallelism over ``ranks`` GPUs, each
    holding E / ranks experts (chapter 4; theory, not measured on one GPU).

    A token's hidden vector (K values of b bytes) goes to each of its ``top_k`` experts (dispatch) and each
    expert's output comes back to be summed (combine). With the experts spread evenly and the token's
    experts chosen independently of where the token lives, a share (ranks - 1) / ranks of them lie on
    another GPU: dispatch = combine = top_k K b (ranks - 1) / ranks bytes. Returns dispatch, combine and
    their total."""
    for name, v in (("K", K), ("top_k", top_k), ("ranks", ranks), ("b", b)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    one_way = top_k * K * b * (ranks - 1) / ranks
    return {"dispatch": one_way, "combine": one_way, "total": 2 * one_way}


def ep_rank_loads(counts, ranks: int) -> np.ndarray:
    """Token-expert pairs each of ``ranks`` GPUs computes when experts 0 .. E-1 are placed in contiguous
    blocks of E / ranks (chapter 4). The busiest rank (the hot-expert rank) sets the layer's time: its
    load over the mean is the factor by which skewed routing slows an expert-parallel layer."""
    counts = np.asarray(counts, dtype=np.int64)
    if isinstance(ranks, bool) or int(ranks) != ranks or ranks < 1:
        raise ValueError(f"ranks must be a positive int, got {ranks!r}")
    if counts.ndim != 1 or len(counts) == 0 or (counts < 0).any():
        raise ValueError("counts must be a non-empty list of tokens per expert, none negative")
    if len(counts) % ranks:
        raise ValueError(f"{len(counts)} experts do not split evenly over {ranks} ranks: pick ranks dividing E")
    return counts.reshape(ranks, -1).sum(axis=1)
