"""Expert parallelism: one SwiGLU mixture-of-experts layer whose E experts are spread over ``world`` ranks.

Rank r owns experts ``r E / world`` to ``(r + 1) E / world - 1`` (their w_up and w_down slices, nothing
else) and holds its own tokens x_r [n_r, K]: attention before the layer runs data-parallel, each rank on
its own requests, as serving engines do. The router's weights are on every rank. One call of the layer:

1. route: each rank scores its tokens (``moe.top_k`` of x_r w_router): n_r k token-expert pairs;
2. dispatch: the pairs are sorted by the rank that owns their expert (expert // (E / world)); the ranks
   first exchange how many rows each sends to each (``all_to_all_single`` of ``world`` counts), then the
   rows themselves and their experts' ids (``all_to_all_single`` with those split sizes);
3. compute: each rank sorts the rows it received by local expert (as ``moe.permute`` does), runs chapter
   4's grouped GEMM with its w_up, the SwiGLU, the grouped GEMM with its w_down, and puts the rows back in
   the order they arrived;
4. combine: the reverse ``all_to_all_single`` sends every row back to its token's rank, which sums each
   token's k rows with the router's weights (as ``moe.unpermute`` does).

The counts are exchanged first because a receiver must know how many rows to expect from each rank
before the rows can travel: they are read to the host (``tolist``), a synchronization that a step
captured in a CUDA graph cannot contain (the buffer sizes are fixed at capture). That is one reason an
expert-parallel step is harder to capture than a tensor-parallel one; engines pad to a worst case or
keep the counts on the device in their own all-to-all kernels.

The ranks wait for each other twice (dispatch and combine), so the layer takes as long as its most
loaded rank: the one whose experts received the most rows computes longest, and everyone waits for its
rows to come back. A hot expert, chosen by many tokens, makes its rank the slow one whatever the others
do (``rank_loads`` counts the rows per rank of a routing, ``dirichlet_routing`` draws skewed routings).

Bytes on the wire: each token sends k rows of K values out and receives k back, 2 k K dtype-bytes a
token, less the rows whose expert lives on the token's own rank (a fraction 1 / world of them when the
routing is uniform). ``EPMoE.last_bytes_sent`` counts those rows' bytes (dispatch and combine); the
counts and expert ids that travel with them (8 bytes a row, 8 a rank) are not counted.

``check_rank`` is a rank function for ``lib.parallel.dist.run``: it builds the same seeded weights on
every rank, gives each rank its slice of a seeded token matrix and runs the layer.

Chapter: 10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from lib import moe
from lib.kernels.grouped_gemm import grouped_gemm


def _experts_per_rank(E: int, world: int) -> int:
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"world = {world!r}: need a positive int number of ranks")
    if not (isinstance(E, int) and E >= 1):
        raise ValueError(f"E = {E!r}: need a positive int number of experts")
    if E % world:
        raise ValueError(f"E = {E} experts cannot be split evenly over world = {world} ranks: every rank owns "
                         f"E / world experts; pick a world that divides E")
    return E // world


class EPMoE:
    """Rank ``rank``'s part of an expert-parallel SwiGLU MoE layer (see the module).

    Built from the full layer's weights, all of one floating dtype: ``w_router`` [K, E], ``w_up`` [E, K, 2 I]
    (gate and up side by side), ``w_down`` [E, I, K]; it keeps the router and only its own experts' slices
    of w_up and w_down. ``k``: experts per token. ``group``: the process group (None: the default one,
    which must have ``world`` ranks). With ``world`` = 1 no process group is needed.

    ``layer(x)`` with this rank's tokens x [n, K] (n may be 0) returns their outputs [n, K]; every rank of
    the group must call it at the same time. After a call, ``last_rows_received`` is the number of rows
    this rank's experts computed and ``last_bytes_sent`` the bytes of rows this rank sent to other ranks,
    dispatch and combine together.
    """

    def __init__(self, w_router: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, rank: int, world: int,
                 k: int, group=None):
        for name, t, dims in (("w_router", w_router, 2), ("w_up", w_up, 3), ("w_down", w_down, 3)):
            if not isinstance(t, torch.Tensor) or t.dim() != dims:
                raise ValueError(f"{name} must be a {dims}-d tensor, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        K, E = w_router.shape
        if w_up.shape[:2] != (E, K) or w_up.shape[2] % 2 or w_down.shape != (E, w_up.shape[2] // 2, K):
            raise ValueError(f"need w_router [K, E], w_up [E, K, 2 I] and w_down [E, I, K] of one K, E and I, got "
                             f"{tuple(w_router.shape)}, {tuple(w_up.shape)} and {tuple(w_down.shape)}")
        if not (w_router.dtype == w_up.dtype == w_down.dtype) or not w_up.is_floating_point():
            raise ValueError(f"the weights must share one floating dtype, got {w_router.dtype}, {w_up.dtype} and "
                             f"{w_down.dtype}: convert them to one (fp16, bf16 or fp32)")
        local = _experts_per_rank(E, world)
        if not (isinstance(rank, int) and 0 <= rank < world):
            raise ValueError(f"rank = {rank!r}: need an int in [0, world = {world})")
        if not (isinstance(k, int) and 1 <= k <= E):
            raise ValueError(f"k = {k!r}: a token goes to between 1 and E = {E} experts; pass an int in that range")
        self.E, self.K, self.k, self.rank, self.world, self.group = E, K, k, rank, world, group
        self.local = local
        self.first = rank * local
        self.w_router = w_router
        self.w_up = w_up[self.first:self.first + local].contiguous()
        self.w_down = w_down[self.first:self.first + local].contiguous()
        self.last_rows_received = 0
        self.last_bytes_sent = 0

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits=None, in_splits=None) -> None:
        if self.world == 1:
            out.copy_(inp)
        else:
            dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
                                   group=self.group)

    def _check_group(self) -> None:
        if self.world == 1:
            return
        if not dist.is_initialized():
            raise RuntimeError(f"EPMoE with world = {self.world} needs a torch.distributed process group: call "
                               "it inside lib.parallel.dist.run (or after dist.init_process_group)")
        size, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if (size, rank) != (self.world, self.rank):
            raise RuntimeError(f"this layer was built as rank {self.rank} of {self.world}, but the process group "
                               f"has this process as rank {rank} of {size}: build it with the group's rank and size")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.K:
            raise ValueError(f"x must be this rank's tokens [n, K = {self.K}], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype != self.w_up.dtype or x.device != self.w_up.device:
            raise ValueError(f"x is {x.dtype} on {x.device}, the weights {self.w_up.dtype} on {self.w_up.device}: "
                             "convert x to the weights' dtype and device")
        self._check_group()
        n, k, K, world, local = x.shape[0], self.k, self.K, self.world, self.local
        weights, ids = moe.top_k(x @ self.w_router, k)

        # dispatch: the n k pairs sorted by the rank owning their expert (stable: token order within a rank)
        flat = ids.reshape(-1)
        dest = flat // local
        send_order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        self._all_to_all(recv_counts, send_counts)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()  # to the host: the sizes below
        rows_in = sum(recv_splits)
        send_x = x.index_select(0, send_order // k)
        send_e = flat[send_order] - dest[send_order] * local  # expert id local to the receiving rank
        recv_x = x.new_empty(rows_in, K)
        recv_e = flat.new_empty(rows_in)
        self._all_to_all(recv_x, send_x, recv_splits, send_splits)
        self._all_to_all(recv_e, send_e, recv_splits, send_splits)

        # compute: rows sorted by local expert, the two grouped GEMMs, rows back in arrival order
        xs, offsets, order = moe.permute(recv_x, recv_e[:, None], local)
        h = moe.swiglu(grouped_gemm(xs, self.w_up, offsets))
        ys = grouped_gemm(h.contiguous(), self.w_down, offsets)
        back = torch.empty_like(ys)
        back.index_copy_(0, order, ys)

        # combine: every row back to its token's rank, in the order it was sent; each token's k rows summed
        ret = x.new_empty(n * k, K)
        self._all_to_all(ret, back, send_splits, recv_splits)
        row_bytes = K * x.element_size()
        self.last_rows_received = rows_in
        self.last_bytes_sent = (n * k - send_splits[self.rank] + rows_in - recv_splits[self.rank]) * row_bytes
        if n == 0:
            return x.new_zeros(0, K)
        return moe.unpermute(ret, send_order, weights)


def rank_loads(ids: torch.Tensor, E: int, world: int) -> torch.Tensor:
    """Rows each rank's experts receive for the routing ``ids`` [n, k] (expert of each token-expert pair):
    int64 [world], rank r owning experts r E / world to (r + 1) E / world - 1. The layer's time follows
    the largest entry."""
    local = _experts_per_rank(E, world)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor [n, k] of expert ids, got "
                         f"{(ids.dtype, tuple(ids.shape)) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
    flat = ids.reshape(-1).long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= E):
        raise ValueError(f"expert ids must lie in [0, E = {E}), got values from {int(flat.min())} to "
                         f"{int(flat.max())}: pass the E the routing was made for")
    return torch.bincount(flat // local, minlength=world)


def dirichlet_routing(n: int, E: int, k: int, concentration: float, seed: int) -> torch.Tensor:
    """A synthetic routing ``ids`` [n, k] (int64): expert popularities p ~ Dirichlet(concentration ones(E)),
    then each token picks k distinct experts with probability proportional to p (without replacement).

    A small concentration (0.1) gives a few hot experts, a large one (100) near-uniform popularity.
    Popularities are floored at 1e-30 so that k distinct experts can always be drawn. Reproducible: the
    same arguments give the same routing, and the global random state is left untouched."""
    for name, v, lo in (("n", n, 0), ("E", E, 1), ("seed", seed, 0)):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= lo):
            raise ValueError(f"{name} = {v!r}: need an int >= {lo}")
    if not (isinstance(k, int) and 1 <= k <= E):
        raise ValueError(f"k = {k!r}: a token picks between 1 and E = {E} distinct experts; pass an int in that range")
    if not (isinstance(concentration, (int, float)) and math.isfinite(concentration) and concentration > 0):
        raise ValueError(f"concentration = {concentration!r}: the Dirichlet needs a finite value > 0 "
                         "(small: skewed popularity, large: near uniform)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        p = torch.distributions.Dirichlet(torch.full((E,), float(concentration), dtype=torch.float64)).sample()
    p = p.clamp_min(1e-30)
    g = torch.Generator().manual_seed(seed)
    if n == 0:
        return torch.empty(0, k, dtype=torch.int64)
    return torch.multinomial(p.expand(n, E), k, replacement=False, generator=g)


def check_inputs(world: int, E: int, k: int, K: int, inter: int, n_per_rank, seed: int, bias=None):
    """The seeded layer and tokens that ``check_rank`` runs: ``(w_router [K, E], w_up [E, K, 2 inter],
    w_down [E, inter, K], xs)`` in float32, ``inter`` the experts' intermediate size I and ``xs`` the list
    of each rank's tokens [n_r, K].

    ``n_per_rank``: tokens of every rank (an int) or of each (a sequence of ``world`` ints, 0 allowed).
    ``bias``: None, or E numbers added to the router's scores: column 0 of the tokens is then the
    constant 1 and row 0 of w_router the bias (a large value makes an expert hot, a very negative one
    leaves it without rows)."""
    _experts_per_rank(E, world)
    counts = [n_per_rank] * world if isinstance(n_per_rank, int) else list(n_per_rank)
    if len(counts) != world or not all(isinstance(c, int) and c >= 0 for c in counts):
        raise ValueError(f"n_per_rank = {n_per_rank!r}: need an int >= 0 or a sequence of world = {world} of them")
    g = torch.Generator().manual_seed(seed)
    w_router = torch.randn(K, E, generator=g)
    w_up = torch.randn(E, K, 2 * inter, generator=g) / math.sqrt(K)
    w_down = torch.randn(E, inter, K, generator=g) / math.sqrt(inter)
    x = torch.randn(sum(counts), K, generator=g)
    if bias is not None:
        bias = torch.as_tensor(bias, dtype=torch.float32)
        if bias.shape != (E,):
            raise ValueError(f"bias must hold E = {E} numbers (one per expert), got shape {tuple(bias.shape)}")
        x[:, 0] = 1.0
        w_router[0] = bias
    return w_router, w_up, w_down, list(x.split(counts))


def check_rank(rank: int, world: int, E: int, k: int, K: int, inter: int, n_per_rank: int | Sequence[int],
               seed: int, bias=None):
    """Rank function for ``dist.run``: the layer of ``check_inputs`` on this rank's tokens. Returns
    ``(outputs [n_r, K], last_rows_received, last_bytes_sent)``."""
    w_router, w_up, w_down, xs = check_inputs(world, E, k, K, inter, n_per_rank, seed, bias)
    layer = EPMoE(w_router, w_up, w_down, rank, world, k)
    out = layer(xs[rank])
    return out, layer.last_rows_received, layer.last_bytes_sent
