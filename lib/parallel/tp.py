"""Tensor parallelism for a decode step of the decoder of ``lib.models``: each of TP ranks holds 1/TP of every
layer's weights and KV cache, and the ranks add up their partial results with two all-reduces per layer.

Sharding (Megatron style), for rank r of TP:

- Attention. Rank r holds query heads [r H_q/TP, (r+1) H_q/TP) and KV heads [r H_kv/TP, (r+1) H_kv/TP).
  Under grouped-query attention query head i reads KV head i / (H_q/H_kv), so these query heads read
  exactly these KV heads: a rank's attention needs no other rank's cache. The QKV product is
  column-parallel: the rank keeps the columns of the fused ``wqkv`` that make its heads' Q, K and V (in
  the same Q | K | V order), and the KV pool of each rank holds only its H_kv/TP heads. The O product is
  row-parallel: the rank keeps the rows of ``wo`` that its heads' outputs multiply, and its product is a
  partial sum of the full [B, hidden] result.
- MLP. The gate-up product is column-parallel: the rank keeps its 1/TP of the gate columns followed by the
  same slice of the up columns, so SiLU(gate) * up needs nothing from other ranks. The down product is
  row-parallel: the rank keeps the matching rows of ``wd``, and its product is again a partial sum.
- Replicated: the embedding, the norms, the final norm and the output head. An engine would also split
  the vocabulary of the head across ranks; here the head is replicated to keep the step simple, so every
  rank computes the full logits.

Each layer therefore issues exactly two all-reduces (sum) of B x hidden values: one after the O product,
one after the down product. The residual stream is the same on every rank, so it is added once, after the
reduction: added on every rank before it, it would be counted TP times. Chapter 10's prediction counts
these two collectives per layer.

Bytes a rank reads per step: 1/TP of the layers' weights and of the KV cache, plus the replicated output
head (and the batch's embedding rows and the norms). TP must divide H_kv and the MLP width (and so H_q):
a rank holds whole KV heads, never a share of one (engines that run more ranks than KV heads replicate KV
heads instead; this module refuses that case).

``shard`` cuts a ``Llama`` into a rank's ``TPShard``; ``TPShard.decode`` has the contract and the
numerics of ``Llama.decode`` and is called by every rank of the process group at once. ``check_rank``
runs a few decode steps in a rank (for ``lib.parallel.dist.run``), ``reference_logits`` the same steps
on the whole model, so the two can be compared.

Chapter: 10.
"""

from __future__ import annotations

import dataclasses
import numbers

import torch
import torch.distributed as tdist

from lib.kv_pool import KVPool
from lib.models import Llama, ModelConfig
from lib.models.layers import RowParallel
from lib.models.weights import Weights

REDUCTIONS_PER_LAYER = 2
DTYPES = ("float32", "bfloat16", "float16")


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_tp(cfg: ModelConfig, world) -> None:
    """Raise ``ValueError`` unless ``world`` ranks can split ``cfg`` by whole heads and MLP columns."""
    if not (_is_int(world) and world >= 1):
        raise ValueError(f"world (the tensor-parallel size) = {world!r}: pass a positive int")
    for name, n in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("mlp", cfg.mlp)):
        if n % world:
            ok = [d for d in _divisors(cfg.kv_heads) if cfg.heads % d == 0 and cfg.mlp % d == 0]
            raise ValueError(f"{name} = {n} is not divisible by the tensor-parallel size {world}: every rank holds "
                             f"the same number of whole query heads, KV heads and MLP columns; pass a world that "
                             f"divides heads ({cfg.heads}), kv_heads ({cfg.kv_heads}) and mlp ({cfg.mlp}): one of {ok}")


