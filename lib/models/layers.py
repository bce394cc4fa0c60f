"""The swappable parts of the one decoder (``lib.models.llama``).

A layer of the decoder is: norm -> QKV product -> rotary embedding and the K/V write -> attention -> O
product -> norm -> gate-up product -> activation -> down product. Each arrow is a part, and a model is
one choice of parts (``Parts``); the layer loop itself never changes.

- **Linear methods** compute x @ w for a weight stored as the method prepares it (vLLM's "linear
  methods"): ``Dense`` (cuBLAS; with a residual, ``torch.addmm`` adds it in the GEMM's epilogue),
  ``Skinny`` (chapter 7's skinny kernel where it beats cuBLAS; with ``partial`` a split-K product may
  return its partial sums [splits, M, N] for the next fused kernel to add as it loads them),
  ``Quantized`` (chapter 9's int8 and int4 kernels on weights quantized once), ``RowParallel``
  (chapter 10: a rank's share of a product whose input is split by rows, summed over the ranks by an
  all-reduce before the residual is added).
- **Norms.** ``EagerNorm``: ``F.rms_norm``; the residual is added by the output products (``addmm``).
  ``FusedNorm``: one kernel adds the residual (and the partial sums of a split-K product) and normalises.
- **Rotary.** ``EagerRotary``: cos and sin tables once per step, RoPE in PyTorch operators, the new K and
  V written with ``index_copy_``. ``FusedRotary``: one kernel rotates Q and K and writes K and V into the
  pool (decode rows only: it finds each row's slot from the block table).
- **Activation.** ``EagerAct``: SiLU(gate) * up in PyTorch; ``FusedAct``: one kernel.
- **Attention** (``attention``): each prefill segment by a fused causal kernel over its gathered pages,
  the decode rows in one launch of chapter 3's paged decode-attention kernel, planned once per shape.
- **Heads.** ``TorchHead``: the head's product on cuBLAS, greedy as an argmax of the logits, top-p as
  serving engines write it in PyTorch (a sort). ``FusedHead``: the skinny product, greedy fused into it
  (the logits never written), top-p without a sort (``lib.kernels.sampling``).

Chapters: 5-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lib import quant
from lib.kernels import decode_attention as da
from lib.kernels import fused, quant_gemm, sampling, skinny_gemm

# ---------------------------------------------------------------------------- linear methods


class Dense:
    """x @ w on cuBLAS; ``residual + x @ w`` in one ``addmm``."""

    name = "dense"

    def prepare(self, w: torch.Tensor):
        return w

    def __call__(self, x, w, *, residual=None, partial: bool = False):
        return x @ w if residual is None else torch.addmm(residual, x, w)

    def weight_bytes(self, w) -> int:
        return w.numel() * w.element_size()


def _no_residual(method, residual) -> None:
    if residual is not None:
        raise ValueError(f"the {method.name} product adds no residual: pair it with FusedNorm, which adds it")


class Skinny(Dense):
    """x @ w through ``lib.kernels.skinny_gemm`` where it beats cuBLAS (``skinny_gemm.use_for``), else cuBLAS."""

    name = "skinny"

    def __call__(self, x, w, *, residual=None, partial: bool = False):
        _no_residual(self, residual)
        if skinny_gemm.use_for(x.shape[0], w.shape[1], w.shape[0]):
            return skinny_gemm.skinny_mm(x, w, reduce=not partial)
        return x @ w


class Quantized(Dense):
    """x @ w with w quantized once (``lib.quant``): "int8" per output channel, "int4" in groups of ``group``
    rows, through ``lib.kernels.quant_gemm``."""

    FORMATS = ("int8", "int4")

    def __init__(self, fmt: str, group: int = 128):
        if fmt not in self.FORMATS:
            raise ValueError(f"fmt must be one of {self.FORMATS}, got {fmt!r}")
        self.fmt, self.group = fmt, group
        self.name = fmt if fmt == "int8" else f"int4 g{group}"
        self._mm = quant_gemm.w8_mm if fmt == "int8" else quant_gemm.w4_mm

    def prepare(self, w: torch.Tensor):
        return quant.quantize_int8(w) if self.fmt == "int8" else quant.quantize_int4(w, self.group)

    def __call__(self, x, w, *, residual=None, partial: bool = False):
        _no_residual(self, residual)
        return self._mm(x, w)

    def weight_bytes(self, w) -> int:
        parts = (w.q, w.scale) if self.fmt == "int8" else (w.packed, w.scale)
        return sum(t.numel() * t.element_size() for t in parts)


class RowParallel:
    """A rank's share of a row-parallel product: ``inner``'s product of the rank's rows, handed to
    ``reduce_add(residual, part)``, which sums the partial products over the ranks (an all-reduce) and then
    adds the residual, the same on every rank, once (added before the reduction it would be counted once per
    rank); ``residual`` is None where the norm adds it."""

    def __init__(self, inner, reduce_add):
        self.inner, self.reduce_add = inner, reduce_add
        self.name = f"row-parallel {inner.name}"

    def prepare(self, w):
        return self.inner.prepare(w)

    def __call__(self, x, w, *, residual=None, partial: bool = False):
        return self.reduce_add(residual, self.inner(x, w))

    def weight_bytes(self, w) -> int:
        return self.inner.weight_bytes(w)


# ---------------------------------------------------------------------------- norms, rotary, activation


class EagerNorm:
    """RMSNorm with ``F.rms_norm``; the stream ``x`` already holds the residual (added by the products)."""

    adds_residual = False

    def __call__(self, x, res, w, eps):
        return F.rms_norm(x, (x.shape[-1],), w, eps), x

    def final(self, x, res, w, eps, rows):
        if rows is not None:
            x = x[rows]
        return F.rms_norm(x, (x.shape[-1],), w, eps)


class FusedNorm:
    """``fused.rmsnorm``: the residual add (and a split-K product's partial sums) and the norm in one kernel."""

    adds_residual = True

    def __call__(self, x, res, w, eps):
        return fused.rmsnorm(x, w, eps, residual=res)

    def final(self, x, res, w, eps, rows):
        h, _ = fused.rmsnorm(x, w, eps, residual=res)
        return h if rows is None else h[rows]


def rope_tables(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """cos and sin [m, 1, d/2] of the rotary angles at positions ``pos`` (computed in float64)."""
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def rope(x, cos, sin):
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) by the angles; x: [m, heads, d]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class EagerRotary:
    """RoPE on Q and K in PyTorch operators, K and V written into the pool with ``index_copy_``."""

    def prepare(self, m, batch, block_size: int):
        """Per step: the pool rows [m * H_kv] the new K and V go to (token-major, so one ``index_copy_``
        writes all heads of all new tokens), and the cos and sin tables."""
        blocks, slots = batch.blocks, batch.slots
        if blocks is None:  # decode rows: their slots follow from the block table and the lengths
            _, table, _ = batch.decode
            rows = torch.arange(len(batch.pos), device=batch.pos.device)
            blocks, slots = table[rows, batch.pos // block_size].long(), batch.pos % block_size
        heads = torch.arange(m.cfg.kv_heads, device=blocks.device)
        rows = ((blocks[:, None] * m.cfg.kv_heads + heads[None, :]) * block_size + slots[:, None]).reshape(-1)
        return (*rope_tables(batch.pos, m.inv_freq, m.dtype), rows)

    @staticmethod
    def cache_views(k, v, head_dim: int):
        return k.view(-1, head_dim), v.view(-1, head_dim)

    def __call__(self, qkv, k_rows, v_rows, state, heads: int, kv_heads: int, head_dim: int):
        cos, sin, rows = state
        qkv = qkv.view(-1, heads + 2 * kv_heads, head_dim)
        qk = rope(qkv[:, : heads + kv_heads], cos, sin)
        k_rows.index_copy_(0, rows, qk[:, heads:].reshape(-1, head_dim))
        v_rows.index_copy_(0, rows, qkv[:, heads + kv_heads:].reshape(-1, head_dim))
        return qk[:, :heads]


class FusedRotary:
    """``fused.rope_write``: RoPE and the K/V write of each decode row in one kernel."""

    def prepare(self, m, batch, block_size: int):
        if not batch.decodes_only:
            raise ValueError("the fused rotary kernel writes one decode token per request (it finds the slot from "
                             "the block table): a batch with prefill segments runs on EagerRotary")
        return batch.pos, m.inv_freq32, batch.decode[1]

    @staticmethod
    def cache_views(k, v, head_dim: int):
        return k, v

    def __call__(self, qkv, k, v, state, heads: int, kv_heads: int, head_dim: int):
        pos, inv_freq, table = state
        return fused.rope_write(qkv, pos, inv_freq, k, v, table, heads)


class EagerAct:
    """SiLU(gate) * up of the gate-up product [m, 2 mlp]."""

    def __call__(self, gu):
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u


class FusedAct:
    def __call__(self, gu):
        return fused.silu_mul(gu)


# ---------------------------------------------------------------------------- attention


def _causal_mask(m: int, n: int) -> dict:
    from torch.nn.attention.bias import causal_lower_right

    return dict(is_causal=True) if m == n else dict(attn_mask=causal_lower_right(m, n))


def prefill_attention(q, k, v, n: int, ctx: int) -> torch.Tensor:
    """Causal attention of a chunk's ``n`` queries q [H_q, n, d] over ``ctx`` positions k, v [H_kv, ctx, d], the
    queries being the last ``n`` (the mask aligned to the bottom right; nothing of size n x ctx is built, and
    the fused kernels skip the masked tiles, so the attention costs what the causal FLOPs say). On a GPU
    only the flash and memory-efficient kernels are allowed: the unfused fallback would materialise
    H_q x n x ctx scores (128 GiB at 32k tokens), and cuDNN's attention builds a plan for every new sequence
    length (tens of milliseconds; a serving engine sees a new length at almost every prefill). Flash takes
    grouped K/V heads as they are but only 16-bit types; in float32 the K/V heads are repeated for the
    memory-efficient kernel, which takes no groups."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = _causal_mask(n, ctx)
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q[None], k[None], v[None], enable_gqa=True, **mask)[0]
    if q.dtype == torch.float32:
        g = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], enable_gqa=True, **mask)[0]


def attention(q, k, v, batch, plans: dict, first_layer: bool, head_dim: int) -> torch.Tensor:
    """The attention output [rows, H_q, d] of a layer's queries q [rows, H_q, d] over its cache k, v
    [blocks, H_kv, page, d] (see the module). ``plans``: the decode-attention launches planned so far, by
    shape (planned once, reused by every layer and step)."""
    kv_heads, page = k.shape[1], k.shape[2]
    parts = []
    for s in batch.segments:
        K = k.view(-1, page * head_dim).index_select(0, s.gather).view(kv_heads, -1, head_dim)[:, : s.ctx]
        V = v.view(-1, page * head_dim).index_select(0, s.gather).view(kv_heads, -1, head_dim)[:, : s.ctx]
        parts.append(prefill_attention(q[s.first:s.first + s.n].transpose(0, 1), K, V, s.n, s.ctx).transpose(0, 1))
    if batch.decode is not None:
        first, table, lens = batch.decode
        qd = q[first:].contiguous()
        key = (tuple(qd.shape), tuple(k.shape), tuple(table.shape), qd.dtype, qd.device)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = da.DecodeAttention(qd, k, v, table, lens, check=False)
        parts.append(plan(qd, k, v, table, lens, check=True if (batch.check and first_layer) else None))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


# ---------------------------------------------------------------------------- heads


class TorchHead:
    linear = Dense()

    def greedy(self, h, w):
        return (h @ w).argmax(-1)

    def sample(self, logits, top_p, temperature, seed):
        return sampling.top_p_torch(logits, top_p, temperature)


class FusedHead:
    linear = Skinny()

    def greedy(self, h, w):
        if h.shape[0] > skinny_gemm.MAX_M:
            return self.linear(h, w).argmax(-1)
        return skinny_gemm.skinny_argmax(h, w)

    def sample(self, logits, top_p, temperature, seed):
        return sampling.top_p_sample(logits, top_p, temperature, seed=seed)


# ---------------------------------------------------------------------------- a model's parts


@dataclass(frozen=True)
class Parts:
    """One choice of every part (see the module). ``linear``: one method for the four layer products, or a
    dict {product: method}; ``compile``: torch.compile options for the code around attention (None: eager)."""

    name: str
    linear: object
    norm: object
    rotary: object
    act: object
    head: object
    compile: dict | None = None

    def __post_init__(self):
        from lib.models.weights import PRODUCTS

        lin = self.linear if isinstance(self.linear, dict) else {p: self.linear for p in PRODUCTS}
        if set(lin) != set(PRODUCTS):
            raise ValueError(f"linear must give a method for each of {PRODUCTS}, got {sorted(lin)}")
        object.__setattr__(self, "linear", lin)
        if not self.norm.adds_residual and any(isinstance(lin[p], (Skinny, Quantized)) for p in ("wo", "wd")):
            raise ValueError("the skinny and quantized products add no residual: pair them with FusedNorm")

    @property
    def partial(self) -> bool:
        """Whether a product may hand split-K partial sums to the fused kernel that reads it."""
        return isinstance(self.norm, FusedNorm) and isinstance(self.rotary, FusedRotary)

    def replace(self, **kw) -> Parts:
        fields = dict(name=self.name, linear=self.linear, norm=self.norm, rotary=self.rotary, act=self.act,
                      head=self.head, compile=self.compile)
        return Parts(**{**fields, **kw})


EAGER = Parts("eager", Dense(), EagerNorm(), EagerRotary(), EagerAct(), TorchHead())
FUSED = Parts("fused", Skinny(), FusedNorm(), FusedRotary(), FusedAct(), FusedHead())


def compiled(mode: str | None = None, backend: str = "inductor") -> Parts:
    """The eager parts with the code around attention compiled by ``torch.compile`` (Inductor fuses the small
    operators itself; the book's attention kernel runs between the compiled pieces)."""
    return EAGER.replace(name="compiled", compile=dict(mode=mode, dynamic=False, backend=backend))


def quantized(fmt: str, group: int = 128) -> Parts:
    """The fused parts with the four layer products quantized (``Quantized``); the embedding, the norms,
    attention, the KV cache and the output head stay as they are (engines keep the head in 16 bits too)."""
    q = Quantized(fmt, group)
    return FUSED.replace(name=q.name, linear=q)
