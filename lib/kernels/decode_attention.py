"""Decode attention over a paged KV cache, in one Triton kernel launch.

One new query token per request attends to that request's cached keys and values:

    out[b, h] = softmax(q[b, h] . K[b, kv(h)]^T * scale) . V[b, kv(h)]

The cache is paged: ``k_cache`` and ``v_cache`` have shape [num_pages, H_kv, page_size, d] and
``block_table[b, i]`` names the page that holds tokens i*page_size .. (i+1)*page_size - 1 of request b,
which has ``seq_lens[b]`` tokens. A dense cache [B, H_kv, L, d] is the same thing with one page per
request (``block_table[b, 0] = b``, page_size = L).

The kernel (chapter 3 explains it):

- GQA-aware: a program serves one (request, KV head) and all H_q/H_kv query heads that share it, so each
  byte of K and V is loaded once per step, not once per query head. Groups of 32 or more heads over
  short contexts are served by several programs of 16 heads each (``choose_head_block``).
- Split-KV (flash-decoding): the context is cut into ``num_splits`` ranges handled by separate programs,
  so that B * H_kv * num_splits programs keep the SMs busy even for one request (``choose_splits``).
- Each split keeps a running maximum and sum (online softmax, in base 2, fp32 accumulation) and writes
  its partial result; they are combined by log-sum-exp either by a second, small kernel with one
  program per (request, query head) (``combine="kernel"``), or inside the same launch by the last split
  of a (request, KV head) to finish, found by an atomic counter that it then resets
  (``combine="inline"``: one launch, but one program reads all the group's partials in turn). The
  default, ``"auto"``, combines inline up to ``INLINE_MAX_SPLITS`` splits.
- Pages are found through the block table, tile by tile: one entry per tile where a tile lies inside a
  page, one per page where a tile spans ``PER_PAGE_MIN_PAGES`` pages or more (spread over the page's
  tokens in registers), one per token otherwise; with ``prefetch`` the next tile's entries are
  requested a step ahead, so that a step's K and V loads do not wait on its own lookup.
- The launch (tile of tokens, warps, splits, blocks of heads) follows rules written in terms of the
  group size, the number of programs per SM and the context length (``choose_tile``, ``choose_splits``,
  ``choose_head_block``); chapter 3 measures the launch they choose.

The kernel is written as small ``@triton.jit`` pieces (the program's setup, the page lookup, one online
softmax step, the final write or combine) so that variants for tuning can reuse them.

Nothing reaches the kernel unchecked: types, shapes, strides, dtypes and devices of every tensor, the
output's size and whether it shares memory with an input, and the launch parameters are checked before
planning; the block table's entries and the lengths (values on the device) are checked where they can be
read without cost or where the caller asks (``check``), since the kernel would read outside the cache.
Triton's interpreter (TRITON_INTERPRET=1, how the kernels run without a GPU) computes ``tl.dot`` of bf16
operands wrongly, so there a plan refuses bf16 tensors (fp16 and fp32 run right).

Chapters: 3.
"""

from __future__ import annotations

import math
import re

import torch
import triton
import triton.language as tl

from lib.kernels import interpreter, launch

LOG2E = 1.4426950408889634
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# combine="auto": up to this many splits the last split program combines them (one launch per call); beyond
# it the serial combine in one program costs more than a second launch that combines in parallel
INLINE_MAX_SPLITS = 8
# with the prefetch and pages smaller than a tile, look up one block-table entry per page (not per token)
# where a tile spans at least this many pages
PER_PAGE_MIN_PAGES = 4


@triton.jit
def _setup(Q, LENS, stride_qb, stride_qh, G: tl.constexpr, BLOCK_G: tl.constexpr,
           HEAD_BLOCKS: tl.constexpr, D: tl.constexpr):
    """This program's request ``b``, (KV head, block of its query heads) ``pair``, KV head, split ``s``,
    the request's length, its query heads (and their mask), the head dimension's offsets and the queries
    [BLOCK_G, D]."""
    b = tl.program_id(0)
    pair = tl.program_id(1)
    kvh = pair // HEAD_BLOCKS
    s = tl.program_id(2)
    seq_len = tl.load(LENS + b)
    g = (pair % HEAD_BLOCKS) * BLOCK_G + tl.arange(0, BLOCK_G)
    gmask = g < G
    heads = kvh * G + g
    dd = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + dd[None, :], mask=gmask[:, None], other=0.0)
    return b, pair, kvh, s, seq_len, heads, gmask, dd, q