class TPShard:
    """Rank ``rank`` of ``world``'s share of a ``Llama`` (see the module); build it with ``shard``.

    ``cfg`` is the rank's configuration (heads, kv_heads and mlp divided by ``world``), ``full`` the whole
    model's. ``all_reduces`` counts the reductions of partial sums ``decode`` has issued, two per layer
    per step (with ``world = 1`` a reduction is the identity and no collective is called)."""

    def __init__(self, m: Llama, rank: int, world: int):
        if not isinstance(m, Llama):
            raise TypeError(f"shard takes a lib.models.Llama, got {type(m).__name__}")
        check_tp(m.cfg, world)
        if not (_is_int(rank) and 0 <= rank < world):
            raise ValueError(f"rank = {rank!r} is not a rank of a group of {world}: pass an int in [0, {world})")
        c, d = m.cfg, m.cfg.head_dim
        self.rank, self.world, self.full = int(rank), int(world), c
        self.cfg = dataclasses.replace(c, heads=c.heads // world, kv_heads=c.kv_heads // world, mlp=c.mlp // world)
        hq, hkv, f = self.cfg.heads, self.cfg.kv_heads, self.cfg.mlp
        q_cols = slice(rank * hq * d, (rank + 1) * hq * d)
        k_cols = slice((c.heads + rank * hkv) * d, (c.heads + (rank + 1) * hkv) * d)
        v_cols = slice((c.heads + c.kv_heads + rank * hkv) * d, (c.heads + c.kv_heads + (rank + 1) * hkv) * d)
        g_cols, u_cols = slice(rank * f, (rank + 1) * f), slice(c.mlp + rank * f, c.mlp + (rank + 1) * f)
        layers = []
        for L in m.layers:
            layers.append({
                "attn_norm": L["attn_norm"],
                "wqkv": torch.cat([L["wqkv"][:, q_cols], L["wqkv"][:, k_cols], L["wqkv"][:, v_cols]], 1),
                "wo": L["wo"][q_cols].contiguous(),
                "mlp_norm": L["mlp_norm"],
                "wgu": torch.cat([L["wgu"][:, g_cols], L["wgu"][:, u_cols]], 1),
                "wd": L["wd"][g_cols].contiguous()})
        # the decoder of the rank's configuration on the rank's weights, its O and down products row-parallel:
        # the step works on the rank's heads unchanged, with the two reductions in those products
        lin = m.parts.linear
        row = {p: RowParallel(lin[p], lambda x, part: self._reduce_add(x, part, self._group)) for p in ("wo", "wd")}
        parts = m.parts.replace(name=f"{m.parts.name}, TP rank", linear={**lin, **row})
        w = m.weights
        self.local = Llama(self.cfg, Weights(w.embed, layers, w.norm, w.head), parts)
        self.dtype, self.device = m.dtype, m.device
        self.all_reduces, self._group = 0, None

    @property
    def layers(self) -> list[dict]:
        """The rank's weights, per layer (same keys as ``Llama.layers``)."""
        return self.local.layers

    def new_pool(self, num_blocks: int, block_size: int) -> KVPool:
        """A KV pool for this rank's H_kv/TP heads."""
        return self.local.new_pool(num_blocks, block_size)

    def _reduce_add(self, x: torch.Tensor | None, part: torch.Tensor, group) -> torch.Tensor:
        """The residual ``x`` plus the sum over ranks of ``part`` (a rank's partial product): the partial sums
        are reduced first, then the residual, the same on every rank, is added once."""
        self.all_reduces += 1
        if self.world > 1:
            tdist.all_reduce(part, op=tdist.ReduceOp.SUM, group=group)
        return part if x is None else x + part

    def _check_group(self, group) -> None:
        if self.world == 1:
            return
        if not (tdist.is_available() and tdist.is_initialized()):
            raise RuntimeError(f"a shard of {self.world} ranks decodes inside a torch.distributed process group: "
                               "start one in every rank (lib.parallel.dist.run does) before calling decode")
        size, rank = tdist.get_world_size(group), tdist.get_rank(group)
        if (size, rank) != (self.world, self.rank):
            raise ValueError(f"this shard is rank {self.rank} of {self.world}, but the process group makes this "
                             f"process rank {rank} of {size}: shard the model with the group's rank and size")

    @torch.no_grad()
    def decode(self, tokens, pool: KVPool, block_table: torch.Tensor, seq_lens: torch.Tensor, *, group=None,
               check: bool = True) -> torch.Tensor:
        """One decode step for a batch on this rank: the logits [B, vocab] of the new tokens ``tokens`` [B],
        the same on every rank and the same as ``Llama.decode`` computes (see there for the arguments).

        Every rank of ``group`` (default: the whole process group) calls it at once with the same tokens,
        block table and lengths, each with its own ``pool`` (from ``new_pool``: this rank's KV heads). Per
        layer: norm, the rank's QKV product, RoPE, the K/V write into its pool, decode attention over its
        heads, its O product, all-reduce, residual; norm, its gate-up product, SiLU times up, its down
        product, all-reduce, residual. Two all-reduces per layer."""
        c, m = self.cfg, self.local
        if not isinstance(pool, KVPool) or pool.k is None:
            raise TypeError(f"pool must be a KVPool with storage, got {type(pool).__name__}: make it with new_pool")
        layers, _, kv_heads, _, head_dim = pool.k.shape
        if (layers, kv_heads, head_dim) != (c.layers, c.kv_heads, c.head_dim):
            raise ValueError(f"the pool holds {layers} layers of {kv_heads} KV heads of {head_dim}, this rank's shard "
                             f"{c.layers} of {c.kv_heads} of {c.head_dim}: make the pool with this shard's new_pool "
                             "(a rank holds kv_heads / TP heads)")
        self._check_group(group)
        self._group = group
        return m.decode(tokens, pool, block_table, seq_lens, check=check)


def shard(m: Llama, rank: int, world: int) -> TPShard:
    """Rank ``rank``'s share of ``m`` split across ``world`` tensor-parallel ranks (see the module)."""
    return TPShard(m, rank, world)


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype_name must be one of {DTYPES}, got {name!r}")
    return getattr(torch, name)


def decode_steps(m, steps: int, seed: int, *, lead: int = 2, block_size: int = 4) -> list[torch.Tensor]:
    """The logits of ``lead + steps`` decode steps of two requests on ``m`` (a ``Llama`` or a
    ``TPShard``, in a fresh pool of its own), built up from length 1, so no prefill is needed: request 0
    decodes alone for ``lead`` steps, then both decode together, request 0 ``lead`` tokens ahead. Step
    t's logits are [1, vocab] for t < ``lead``, then [2, vocab]. Each step's tokens are drawn from
    ``seed`` in turn, so a run of fewer steps gives the first steps of a longer one."""
    for name, v, lo in (("steps", steps, 1), ("lead", lead, 0), ("block_size", block_size, 1)):
        if not (_is_int(v) and v >= lo):
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    total = lead + steps
    gen = torch.Generator().manual_seed(seed)
    pages = -(-total // block_size)
    pool = m.new_pool(2 * pages, block_size)
    table = torch.tensor(pool.allocate(2 * pages), dtype=torch.int32).view(2, pages)
    out = []
    for t in range(total):
        lens = [t + 1] if t < lead else [t + 1, t - lead + 1]
        ids = torch.randint(0, m.cfg.vocab, (len(lens),), generator=gen)
        out.append(m.decode(ids, pool, table[: len(lens)], torch.tensor(lens, dtype=torch.int32)))
    return out


def reference_logits(cfg: ModelConfig, steps: int, seed: int, dtype_name: str = "float32", **kw) -> list[torch.Tensor]:
    """``decode_steps`` on the whole ``Llama(cfg, seed=seed)`` on the CPU: what every rank must get."""
    return decode_steps(Llama.random(cfg, seed=seed, dtype=_dtype(dtype_name)), steps, seed, **kw)


def check_rank(rank: int, world: int, cfg: ModelConfig, steps: int, seed: int, dtype_name: str = "float32", *,
               build=shard, **kw) -> dict:
    """A rank's part of a tensor-parallel check, for ``lib.parallel.dist.run``: build ``Llama(cfg,
    seed=seed)`` on the CPU (the same in every rank), take this rank's shard with ``build(m, rank, world)``
    (default ``shard``) and run ``decode_steps`` on it. Returns ``{"logits": [...], "all_reduces": n,
    "layers": cfg.layers}``: the logits of every step and the reductions the shard issued."""
    sh = build(Llama.random(cfg, seed=seed, dtype=_dtype(dtype_name)), rank, world)
    logits = decode_steps(sh, steps, seed, **kw)
    return {"logits": logits, "all_reduces": sh.all_reduces, "layers": cfg.layers}
