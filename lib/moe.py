"""Routing for a mixture-of-experts layer: top-k, the permutation into expert order, and back.

An MoE layer scores each of its n tokens against E experts (the router, a GEMM [n, K] x [K, E]), keeps
each token's k best experts, multiplies each token by those experts' weights and sums the k outputs
weighted by the scores. The expert GEMMs run grouped (chapter 4's kernel), which wants the rows sorted
by expert, so around them sit three small steps:

1. ``top_k``: softmax over the E scores, the k largest, renormalized to sum to 1 (Mixtral's rule);
2. ``permute``: the n k token-expert pairs sorted by expert (a stable sort of the expert ids), each
   pair's token row gathered into that order, and the experts' bounds ``offsets`` [E + 1] found by a
   binary search in the sorted ids, so that no count travels to the host;
3. ``unpermute``: the grouped GEMM's rows put back in token order and each token's k rows summed with
   its weights.

Every step runs on the device with no synchronization, so one decode step with an MoE layer can be
captured in a CUDA graph. ``top_k_reference`` and ``moe_reference`` compute the same by definition,
token by token in float64: the oracles the steps are checked against.

Chapter: 4.
"""

from __future__ import annotations

import torch


def _check_k(k: int, E: int) -> None:
    if not (isinstance(k, int) and 1 <= k <= E):
        raise ValueError(f"k = {k!r}: a token goes to between 1 and E = {E} experts; pass an int in that range")


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best experts of each token and their weights: ``(weights [n, k] float32, ids [n, k] int64)``.

    ``logits`` [n, E] are the router's scores. The weights are the softmax over all E experts restricted to
    the k chosen and renormalized to sum to 1; ids come in decreasing score."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [tokens, experts], got shape {tuple(logits.shape)}")
    _check_k(k, logits.shape[1])
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    return w / w.sum(dim=-1, keepdim=True), ids


def permute(x: torch.Tensor, ids: torch.Tensor, E: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token-expert pairs in expert order: ``(xs [n k, K], offsets [E + 1] int32, order [n k] int64)``.

    Pair i of the flattened ``ids`` (token i // k, its (i % k)-th expert) lands at row j of ``xs`` where
    ``order[j] = i``; expert e owns rows ``offsets[e] .. offsets[e + 1] - 1``; within an expert, pairs keep
    token order (the sort is stable)."""
    if x.dim() != 2 or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"need x [n, K] and ids [n, k] with the same n, got {tuple(x.shape)} and {tuple(ids.shape)}")
    if ids.device != x.device:
        raise ValueError(f"x is on {x.device} and ids on {ids.device}: put both on one device")
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    xs = x.index_select(0, order // k)
    bounds = torch.arange(E + 1, device=x.device, dtype=flat.dtype)
    offsets = torch.searchsorted(flat[order], bounds).to(torch.int32)
    return xs, offsets, order


def unpermute(ys: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's output, the weighted sum of its k experts' rows: ``y`` [n, N] in ``ys``'s dtype.

    ``ys`` [n k, N] holds the grouped GEMM's rows in expert order (``permute``'s ``order``); ``weights``
    [n, k] are ``top_k``'s, rounded to ``ys``'s dtype; the sum runs in float32 (a batched product)."""
    n, k = weights.shape
    if ys.dim() != 2 or ys.shape[0] != n * k or order.shape != (n * k,):
        raise ValueError(f"need ys [n k, N] and order [n k] for weights [n, k] = [{n}, {k}], got "
                         f"{tuple(ys.shape)} and {tuple(order.shape)}")
    back = torch.empty_like(ys)
    back.index_copy_(0, order, ys)
    # [n, 1, k] x [n, k, N]: one batched product reads each row once and sums in float32
    return torch.bmm(weights.to(ys.dtype).unsqueeze(1), back.view(n, k, -1)).squeeze(1)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """The expert MLP's activation: h [m, 2 I] holds the gate and up projections side by side; returns
    silu(gate) * up [m, I] in h's dtype."""
    if h.dim() != 2 or h.shape[1] % 2:
        raise ValueError(f"h must be [rows, 2 I] (gate and up side by side), got shape {tuple(h.shape)}")
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def expert_mlp(w_up: torch.Tensor, w_down: torch.Tensor):
    """Expert e of a SwiGLU MoE layer in float64, for ``moe_reference``: x_t -> swiglu(x_t w_up[e]) w_down[e],
    with w_up [E, K, 2 I] (gate and up side by side) and w_down [E, I, K]."""
    if w_up.dim() != 3 or w_down.dim() != 3 or w_up.shape[2] != 2 * w_down.shape[1] or w_up.shape[0] != w_down.shape[0]:
        raise ValueError(f"need w_up [E, K, 2 I] and w_down [E, I, K], got {tuple(w_up.shape)} and {tuple(w_down.shape)}")

    def run(xt: torch.Tensor, e: int) -> torch.Tensor:
        return swiglu((xt @ w_up[e].double())[None])[0] @ w_down[e].double()
    return run


def moe_reference(x: torch.Tensor, expert, ids: torch.Tensor, weights: torch.Tensor, tokens=None) -> torch.Tensor:
    """The layer's output for a given routing, token by token in float64: for each token t of ``tokens`` (all
    by default), the sum over j of weights[t, j] expert(x[t], ids[t, j]). ``expert(x_t, e)`` is expert e in
    float64 (``expert_mlp``, or ``lambda xt, e: xt @ w[e].double()`` for one GEMM). Returns [len(tokens), N]."""
    tokens = range(x.shape[0]) if tokens is None else tokens
    out = []
    for t in tokens:
        xt = x[t].double()
        out.append(sum(float(weights[t, j]) * expert(xt, int(ids[t, j])) for j in range(ids.shape[1])))
    return torch.stack(out)


def top_k_reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_k`` by definition, in float64 on the CPU, one token at a time: (weights, ids). Where two scores
    tie, either expert may be chosen; compare the chosen scores, not the ids."""
    _check_k(k, logits.shape[1])
    ws, ids = [], []
    for row in logits.double().cpu():
        probs = torch.softmax(row, dim=-1).tolist()
        top = sorted(range(len(probs)), key=lambda e: -probs[e])[:k]
        total = sum(probs[e] for e in top)
        ws.append([probs[e] / total for e in top])
        ids.append(top)
    return torch.tensor(ws, dtype=torch.float64), torch.tensor(ids)