@triton.jit
def _first_entries(BT, b, stride_btb, start, BT_W, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                   PREFETCH: tl.constexpr, PER_PAGE: tl.constexpr):
    """The block-table entries of the split's first tile, requested before the loop (with ``PREFETCH``;
    otherwise nothing is loaded). They are masked by the table's width ``BT_W``, not by the request's
    length, so that their load does not wait for the length's: the two are requested together."""
    NP: tl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
    if PAGE % BLOCK_N == 0:  # one entry per tile
        entries = tl.load(BT + b * stride_btb + start // PAGE, mask=PREFETCH & (start // PAGE < BT_W), other=0)
    elif PER_PAGE:  # one entry per page of the tile (start is a multiple of BLOCK_N, hence of PAGE)
        jp = tl.arange(0, NP)
        entries = tl.load(BT + b * stride_btb + start // PAGE + jp, mask=PREFETCH & (start // PAGE + jp < BT_W), other=0)
    else:  # one entry per token
        t_next = start + tl.arange(0, BLOCK_N)
        entries = tl.load(BT + b * stride_btb + t_next // PAGE, mask=PREFETCH & (t_next // PAGE < BT_W), other=0)
    return entries


@triton.jit
def _tile_pages(BT, b, stride_btb, n0, end, entries, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                PREFETCH: tl.constexpr, PER_PAGE: tl.constexpr):
    """Where the tile of tokens n0 .. n0 + BLOCK_N - 1 lies: its page (one for the tile, or one per token),
    the tokens' rows within their pages, the mask of tokens before ``end``, and the next tile's entries
    (with ``PREFETCH``: requested now, used a step later; without, ``entries`` unchanged)."""
    NP: tl.constexpr = BLOCK_N // PAGE if PAGE < BLOCK_N else 1
    t = n0 + tl.arange(0, BLOCK_N)
    tmask = t < end
    if PREFETCH:
        if PAGE % BLOCK_N == 0:  # a tile never crosses a page: one entry, contiguous rows
            page = entries.to(tl.int64)
            entries = tl.load(BT + b * stride_btb + (n0 + BLOCK_N) // PAGE, mask=n0 + BLOCK_N < end, other=0)
            row = n0 % PAGE + tl.arange(0, BLOCK_N)
        elif PER_PAGE:  # small pages: one entry per page, broadcast to its PAGE tokens
            jp = tl.arange(0, NP)
            page = tl.reshape(tl.broadcast_to(entries.to(tl.int64)[:, None], [NP, PAGE]), [BLOCK_N])
            n1 = n0 + BLOCK_N
            entries = tl.load(BT + b * stride_btb + n1 // PAGE + jp, mask=n1 + jp * PAGE < end, other=0)
            row = t % PAGE
        else:  # small pages: one entry per token
            page = entries.to(tl.int64)
            t_next = t + BLOCK_N
            entries = tl.load(BT + b * stride_btb + t_next // PAGE, mask=t_next < end, other=0)
            row = t % PAGE
    elif PAGE % BLOCK_N == 0:
        page = tl.load(BT + b * stride_btb + n0 // PAGE).to(tl.int64)
        row = n0 % PAGE + tl.arange(0, BLOCK_N)
    else:
        page = tl.load(BT + b * stride_btb + t // PAGE, mask=tmask, other=0).to(tl.int64)
        row = t % PAGE
    return page, row, tmask, entries


@triton.jit
def _softmax_step(q, k, m, l_sum, scale_log2, tmask):
    """One tile of the online softmax, in base 2: the tile's weights p = 2^(s - m_new) [BLOCK_G, BLOCK_N]
    for scores s = q.k * scale * log2(e) (masked tokens: -inf), the factor alpha = 2^(m - m_new) that
    rescales what was accumulated before, the new running maximum and the new running sum."""
    scores = tl.dot(q, tl.trans(k)) * scale_log2
    scores = tl.where(tmask[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l_sum = l_sum * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_sum


@triton.jit
def _finish(acc, m, l_sum, Out, PACC, PM, PL, CNT, b, pair, s, heads, gmask, dd, H_Q, H_KV, stride_ob, stride_oh,
            BLOCK_G: tl.constexpr, HEAD_BLOCKS: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
            INLINE: tl.constexpr):
    """The split's end: with one split, the normalised output; otherwise its partial result (acc, m,
    l_sum), and with ``INLINE`` the combine by the last split of the group to arrive."""
    o_ptrs = Out + b * stride_ob + heads[:, None] * stride_oh + dd[None, :]
    if SPLITS == 1:
        out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=gmask[:, None])
    else:
        part = (b * H_Q + heads) * SPLITS  # first partial of each head
        tl.store(PM + part + s, m, mask=gmask)
        tl.store(PL + part + s, l_sum, mask=gmask)
        tl.store(PACC + (part + s)[:, None] * D + dd[None, :], acc, mask=gmask[:, None])
        # INLINE: the last program of the group combines (the atomic is acq_rel: our partials are visible
        # before the count moves, so the last one sees them all); otherwise _combine_kernel runs next
        if INLINE:
            done = tl.atomic_add(CNT + b * H_KV * HEAD_BLOCKS + pair, 1)
            if done == SPLITS - 1:
                # log-sum-exp over the splits, online as in the loop; unrolled, and every value in the
                # layout of the output, so that all the partials' loads can be in flight at once
                m_all = tl.full([BLOCK_G], float("-inf"), tl.float32)
                total = tl.zeros([BLOCK_G], tl.float32)
                out = tl.zeros([BLOCK_G, D], tl.float32)
                for i in tl.static_range(SPLITS):
                    m_i = tl.load(PM + part + i, mask=gmask, other=float("-inf"), cache_modifier=".cg")
                    l_i = tl.load(PL + part + i, mask=gmask, other=0.0, cache_modifier=".cg")
                    a_i = tl.load(PACC + (part + i)[:, None] * D + dd[None, :], mask=gmask[:, None], other=0.0,
                                  cache_modifier=".cg")
                    m_new = tl.maximum(m_all, m_i)
                    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no tokens yet: keep it finite
                    c_old = tl.exp2(m_all - m_ref)
                    c_i = tl.exp2(m_i - m_ref)
                    total = total * c_old + l_i * c_i
                    out = out * c_old[:, None] + a_i * c_i[:, None]
                    m_all = m_new
                out = out / tl.where(total > 0, total, 1.0)[:, None]
                tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=gmask[:, None])
                tl.atomic_xchg(CNT + b * H_KV * HEAD_BLOCKS + pair, 0)  # ready for the next call


@triton.jit
def _decode_kernel(
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
    # meta-parameters
    G: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_BLOCKS: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, INLINE: tl.constexpr, PREFETCH: tl.constexpr,
    PER_PAGE: tl.constexpr,
):
    """One program per (request, KV head and block of its query heads, split): the split's tokens tile by
    tile, K then the scores, then V (so that the scores' arithmetic overlaps V's load), then the write."""
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
        k = tl.load(K + k_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0)
        p, alpha, m, l_sum = _softmax_step(q, k, m, l_sum, scale_log2, tmask)
        v = tl.load(V + v_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    _finish(acc, m, l_sum, Out, PACC, PM, PL, CNT, b, pair, s, heads, gmask, dd, H_Q, H_KV, stride_ob, stride_oh,
            BLOCK_G, HEAD_BLOCKS, D, SPLITS, INLINE)


@triton.jit
def _combine_kernel(PACC, PM, PL, Out, H_Q, stride_ob, stride_oh, SPLITS: tl.constexpr, D: tl.constexpr):
    """One program per (request, query head): all its splits' partials in one load, combined by
    log-sum-exp."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    part = (b * H_Q + h) * SPLITS
    sp = tl.arange(0, SPLITS)
    dd = tl.arange(0, D)
    ms = tl.load(PM + part + sp)
    m_all = tl.max(ms, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.where(ms == float("-inf"), 0.0, tl.exp2(ms - m_all))
    total = tl.sum(tl.load(PL + part + sp) * w, 0)
    acc = tl.load(PACC + (part + sp)[:, None] * D + dd[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + b * stride_ob + h * stride_oh + dd, out.to(Out.dtype.element_ty))


INTERPRETED = interpreter.interpreted(_decode_kernel)  # no GPU: see lib.kernels.interpreter

_WORKSPACE: dict[tuple, tuple[torch.Tensor, ...]] = {}


def _workspace(device, B, H_q, programs, D, splits):
    """Partial results of every split, and one arrival counter per (request, program of the group)."""
    key = (device, B, H_q, programs, D, splits)
    ws = _WORKSPACE.get(key)
    if ws is None:
        ws = (
            torch.empty(B * H_q * splits * D, device=device, dtype=torch.float32),
            torch.empty(B * H_q * splits, device=device, dtype=torch.float32),
            torch.empty(B * H_q * splits, device=device, dtype=torch.float32),
            torch.zeros(B * programs, device=device, dtype=torch.int32),
        )
        _WORKSPACE[key] = ws
    return ws


def choose_splits(programs: int, max_len: int, block_n: int, sms: int, group: int = 1, waves: float = 2.0,
                  most: int = 256) -> int:
    """Splits per (request, KV head): the smallest power of two that gives ``waves`` programs per SM
    (``programs`` before splitting), within three caps: no more splits than the context has tiles of
    ``block_n`` tokens (a split without a whole tile would only add a partial to combine); at most
    ``most``; and at most sqrt(max_len / group), which keeps the partial results one program must combine
    at the end (splits x group rows of d floats) no larger than what each split reads (max_len / splits
    rows). A power of two because the combine kernel loads all of a head's partials as one block.
    Where the caps stop it short of ``waves``, the largest power of two within them."""
    want = math.ceil(waves * sms / max(programs, 1))
    cap = min(max(1, math.ceil(max_len / block_n)), most, max(1, math.isqrt(max(1, max_len // max(group, 1)))))
    splits = 1
    while splits < want and splits * 2 <= cap:
        splits *= 2
    return splits


def wide_and_long(group: int, max_len: int) -> bool:
    """Groups of 32 query heads or more per KV head (MQA-like) over contexts longer than 1024 tokens: the
    case where ``choose_tile`` takes tiles of 64 and the plan asks ``choose_splits`` for one wave of
    programs rather than two. Each split of such a group writes a partial as large as 32 rows of its
    tokens, so fewer, longer splits cost less to combine, and a [group, 64] score block gives each warp
    enough work between the softmax's barriers."""
    return group >= 32 and max_len > 1024


def choose_tile(pairs: int, max_len: int, sms: int, group: int, split_group: int = 1,
                head_blocks: int = 1) -> tuple[int, bool, int]:
    """(block_n, prefetch, num_warps) for ``pairs`` programs before splitting, each serving ``group``
    query heads in ``head_blocks`` blocks (chapter 3).

    - Blocks of heads (``choose_head_block``, short contexts): one program reads the whole context, in
      tiles of 128 with 4 warps: no split, so each program streams its context alone.
    - Groups of up to 16 query heads (one tl.dot of 16 rows) with at most 4 pairs per SM: one warp per
      program and tiles of 16 tokens. The row maxima and sums of the online softmax then stay inside the
      warp (register shuffles); with several warps the compiler passes them between warps through shared
      memory, with a barrier each time, several per tile. Many small programs keep the memory busy
      instead of a few large ones. With more pairs than that the SMs are full anyway and the general
      rule below applies.
    - Groups of 32 or more over more than 1024 tokens (``wide_and_long``): 4 warps and tiles of 64.
    - Few pairs (less than half an SM each) whose splits are short (at most 1024 tokens): 4 warps and
      tiles of 32, so that each program keeps two tiles in flight, the block table prefetched.
    - Otherwise 4 warps and tiles of 64, the block table prefetched for groups of 16 or more (smaller
      groups reach this branch only with more than 4 pairs per SM, enough programs to hide the lookup).

    ``split_group`` is what ``choose_splits`` gets as ``group``."""
    if head_blocks > 1:
        return 128, True, 4
    if group <= 16 and pairs <= 4 * sms:
        return 16, True, 1
    if wide_and_long(group, max_len):
        return 64, True, 4
    splits = choose_splits(pairs, max_len, 32, sms, group=split_group)
    if pairs < sms // 2 and math.ceil(max_len / splits) <= 1024:
        return 32, True, 4
    return 64, group >= 16, 4


def choose_head_block(pairs: int, max_len: int, sms: int, group: int) -> int:
    """Query heads per program (chapter 3): the whole group (padded to 16, the smallest tl.dot), except
    for groups of 32 or more over short contexts (at most 1024 tokens) with enough (request, KV head)
    pairs to fill a quarter of the SMs. There, splitting the context would write partial results as large
    as the context itself (group x d floats per split); blocks of 16 heads give the SMs work instead,
    each block reading the same K and V (from the L2 after the first). Over long contexts the splits
    already fill the SMs and blocks would multiply the bytes read, so the rule keeps them to short ones."""
    if group >= 32 and max_len <= 1024 and pairs >= sms // 4:
        return 16
    return max(16, triton.next_power_of_2(group))


def _power_of_two(name: str, value, least: int, why: str) -> int:
    """``value`` if it is an integer power of two of at least ``least``; otherwise a ValueError naming it."""
    if not launch.whole(value) or value < least or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {least} ({why}), got {value!r}")
    return value


def _check(q, k_cache, v_cache, block_table, seq_lens):
    """Refuse what the kernel cannot take, from the tensors' types, shapes, strides, dtypes and devices
    alone (no values are read): so that nothing wrong reaches the launch."""
    launch.tensors(q=(q, "[B, H_q, d]"), k_cache=(k_cache, "[pages, H_kv, page_size, d]"),
                   v_cache=(v_cache, "[pages, H_kv, page_size, d]"),
                   block_table=(block_table, "int32 [B, pages per request]"), seq_lens=(seq_lens, "int32 [B]"))
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"expected q [B, H_q, d] and k_cache, v_cache [pages, H_kv, page_size, d] of one shape; got q "
            f"{tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    B, H_q, D = q.shape
    _, H_kv, page, Dk = k_cache.shape
    if Dk != D or D < 16 or D & (D - 1):
        raise ValueError(f"head dimension must match (q {D}, cache {Dk}) and be a power of two >= 16")
    if H_kv == 0 or H_q % H_kv:
        raise ValueError(f"H_q={H_q} must be a multiple of H_kv={H_kv} (GQA groups of equal size)")
    if page < 1:
        raise ValueError(f"the cache's page size (k_cache.shape[2]) must be at least 1 token, got {page}")
    if q.dtype not in DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"q, k_cache, v_cache must share one of {DTYPES}; got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError(f"block_table and seq_lens must be int32 tensors (the kernel loads 32-bit entries); got "
                        f"{block_table.dtype} and {seq_lens.dtype}: convert them with .to(torch.int32)")
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"block_table must be [B={B}, pages] and seq_lens [B={B}]; got {tuple(block_table.shape)}, "
                         f"{tuple(seq_lens.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q on {q.device}: the kernel takes every tensor on one "
                             f"device; move it with .to({str(q.device)!r})")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"the last dimension (d) of q, k_cache and v_cache must be contiguous (stride 1); got strides "
                         f"{q.stride()}, {k_cache.stride()}, {v_cache.stride()}: pass .contiguous() copies")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError(f"the last dimension of block_table must be contiguous (the kernel reads a row's entries "
                         f"side by side); got strides {block_table.stride()}: pass block_table.contiguous()")
    if not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens must be contiguous (the kernel reads request b's length at position b); got "
                         f"stride {seq_lens.stride()}: pass seq_lens.contiguous()")


def _check_values(block_table, seq_lens, num_pages, page, max_seq_len=None):
    """Refuse lengths below 0 or past what the request's block-table row holds (or past ``max_seq_len``),
    and block-table entries that name no page of the cache among those the lengths use: the kernel would
    read outside the cache, or skip tokens. Entries past a request's length are never read and may hold
    anything. Reads the values: on a GPU a synchronisation."""
    W = block_table.shape[1]
    capacity = W * page
    limit = capacity if max_seq_len is None else min(capacity, max_seq_len)
    lens = seq_lens.long()
    bad_len = (lens < 0) | (lens > limit)
    used = torch.arange(W, device=lens.device)[None, :] < ((lens.clamp(0, capacity) + page - 1) // page)[:, None]
    bad_entry = used & ((block_table < 0) | (block_table >= num_pages))
    len_wrong, entry_wrong = torch.stack([bad_len.any(), bad_entry.any()]).tolist()
    if len_wrong:
        b = int(bad_len.nonzero()[0, 0])
        n = int(lens[b])
        if n < 0:
            raise ValueError(f"seq_lens[{b}] = {n} is negative: a request holds 0 tokens or more")
        if n > capacity:
            raise ValueError(f"seq_lens[{b}] = {n} is more than block_table's row holds ({W} pages of {page} = "
                             f"{capacity} tokens): give the request more pages or a shorter length")
        raise ValueError(f"seq_lens[{b}] = {n} is more than max_seq_len = {max_seq_len}, which sets the splits' "
                         f"length: tokens past it would be skipped; pass max_seq_len >= max(seq_lens) (or None: the "
                         f"block table's capacity)")
    if entry_wrong:
        b, i = (int(v) for v in bad_entry.nonzero()[0])
        raise ValueError(f"block_table[{b}, {i}] = {int(block_table[b, i])} names no page of the cache (k_cache has "
                         f"{num_pages} pages, 0 .. {num_pages - 1}), and seq_lens[{b}] = {int(lens[b])} uses it: "
                         f"the kernel would read outside the cache")


def _check_out(out, q, inputs: dict):
    """Refuse an output that is not like q (shape, dtype, device, unit stride in d), whose elements share
    memory, or which shares memory with an input."""
    launch.tensors(out=(out, f"[B, H_q, d] {q.dtype}, like q"))
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be like q: {tuple(q.shape)} {q.dtype} on {q.device}; got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    if out.stride(-1) != 1 or launch.internal_overlap(out):
        raise ValueError(f"out must be contiguous in its last dimension and no two of its elements may share memory; "
                         f"got strides {out.stride()}: pass torch.empty_like(q)")
    launch.overlap(out, inputs)


# what the planned call compares with the plan, in the order of the layout tuple
_LAYOUT = tuple(f"{t}.{a}" for a in ("shape", "stride()", "dtype", "device")
                for t in ("q", "k_cache", "v_cache", "block_table", "seq_lens"))


class DecodeAttention:
    """A launch planned once for fixed shapes, strides, dtypes and devices; each call only launches.

    Planning checks the arguments and resolves the launch: blocks of query heads
    (``choose_head_block``), tile, prefetch and warps (``choose_tile``), splits (``choose_splits``) and
    the combine. Calls go through ``lib.kernels.launch``: the first compiles (or finds) the kernel
    through Triton's public path, later ones on a GPU hand the new tensors straight to the compiled
    kernel, skipping host work that costs tens of microseconds per launch. The workspace is shared by
    calls of the same shape: do not run two at once on different streams.

    What planning checks: everything ``decode_attention`` checks of the tensors it is given (types,
    shapes, strides, dtypes, devices; block-table rows and lengths contiguous; no bf16 where the kernel
    runs in Triton's interpreter), the launch parameters,
    and with ``check`` the values of the block table and the lengths (``check=None``: wherever they can
    be read, i.e. not on meta tensors nor during a CUDA graph capture; on a GPU that reads them back, a
    synchronisation).

    What a call checks, and what it assumes: a call compares its tensors' shapes, strides, dtypes and
    devices with the planned ones, and ``out``'s shape, dtype and device with q's (an ``out`` laid out
    otherwise than contiguously is checked in full and takes the public path), and refuses an ``out``
    that shares memory with an input. It reads no values unless asked: it assumes that every length lies
    in 0 .. the planned ``max_seq_len`` (default: the block table's capacity) and that every block-table
    entry a length uses names a page of the cache. ``check=True`` checks those values at this call (a
    synchronisation on a GPU; refused during a CUDA graph capture), ``check=None`` (the default) does it
    on the CPU only, where it costs no synchronisation and Triton's interpreter would otherwise read
    outside the tensors, and ``check=False`` never.

    ``block_n``, ``prefetch`` and ``num_warps`` default to ``choose_tile``'s choice, ``num_splits`` to
    ``choose_splits``' and ``head_block`` to ``choose_head_block``'s.

    ``prefetch``: request the next tile's block-table entries one step ahead. Without it a step's K and V
    loads wait on that step's page lookup, and Triton's software pipeliner then keeps only one tile in
    flight per program (``tiles_in_flight()`` reads it from the compiled kernel); with it,
    ``num_stages - 1`` tiles. Chapter 3 measures both.

    With the prefetch and pages smaller than a tile, a tile that spans ``PER_PAGE_MIN_PAGES`` pages or more
    (and pages of a power of two tokens, so that a tile holds whole pages) loads one block-table entry per
    page and spreads it over the page's tokens in registers; one that spans fewer gathers one entry per
    token (``meta["PER_PAGE"]`` says which).
    """

    def __init__(self, q, k_cache, v_cache, block_table, seq_lens, *, max_seq_len=None, scale=None,
                 num_splits=None, block_n=None, num_warps=None, num_stages=3, combine="auto", prefetch=None,
                 head_block=None, check: bool | None = None):
        _check(q, k_cache, v_cache, block_table, seq_lens)
        interpreter.refuse_bf16(INTERPRETED, q.dtype, "q, k_cache and v_cache are")
        B, H_q, D = q.shape
        num_pages, H_kv, page, _ = k_cache.shape
        G = H_q // H_kv
        capacity = block_table.shape[1] * page
        if max_seq_len is not None and (not launch.whole(max_seq_len) or max_seq_len < 0):
            raise ValueError(f"max_seq_len must be a whole number of tokens >= 0 that bounds seq_lens (or None: the "
                             f"block table's capacity, {capacity}); got {max_seq_len!r}")
        max_len = capacity if max_seq_len is None else max_seq_len
        if combine not in ("auto", "kernel", "inline"):
            raise ValueError(f"combine must be 'auto', 'kernel' (a second, parallel launch) or 'inline' (the last "
                             f"split program combines), got {combine!r}")
        if num_splits is not None:
            _power_of_two("num_splits", num_splits, 1, "the combine loads a head's partials as one block")
        if num_warps is not None:
            _power_of_two("num_warps", num_warps, 1, "Triton's warps per program")
        if not launch.whole(num_stages) or num_stages < 1:
            raise ValueError(f"num_stages must be a whole number >= 1 (the software pipeline's depth), got {num_stages!r}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number (None: d ** -0.5), got {scale!r}")
        if launch.values_readable(check, block_table, seq_lens):
            _check_values(block_table, seq_lens, num_pages, page, max_seq_len)
        sms = launch.sm_count(q.device)
        block_g = choose_head_block(B * H_kv, max_len, sms, G) if head_block is None else head_block
        _power_of_two("head_block", block_g, 16, "the smallest tl.dot")
        block_g = min(block_g, max(16, triton.next_power_of_2(G)))
        head_blocks = triton.cdiv(G, block_g)
        programs = B * H_kv * head_blocks  # before splitting the context
        # an inline combine is serial in one program per group: fewer splits (see choose_splits)
        group = min(G, block_g) if combine == "inline" else 1
        tile, fetch, warps = choose_tile(programs, max_len, sms, G, group, head_blocks)
        block_n = tile if block_n is None else block_n
        _power_of_two("block_n", block_n, 16, "the smallest tl.dot")
        prefetch = fetch if prefetch is None else prefetch
        num_warps = warps if num_warps is None else num_warps
        # blocks of heads (short contexts): one program per block reads the whole context
        waves = 1.0 if wide_and_long(G, max_len) else 2.0
        if num_splits is not None:
            splits = num_splits
        else:
            splits = 1 if head_blocks > 1 else choose_splits(programs, max_len, block_n, sms, group=group, waves=waves)
        if combine == "auto":  # a serial combine of a few partials costs less than a second launch
            combine = "inline" if splits <= INLINE_MAX_SPLITS else "kernel"
        self.combine = combine
        split_len = triton.cdiv(triton.cdiv(max_len, splits), block_n) * block_n
        scale = D ** -0.5 if scale is None else scale
        self.grid = (B, H_kv * head_blocks, splits)
        self.splits = splits
        self.second = splits > 1 and combine == "kernel"  # the combine is a second launch
        self.workspace = _workspace(q.device, B, H_q, H_kv * head_blocks, D, splits)
        self.layout = (q.shape, k_cache.shape, v_cache.shape, block_table.shape, seq_lens.shape,
                       q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), seq_lens.stride(),
                       q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype, seq_lens.dtype,
                       q.device, k_cache.device, v_cache.device, block_table.device, seq_lens.device)
        self.out_like = (q.shape, q.dtype, q.device)
        self.out_stride = (H_q * D, D, 1)  # an output of the plan's own: contiguous
        self.on_cpu = q.device.type == "cpu"
        self.on_meta = q.device.type == "meta"
        self.max_seq_len, self.num_pages, self.page = max_seq_len, num_pages, page
        self.heads = H_q
        self.spans = tuple(launch.span(t) for t in (q, k_cache, v_cache, block_table, seq_lens))
        self.out_span = B * H_q * D * q.element_size()
        self.meta = dict(G=G, BLOCK_G=block_g, HEAD_BLOCKS=head_blocks, D=D, PAGE=page, BLOCK_N=block_n, SPLITS=splits,
                         INLINE=combine == "inline", PREFETCH=bool(prefetch),
                         PER_PAGE=block_n >= PER_PAGE_MIN_PAGES * page and not page & (page - 1))
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        # the inputs' strides equal the planned ones (checked at each call), so their values are fixed here;
        # the output's strides are passed at each call
        self.fixed = (*self.workspace, scale * LOG2E, split_len, H_q, H_kv, block_table.shape[1],
                      q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0))
        self.split_launch = launch.Launch(_decode_kernel, self.grid, self.meta, self.options, q.device)
        self.combine_launch = launch.Launch(_combine_kernel, (B, H_q), dict(SPLITS=splits, D=D), dict(num_warps=4),
                                            q.device)

    def tiles_in_flight(self) -> int | None:
        """K tiles the compiled kernel keeps in flight per program: the depth of its shared-memory ring of
        [block_n, d] buffers, read from the compiled kernel's Triton GPU IR. None before the first call on a
        GPU, or in the interpreter (which compiles nothing)."""
        ck = self.split_launch.compiled
        ir = getattr(ck, "asm", {}).get("ttgir") if ck is not None else None
        if not ir:
            return None
        shape = f"x{self.meta['BLOCK_N']}x{self.meta['D']}x"
        depths = [int(m) for m in re.findall(r"memdesc<(\d+)" + re.escape(shape), ir)]
        return max(depths) if depths else None

    def __call__(self, q, k_cache, v_cache, block_table, seq_lens, out=None, *, check: bool | None = None):
        return self._launch(q, k_cache, v_cache, block_table, seq_lens, out, True, check)

    def partials(self, q, k_cache, v_cache, block_table, seq_lens, *, check: bool | None = None):
        """The split pass alone, for plans that combine in a second launch (``combine="kernel"``, more
        than one split): each split's partial result, not combined, as views of the plan's workspace
        (valid until its next call):

        - ``acc`` [B, H_q, splits, d]: the sum over the split's tokens of 2^(s - m) v, not normalised;
        - ``m`` [B, H_q, splits]: the split's largest score s, in base 2 (s = q.k * scale * log2(e));
          -inf for a split with no tokens;
        - ``l`` [B, H_q, splits]: the sum of 2^(s - m) over the split's tokens.

        The output is sum_i 2^(m_i - M) acc_i / sum_i 2^(m_i - M) l_i with M = max_i m_i, which is what
        the combine computes (chapter 3 times this pass alone and combines its partials by hand).
        ``check`` as for a call."""
        if not self.second:
            raise ValueError(f"this plan combines inside its one launch ({self.splits} split(s), combine="
                             f"{self.combine!r}): plan with combine='kernel' and num_splits > 1 to see the partials")
        self._launch(q, k_cache, v_cache, block_table, seq_lens, None, False, check)
        B, H_q, D = q.shape
        acc, m, l_sum = self.workspace[:3]
        return (acc.view(B, H_q, self.splits, D), m.view(B, H_q, self.splits),
                l_sum.view(B, H_q, self.splits))

    def _refuse(self, q, k_cache, v_cache, block_table, seq_lens, layout):
        """The error for tensors that differ from the planned ones, naming what differs."""
        _check(q, k_cache, v_cache, block_table, seq_lens)  # tensors the kernel cannot take at all: that error
        differ = [f"{name} {got} (planned {want})" for name, got, want in zip(_LAYOUT, layout, self.layout)
                  if got != want]
        raise ValueError(f"tensors differ from the planned shapes, strides, dtypes or devices: {'; '.join(differ)}: "
                         f"make a new DecodeAttention for them (or call decode_attention)")

    def _launch(self, q, k_cache, v_cache, block_table, seq_lens, out, combine, check):
        try:
            layout = (q.shape, k_cache.shape, v_cache.shape, block_table.shape, seq_lens.shape,
                      q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), seq_lens.stride(),
                      q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype, seq_lens.dtype,
                      q.device, k_cache.device, v_cache.device, block_table.device, seq_lens.device)
        except (AttributeError, TypeError):
            layout = None
        if layout != self.layout:
            self._refuse(q, k_cache, v_cache, block_table, seq_lens, layout or ())
        if (check or (check is None and self.on_cpu)) and launch.values_readable(check, block_table, seq_lens):
            _check_values(block_table, seq_lens, self.num_pages, self.page, self.max_seq_len)
        pq, pk, pv, pb, pl = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(), \
            seq_lens.data_ptr()
        if out is None:
            out = torch.empty(self.out_like[0], dtype=self.out_like[1], device=self.out_like[2])
            stride = self.out_stride
        else:
            stride = out.stride() if isinstance(out, torch.Tensor) else None
            if stride != self.out_stride or (out.shape, out.dtype, out.device) != self.out_like:
                _check_out(out, q, dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                        seq_lens=seq_lens))
            elif not self.on_meta:  # out laid out as planned: its byte range against the inputs' (planned) ones
                o = out.data_ptr()
                e = o + self.out_span
                sq, sk, sv, sb, sl = self.spans
                if (pq < e and o < pq + sq) or (pk < e and o < pk + sk) or (pv < e and o < pv + sv) \
                        or (pb < e and o < pb + sb) or (pl < e and o < pl + sl):
                    launch.overlap(out, dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                             seq_lens=seq_lens))
        if self.grid[0] == 0:
            return out
        direct = stride == self.out_stride and not (out.data_ptr() | pq | pk | pv | pb | pl) % 16
        self.split_launch(q, k_cache, v_cache, block_table, seq_lens, out, *self.fixed, stride[0], stride[1],
                          direct=direct)
        if self.second and combine:
            self.combine_launch(*self.workspace[:3], out, self.heads, stride[0], stride[1], direct=direct)
        return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_seq_len: int | None = None,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    combine: str = "auto",
    head_block: int | None = None,
    check: bool | None = None,
) -> torch.Tensor:
    """Attention of one query token per request over a paged KV cache; returns [B, H_q, d].

    q: [B, H_q, d]. k_cache, v_cache: [num_pages, H_kv, page_size, d], H_q a multiple of H_kv, d a
    power of two >= 16, each contiguous in d; any page size. block_table: [B, pages_per_request] int32.
    seq_lens: [B] int32, each between 0 (an output of zeros) and pages_per_request * page_size; the
    entries of block_table that a length uses must name pages of the cache (0 .. num_pages - 1), the
    others are never read. ``max_seq_len`` bounds seq_lens (default: the block table's capacity); it
    sets the split length. All on one device. ``out``: like q, sharing no memory with the inputs.

    Everything but the values is checked before the launch, with an error that says what to change;
    block_table and seq_lens are made contiguous where they are not. ``check``: read the values and
    refuse lengths or entries out of range. None (the default): wherever they can be read, i.e. not on
    meta tensors nor during a CUDA graph capture (on a GPU that is a synchronisation); True: always (an
    error where they cannot be read); False: never (the caller vouches for them).
    For repeated calls of one shape, ``DecodeAttention`` plans once and launches with less host time.
    """
    launch.tensors(block_table=(block_table, "int32 [B, pages per request]"), seq_lens=(seq_lens, "int32 [B]"))
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    plan = DecodeAttention(q, k_cache, v_cache, block_table, seq_lens, max_seq_len=max_seq_len, scale=scale,
                           num_splits=num_splits, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                           combine=combine, head_block=head_block, check=check)
    return plan(q, k_cache, v_cache, block_table, seq_lens, out=out, check=False)  # the values: checked at planning


def paginate(dense: torch.Tensor, page_size: int, generator: torch.Generator | None = None,
             block_table: torch.Tensor | None = None):
    """A dense cache [B, H_kv, L, d] copied into pages [B * ceil(L/page_size), H_kv, page_size, d] placed in
    a random order, with the block table [B, ceil(L/page_size)] (int32) that finds them. Pass the block
    table of an earlier call (the K cache's) to lay out the V cache the same way."""
    B, H_kv, L, D = dense.shape
    per = triton.cdiv(L, page_size)
    if block_table is None:
        block_table = torch.randperm(B * per, generator=generator).to(dense.device).view(B, per).to(torch.int32)
    elif block_table.shape != (B, per):
        raise ValueError(f"block_table must be [{B}, {per}] for this cache, got {tuple(block_table.shape)}")
    pages = torch.zeros(B * per, H_kv, page_size, D, dtype=dense.dtype, device=dense.device)
    padded = torch.zeros(B, H_kv, per * page_size, D, dtype=dense.dtype, device=dense.device)
    padded[:, :, :L] = dense
    chunks = padded.view(B, H_kv, per, page_size, D).permute(0, 2, 1, 3, 4).reshape(B * per, H_kv, page_size, D)
    pages[block_table.view(-1).long()] = chunks
    return pages, block_table


def dense_as_paged(dense: torch.Tensor):
    """A dense cache [B, H_kv, L, d] viewed as one page per request: (cache, block_table), no copy."""
    B = dense.shape[0]
    return dense, torch.arange(B, dtype=torch.int32, device=dense.device).view(B, 1)


def combine_partials(acc: torch.Tensor, m: torch.Tensor, l_sum: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Combine the splits' partial results of ``DecodeAttention.partials`` by log-sum-exp, in ``dtype``:
    [B, H_q, splits, d], [B, H_q, splits], [B, H_q, splits] -> [B, H_q, d]. What the combine kernel does,
    written in torch; splits without tokens (m = -inf) weigh nothing."""
    acc, m, l_sum = acc.to(dtype), m.to(dtype), l_sum.to(dtype)
    top = m.max(dim=-1, keepdim=True).values
    w = torch.exp2(m - torch.where(torch.isinf(top), 0.0, top))  # 2^(m_i - M); a request with no tokens: all 0
    total = (l_sum * w).sum(-1, keepdim=True)
    return (acc * w[..., None]).sum(-2) / torch.where(total > 0, total, 1.0)


def reference(q, k_cache, v_cache, block_table, seq_lens, scale=None, dtype=torch.float32):
    """Dense attention over the gathered cache in ``dtype`` (float32 or float64), request by request."""
    B, H_q, D = q.shape
    H_kv, page = k_cache.shape[1], k_cache.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out = torch.empty(B, H_q, D, dtype=dtype, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        pages = block_table[b, : triton.cdiv(n, page)].long()
        k = k_cache[pages].to(dtype).permute(1, 0, 2, 3).reshape(H_kv, -1, D)[:, :n]
        v = v_cache[pages].to(dtype).permute(1, 0, 2, 3).reshape(H_kv, -1, D)[:, :n]
        k = k.repeat_interleave(H_q // H_kv, dim=0)
        v = v.repeat_interleave(H_q // H_kv, dim=0)
        w = torch.softmax(torch.einsum("hd,hnd->hn", q[b].to(dtype), k) * scale, dim=-1)
        out[b] = torch.einsum("hn,hnd->hd", w, v)
    return out
