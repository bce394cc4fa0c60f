"""Variants of ``lib.kernels.decode_attention`` that only the tuning sweeps use (tune_decode_attention.py).

The book's kernel loads V after the scores, with no eviction hint, and picks its block-table lookup by
rule (one entry per page where a tile spans ``PER_PAGE_MIN_PAGES`` pages or more). The sweeps also
tried:

- ``v_early``: V's tile requested together with K's, before any arithmetic (twice the bytes in flight
  per program, and twice the registers);
- ``evict``: an eviction policy on the K and V loads (``tl.load``'s ``eviction_policy``);
- ``per_page``: the lookup forced either way, whatever the rule says.

The variant kernel is the book's kernel with those three knobs: it reuses the book's ``@triton.jit``
pieces (setup, page lookup, online softmax step, final write and combine) and differs only in its K/V
loads. ``DecodeAttentionVariant`` is ``lib.kernels.decode_attention.DecodeAttention`` (the same plan and
planned launch) with this kernel. Nothing in ``lib`` imports this module.

Chapter 3's lab notes report what the sweeps found.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lib.kernels import decode_attention as da  # noqa: E402
from lib.kernels import launch  # noqa: E402
from lib.kernels.decode_attention import _finish, _first_entries, _setup, _softmax_step, _tile_pages  # noqa: E402

EVICTS = ("", "evict_first", "evict_last")  # tl.load's eviction_policy
KNOBS = ("v_early", "evict", "per_page")  # what DecodeAttentionVariant adds to DecodeAttention's keywords


@triton.jit
def _decode_variant_kernel(
    # pointers
    Q, K, V, BT, LENS, Out, PACC, PM, PL, CNT,
    # scalars
    scale_log2, split_len, H_Q, H_KV, BT_W,
    # strides (elements)
    stride_qb, stride_qh,
    stride_kp, stride_kh, stride_kt,
    stride_vp, stride_vh, stride_vt,
    stride_btb,
    stride_ob, stride_oh,
    # meta-parameters: the book's kernel's, then the variant's
    G: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_BLOCKS: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, INLINE: tl.constexpr, PREFETCH: tl.constexpr,
    PER_PAGE: tl.constexpr, V_EARLY: tl.constexpr = False, EVICT: tl.constexpr = "",
):
    b, pair, kvh, s, seq_len, heads, gmask, dd, q = _setup(Q, LENS, stride_qb, stride_qh, G, BLOCK_G, HEAD_BLOCKS, D)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)
    entries = _first_entries(BT, b, stride_btb, start, BT_W, PAGE, BLOCK_N, PREFETCH, PER_PAGE)
    for n0 in range(start, end, BLOCK_N):
        page, row, tmask, entries = _tile_pages(BT, b, stride_btb, n0, end, entries, PAGE, BLOCK_N, PREFETCH,
                                                PER_PAGE)
        k_off = page * stride_kp + kvh * stride_kh + row * stride_kt
        v_off = page * stride_vp + kvh * stride_vh + row * stride_vt
        k = tl.load(K + k_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0, eviction_policy=EVICT)
        if V_EARLY:  # both tiles requested before any arithmetic
            v = tl.load(V + v_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0, eviction_policy=EVICT)
        p, alpha, m, l_sum = _softmax_step(q, k, m, l_sum, scale_log2, tmask)
        if not V_EARLY:
            v = tl.load(V + v_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0, eviction_policy=EVICT)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    _finish(acc, m, l_sum, Out, PACC, PM, PL, CNT, b, pair, s, heads, gmask, dd, H_Q, H_KV, stride_ob, stride_oh,
            BLOCK_G, HEAD_BLOCKS, D, SPLITS, INLINE)


class DecodeAttentionVariant(da.DecodeAttention):
    """``DecodeAttention`` planned the same way, launching the variant kernel: ``v_early`` (bool),
    ``evict`` (one of ``EVICTS``) and ``per_page`` (None: the book's rule; True or False: forced)."""

    def __init__(self, q, k_cache, v_cache, block_table, seq_lens, *, v_early=False, evict="", per_page=None, **plan):
        if evict not in EVICTS:
            raise ValueError(f"evict={evict!r} is not an eviction policy tl.load takes; use one of {EVICTS}")
        super().__init__(q, k_cache, v_cache, block_table, seq_lens, **plan)
        if per_page is not None:
            self.meta["PER_PAGE"] = bool(per_page)
        self.meta.update(V_EARLY=bool(v_early), EVICT=evict)
        self.split_launch = launch.Launch(_decode_variant_kernel, self.grid, self.meta, self.options, q.device)


def plan(q, k_cache, v_cache, block_table, seq_lens, **kw):
    """The book's plan where ``kw`` holds none of the variant's knobs, else the variant's."""
    cls = DecodeAttentionVariant if any(k in kw for k in KNOBS) else da.DecodeAttention
    return cls(q, k_cache, v_cache, block_table, seq_lens, **kw)
