"""Decode attention over an FP8 (e4m3) KV cache: chapter 3's kernel reading one byte per cached value.

At decode, attention reads the whole KV cache of every request once per step; stored in float8 e4m3 (one
byte) instead of bf16 (two), the cache is half the bytes to read, and twice the tokens fit in the same
memory. The cache holds K / k_scale and V / v_scale, with one scale per tensor (``lib.quant.quantize_kv_fp8``,
as vLLM's ``kv_cache_dtype="fp8"`` with per-tensor scales). The kernel is ``lib.kernels.decode_attention``'s,
built from the same pieces, with two changes:

- each K and V tile is converted in registers as it is loaded, to fp16 for a 16-bit q: on Hopper one
  instruction turns two e4m3 values into two fp16 ones, while bf16 has no such conversion and costs
  several instructions per value, enough to make the 8-bit cache slower than the 16-bit one. q (and the
  probabilities) are converted to fp16 too, once per program: attention's queries lie far inside fp16's
  range (a float32 q stays float32). The online softmax is unchanged, in float32;
- k_scale multiplies the softmax scale (q . (k_scale K8) = k_scale (q . K8)) and v_scale the output (the
  output is linear in V), so the scales cost two multiplies per program, nothing per value.

``DecodeAttentionFP8`` plans a launch by the same rules as ``DecodeAttention``'s defaults (blocks of heads,
tile, warps, splits, combine), except that where those take tiles of 16 tokens and one warp over long
splits it takes wider tiles (``wider_tiles``): a tile of one-byte values is half the bytes. It calls the
launch as ``DecodeAttention`` does; ``decode_attention_fp8`` plans and calls once.

Chapters: 9.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from lib.kernels import decode_attention as da
from lib.kernels import launch

KV_DTYPES = (torch.float8_e4m3fn,)


@triton.jit
def _decode_fp8_kernel(
    Q, K, V, BT, LENS, Out, PACC, PM, PL, CNT,
    scale_log2, v_scale, split_len, H_Q, H_KV, BT_W,
    stride_qb, stride_qh,
    stride_kp, stride_kh, stride_kt,
    stride_vp, stride_vh, stride_vt,
    stride_btb,
    stride_ob, stride_oh,
    G: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_BLOCKS: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, INLINE: tl.constexpr, PREFETCH: tl.constexpr,
    PER_PAGE: tl.constexpr, DOT: tl.constexpr,
):
    """``decode_attention._decode_kernel`` with the tiles of K and V loaded as e4m3 and converted to DOT
    (the products' dtype; q converted to it once); ``scale_log2`` includes k_scale, and the split's sum is
    multiplied by ``v_scale``."""
    b, pair, kvh, s, seq_len, heads, gmask, dd, q = da._setup(Q, LENS, stride_qb, stride_qh, G, BLOCK_G,
                                                              HEAD_BLOCKS, D)
    q = q.to(DOT)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    start = s * split_len
    end = tl.minimum(start + split_len, seq_len)
    entries = da._first_entries(BT, b, stride_btb, start, BT_W, PAGE, BLOCK_N, PREFETCH, PER_PAGE)
    for n0 in range(start, end, BLOCK_N):
        page, row, tmask, entries = da._tile_pages(BT, b, stride_btb, n0, end, entries, PAGE, BLOCK_N, PREFETCH,
                                                   PER_PAGE)
        k_off = page * stride_kp + kvh * stride_kh + row * stride_kt
        v_off = page * stride_vp + kvh * stride_vh + row * stride_vt
        k = tl.load(K + k_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0).to(DOT)
        p, alpha, m, l_sum = da._softmax_step(q, k, m, l_sum, scale_log2, tmask)
        v = tl.load(V + v_off[:, None] + dd[None, :], mask=tmask[:, None], other=0.0).to(DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    acc = acc * v_scale  # the output is linear in V: its scale once, at the end
    da._finish(acc, m, l_sum, Out, PACC, PM, PL, CNT, b, pair, s, heads, gmask, dd, H_Q, H_KV, stride_ob, stride_oh,
               BLOCK_G, HEAD_BLOCKS, D, SPLITS, INLINE)


# where the 16-bit rule takes tiles of 16 tokens with one warp and each split reads at least LONG_SPLIT
# tokens, the 8-bit cache takes tiles of WIDE_TILE (tokens, warps): a tile of 16 one-byte tokens is too
# little to keep in flight (on the H200, 1.5-1.7 times faster at 4k-64k tokens, batches 1 and 16)
LONG_SPLIT = 1024
WIDE_TILE = (64, 2)


def wider_tiles(block_n: int, num_warps: int, split_len: int) -> bool:
    """Whether the plan widens the 16-bit rule's tile for the 8-bit cache (see ``WIDE_TILE``)."""
    return (block_n, num_warps) == (16, 1) and split_len >= LONG_SPLIT


def _meta(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=dtype or t.dtype, device="meta")


def _check(q, k_cache, v_cache, block_table, seq_lens, k_scale=1.0, v_scale=1.0):
    """Refuse what the kernel cannot take: the caches of ``KV_DTYPES``, the scales finite and positive, and
    everything else as ``decode_attention`` checks it (on stand-ins of q's dtype with the caches' shapes)."""
    launch.tensors(q=(q, "[B, H_q, d]"), k_cache=(k_cache, "e4m3 [pages, H_kv, page_size, d]"),
                   v_cache=(v_cache, "e4m3 [pages, H_kv, page_size, d]"),
                   block_table=(block_table, "int32 [B, pages per request]"), seq_lens=(seq_lens, "int32 [B]"))
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a finite number > 0 (the cache holds values / {name}), got {v!r}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in KV_DTYPES:
            raise TypeError(f"{name} must hold {KV_DTYPES} (lib.quant.quantize_kv_fp8 makes it), got {t.dtype}; a "
                            f"cache in q's dtype is read by lib.kernels.decode_attention")
    da._check(_meta(q), _meta(k_cache, q.dtype), _meta(v_cache, q.dtype), _meta(block_table), _meta(seq_lens))
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q on {q.device}: the kernel takes every tensor on one "
                             f"device; move it with .to({str(q.device)!r})")


class DecodeAttentionFP8(da.DecodeAttention):
    """Decode attention planned once for an e4m3 cache with scales ``k_scale``, ``v_scale`` (see the module):
    the launch ``DecodeAttention`` plans by default for a cache of q's dtype of the same shape, with this
    module's kernel; called as ``DecodeAttention`` is."""

    def __init__(self, q, k_cache, v_cache, block_table, seq_lens, *, k_scale: float, v_scale: float,
                 max_seq_len=None, scale=None, block_n: int | None = None, num_warps: int | None = None,
                 num_splits: int | None = None, num_stages: int = 3, check: bool | None = None):
        _check(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale)
        B, H_q, D = q.shape
        num_pages, H_kv, page, _ = k_cache.shape
        G = H_q // H_kv
        if max_seq_len is not None and (not launch.whole(max_seq_len) or max_seq_len < 0):
            raise ValueError(f"max_seq_len must be a whole number of tokens >= 0 that bounds seq_lens, got "
                             f"{max_seq_len!r}")
        max_len = block_table.shape[1] * page if max_seq_len is None else max_seq_len
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number (None: d ** -0.5), got {scale!r}")
        if launch.values_readable(check, block_table, seq_lens):
            da._check_values(block_table, seq_lens, num_pages, page, max_seq_len)
        sms = launch.sm_count(q.device)
        # the default plan's rules (DecodeAttention with no launch parameter given)
        block_g = min(da.choose_head_block(B * H_kv, max_len, sms, G), max(16, triton.next_power_of_2(G)))
        head_blocks = triton.cdiv(G, block_g)
        programs = B * H_kv * head_blocks
        tile, prefetch, warps = da.choose_tile(programs, max_len, sms, G, 1, head_blocks)
        block_n = tile if block_n is None else da._power_of_two("block_n", block_n, 16, "the smallest tl.dot")
        num_warps = warps if num_warps is None else da._power_of_two("num_warps", num_warps, 1, "warps per program")
        waves = 1.0 if da.wide_and_long(G, max_len) else 2.0
        if num_splits is not None:
            splits = da._power_of_two("num_splits", num_splits, 1, "the combine loads a head's partials as one block")
        else:
            splits = 1 if head_blocks > 1 else da.choose_splits(programs, max_len, block_n, sms, waves=waves)
        if (block_n, num_warps) == (tile, warps) and wider_tiles(tile, warps, triton.cdiv(max_len, splits)):
            block_n, num_warps = WIDE_TILE
        self.combine = "inline" if splits <= da.INLINE_MAX_SPLITS else "kernel"
        split_len = triton.cdiv(triton.cdiv(max_len, splits), block_n) * block_n
        scale = D ** -0.5 if scale is None else scale
        self.grid = (B, H_kv * head_blocks, splits)
        self.splits = splits
        self.second = splits > 1 and self.combine == "kernel"
        self.workspace = da._workspace(q.device, B, H_q, H_kv * head_blocks, D, splits)
        self.layout = (q.shape, k_cache.shape, v_cache.shape, block_table.shape, seq_lens.shape,
                       q.stride(), k_cache.stride(), v_cache.stride(), block_table.stride(), seq_lens.stride(),
                       q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype, seq_lens.dtype,
                       q.device, k_cache.device, v_cache.device, block_table.device, seq_lens.device)
        self.out_like, self.out_stride = (q.shape, q.dtype, q.device), (H_q * D, D, 1)
        self.on_cpu, self.on_meta = q.device.type == "cpu", q.device.type == "meta"
        self.max_seq_len, self.num_pages, self.page, self.heads = max_seq_len, num_pages, page, H_q
        self.spans = tuple(launch.span(t) for t in (q, k_cache, v_cache, block_table, seq_lens))
        self.out_span = B * H_q * D * q.element_size()
        self.meta = dict(G=G, BLOCK_G=block_g, HEAD_BLOCKS=head_blocks, D=D, PAGE=page, BLOCK_N=block_n,
                         SPLITS=splits, INLINE=self.combine == "inline", PREFETCH=bool(prefetch),
                         PER_PAGE=block_n >= da.PER_PAGE_MIN_PAGES * page and not page & (page - 1))
        self.meta["DOT"] = tl.float32 if q.dtype == torch.float32 else tl.float16
        if not launch.whole(num_stages) or num_stages < 1:
            raise ValueError(f"num_stages must be a whole number >= 1 (the software pipeline's depth), got {num_stages!r}")
        self.options = dict(num_warps=num_warps, num_stages=num_stages)
        self.k_scale, self.v_scale = float(k_scale), float(v_scale)
        self.fixed = (*self.workspace, scale * self.k_scale * da.LOG2E, self.v_scale, split_len, H_q, H_kv,
                      block_table.shape[1], q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
                      block_table.stride(0))
        self.split_launch = launch.Launch(_decode_fp8_kernel, self.grid, self.meta, self.options, q.device)
        self.combine_launch = launch.Launch(da._combine_kernel, (B, H_q), dict(SPLITS=splits, D=D),
                                            dict(num_warps=4), q.device)

    def _refuse(self, q, k_cache, v_cache, block_table, seq_lens, layout):
        _check(q, k_cache, v_cache, block_table, seq_lens)
        differ = [f"{name} {got} (planned {want})" for name, got, want in zip(da._LAYOUT, layout, self.layout)
                  if got != want]
        raise ValueError(f"tensors differ from the planned shapes, strides, dtypes or devices: {'; '.join(differ)}: "
                         f"make a new DecodeAttentionFP8 for them (or call decode_attention_fp8)")


def decode_attention_fp8(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                         seq_lens: torch.Tensor, *, k_scale: float, v_scale: float, max_seq_len: int | None = None,
                         scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query token per request over a paged e4m3 KV cache holding K / k_scale and
    V / v_scale (see the module); returns [B, H_q, d] in q's dtype. The arguments as
    ``lib.kernels.decode_attention.decode_attention``'s."""
    launch.tensors(block_table=(block_table, "int32 [B, pages per request]"), seq_lens=(seq_lens, "int32 [B]"))
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    plan = DecodeAttentionFP8(q, k_cache, v_cache, block_table, seq_lens, k_scale=k_scale, v_scale=v_scale,
                              max_seq_len=max_seq_len, scale=scale)
    return plan(q, k_cache, v_cache, block_table, seq_lens, out=out, check=False)
