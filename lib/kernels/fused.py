"""Small fused kernels of a decode step: each replaces several PyTorch operators that read and write the
same few kilobytes, so that a step launches fewer kernels (chapter 7).

- ``rmsnorm(x, weight, eps, residual=None)``: with a residual, h = x + residual, then RMSNorm of h times
  the weight; returns (normed, h). One program per row, the sum of squares in float32. It replaces the
  eager step's addmm-with-residual plus ``F.rms_norm`` (the residual add moves out of the GEMM into the
  norm that reads the sum anyway).
- ``rope_write(qkv, pos, inv_freq, k_cache, v_cache, table, block_size)``: the rotary embedding applied
  to the query and key heads of the fused QKV projection's output, the query returned as [B, H_q, d] and
  the new token's K and V written into their page of the paged pool, in one launch (the eager step takes
  nine: the angles, the halves, the products, the concatenation, two strided copies and two index copies).
- ``silu_mul(gu)``: SwiGLU's activation silu(gate) * up from the fused gate-up projection's output
  [B, 2 I] (two launches and a [B, I] intermediate in the eager step).

``rmsnorm`` and ``rope_write`` also take their input as the float32 partial sums of a split-K GEMM
([splits, B, N], ``skinny_gemm.skinny_mm(..., reduce=False)``) and add them as they load them, in the order
the GEMM's own reduction would and rounded as it would store them (the same values), so that the product
needs no reduction kernel of its own.

All take fp16, bf16 or fp32 and compute in fp32. On a CPU they run in Triton's interpreter, bf16 included
(they use no ``tl.dot``, the operation the interpreter computes wrongly in bf16).

``rope_write`` is the one kernel that writes into the KV cache, so its slots are guarded twice: the wrapper
checks the positions and block-table entries where reading them costs nothing or where asked (``check``),
and the kernel itself writes no row whose slot lies outside the cache (a position below 0 or past its
block-table row, an entry below 0 or past the pool's blocks), so that no input, checked or not, in a CUDA
graph or not, writes outside the caches.

Chapter: 7.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lib.kernels import launch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def _check(name: str, t: torch.Tensor, dims: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be fp16, bf16 or fp32, got {t.dtype}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride 1), got strides {t.stride()}: "
                         "pass .contiguous()")


def _check_input(name: str, t: torch.Tensor) -> int:
    """A kernel input of rows: [B, N], or the float32 partial sums [splits, B, N] of a split-K GEMM. Returns
    the number of splits (1 for [B, N])."""
    if isinstance(t, torch.Tensor) and t.dim() == 3:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} as partial sums [splits, B, N] must be contiguous float32, got {t.dtype}")
        return t.shape[0]
    _check(name, t, 2)
    return 1


@triton.jit
def _load_sum(ptr, offs, mask, stride_s, SPLITS: tl.constexpr):
    """The float32 sum of the SPLITS partial values at ptr + s * stride_s + offs, added in the order of s."""
    x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLITS):
        x += tl.load(ptr + s * stride_s + offs, mask=mask, other=0.0).to(tl.float32)
    return x


# ---------------------------------------------------------------------------- residual add + RMSNorm

@triton.jit
def _rmsnorm_kernel(X, R, W, OUT, H, N, eps, stride_x, stride_r, stride_o, stride_h, stride_s,
                    HAS_RES: tl.constexpr, STORE_H: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = _load_sum(X, row * stride_x + cols, mask, stride_s, SPLITS)
    if SPLITS > 1:  # round the sum to the outputs' dtype, as a reduced product would be stored
        x = x.to(H.dtype.element_ty).to(tl.float32)
    if HAS_RES:
        x += tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    if STORE_H:
        h = x.to(H.dtype.element_ty)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)  # normalise the sum as stored, as the unfused step does
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (x * rstd * w).to(OUT.dtype.element_ty), mask=mask)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of each row of x [B, N] (of x + residual, if given) times ``weight`` [N]: returns (normed, h)
    with h the sum x + residual (x itself without a residual), both in x's dtype. x may also be the float32
    partial sums [splits, B, N] of a split-K GEMM; then the outputs take the residual's dtype (the weight's
    without one)."""
    splits = _check_input("x", x)
    _check("weight", weight, 1)
    B, N = x.shape[-2:]
    if weight.shape[0] != N:
        raise ValueError(f"weight has {weight.shape[0]} values for rows of {N}")
    if residual is not None:
        _check("residual", residual, 2)
        if residual.shape != (B, N):
            raise ValueError(f"residual {tuple(residual.shape)} must match x's rows {(B, N)}")
    dtype = x.dtype if x.dim() == 2 else (residual if residual is not None else weight).dtype
    out = torch.empty(B, N, device=x.device, dtype=dtype)
    keep = residual is not None or x.dim() == 3  # h must be written
    h = torch.empty(B, N, device=x.device, dtype=dtype) if keep else x
    if B and N:  # rows of no columns: nothing to normalise
        r = residual if residual is not None else out
        _rmsnorm_kernel[(B,)](x, r, weight, out, h, N, float(eps), x.stride(-2), r.stride(0), out.stride(0), h.stride(0),
                              x.stride(0) if x.dim() == 3 else 0, HAS_RES=residual is not None, STORE_H=keep, SPLITS=splits,
                              BLOCK=triton.next_power_of_2(N))
    return out, h


# ---------------------------------------------------------------------------- RoPE + the K/V write

@triton.jit
def _rope_write_kernel(QKV, POS, INV, Q, KC, VC, TABLE, stride_qkv, stride_q, stride_qh, stride_t, stride_s,
                       TABLE_W, BLOCKS,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr):
    """Program (b, head): row b's query head rotated into Q, or its key head rotated (its value head as it is)
    written at the token's slot of the cache. A slot outside the cache (a position below 0 or past the
    TABLE_W entries of the row, an entry below 0 or from BLOCKS on) is not written, and the entry of a
    position outside the row is not read."""
    b = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. HQ-1: query heads; HQ .. HQ+HKV-1: key heads; then value heads
    half = tl.arange(0, D // 2)
    src = QKV + b * stride_qkv + head * D
    pos = tl.load(POS + b)
    if head < HQ + HKV:  # rotate the pairs (x[i], x[i + d/2]) by pos * inv_freq[i]
        ang = pos.to(tl.float32) * tl.load(INV + half)
        c, s = tl.cos(ang), tl.sin(ang)
        x1 = _load_sum(src, half, half < D, stride_s, SPLITS)
        x2 = _load_sum(src, D // 2 + half, half < D, stride_s, SPLITS)
        if SPLITS > 1:  # round the sums to the cache's dtype, as a reduced product would be stored
            x1, x2 = x1.to(KC.dtype.element_ty).to(tl.float32), x2.to(KC.dtype.element_ty).to(tl.float32)
        y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        y1 = _load_sum(src, half, half < D, stride_s, SPLITS)
        y2 = _load_sum(src, D // 2 + half, half < D, stride_s, SPLITS)
    if head < HQ:
        dst = Q + b * stride_q + head * stride_qh
        tl.store(dst + half, y1.to(Q.dtype.element_ty))
        tl.store(dst + D // 2 + half, y2.to(Q.dtype.element_ty))
    else:
        kv = head - HQ if head < HQ + HKV else head - HQ - HKV
        inside = (pos >= 0) & (pos // PAGE < TABLE_W)  # the position has an entry in the row
        block = tl.load(TABLE + b * stride_t + pos // PAGE, mask=inside, other=-1).to(tl.int64)
        slot = (half < D // 2) & inside & (block >= 0) & (block < BLOCKS)  # the entry names a block of the pool
        row = ((block * HKV + kv) * PAGE + pos % PAGE) * D  # the page layout [blocks, H_kv, PAGE, d]
        if head < HQ + HKV:
            tl.store(KC + row + half, y1.to(KC.dtype.element_ty), mask=slot)
            tl.store(KC + row + D // 2 + half, y2.to(KC.dtype.element_ty), mask=slot)
        else:
            tl.store(VC + row + half, y1.to(VC.dtype.element_ty), mask=slot)
            tl.store(VC + row + D // 2 + half, y2.to(VC.dtype.element_ty), mask=slot)


def _check_slots(pos: torch.Tensor, table: torch.Tensor, page: int, blocks: int) -> None:
    """Refuse positions below 0 or past what their block-table row holds, and entries that name no block of
    the cache at the positions' slots: the kernel would write outside the cache (it skips such rows
    instead, so the token's K and V would be lost). Reads the values: on a GPU a synchronisation."""
    W = table.shape[1]
    p = pos.long()
    bad_pos = (p < 0) | (p >= W * page)
    if W:
        entry = table.gather(1, (p.clamp(0, W * page - 1) // page)[:, None])[:, 0].long()
        bad_entry = ~bad_pos & ((entry < 0) | (entry >= blocks))
    else:
        entry, bad_entry = p, torch.zeros_like(bad_pos)
    pos_wrong, entry_wrong = torch.stack([bad_pos.any(), bad_entry.any()]).tolist()
    if pos_wrong:
        b = int(bad_pos.nonzero()[0, 0])
        n = int(p[b])
        if n < 0:
            raise ValueError(f"pos[{b}] = {n} is negative: a token's position is 0 or more (the length before it)")
        raise ValueError(f"pos[{b}] = {n} is past what table's row holds ({W} blocks of {page} = {W * page} "
                         f"positions, 0 .. {W * page - 1}): give the request a block for it in the table first")
    if entry_wrong:
        b = int(bad_entry.nonzero()[0, 0])
        i = int(p[b]) // page
        raise ValueError(f"table[{b}, {i}] = {int(entry[b])} names no block of the cache (k_cache has {blocks} "
                         f"blocks{f', 0 .. {blocks - 1}' if blocks else ''}), and pos[{b}] = {int(p[b])} writes into "
                         f"it: the kernel would write outside the cache")


def _check_rope(qkv, pos, inv_freq, k_cache, v_cache, table, heads) -> int:
    """Refuse what ``rope_write`` cannot take, from types, shapes, strides, dtypes and devices (no values
    are read); the number of splits of ``qkv``."""
    if not (isinstance(pos, torch.Tensor) and isinstance(inv_freq, torch.Tensor) and isinstance(table, torch.Tensor)):
        launch.tensors(pos=(pos, "int64 or int32 [B], each token's position"),
                       inv_freq=(inv_freq, "float32 [d/2], the rotary frequencies"),
                       table=(table, "int32 [B, blocks per request], the block table"))
    splits = _check_input("qkv", qkv)
    _check("k_cache", k_cache, 4)
    if not (isinstance(v_cache, torch.Tensor) and v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype):
        _check("v_cache", v_cache, 4)
        raise ValueError(f"k_cache and v_cache must have one shape and dtype (one slot offset serves both); got "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [blocks, H_kv, page, d] (the kernel computes each slot's "
                             f"offset from that layout); got strides {t.stride()}: pass {name}.contiguous()")
    if not launch.whole(heads) or heads < 1:
        raise ValueError(f"heads must be a whole number >= 1 (the query heads of qkv), got {heads!r}")
    _, hkv, page, d = k_cache.shape
    B = qkv.shape[-2]
    if hkv < 1 or page < 1:
        raise ValueError(f"the caches [blocks, H_kv, page, d] need H_kv >= 1 and a page of at least 1 token; got "
                         f"{tuple(k_cache.shape)}")
    if d < 2 or d & (d - 1):
        raise ValueError(f"head_dim (the caches' last dimension) must be a power of two >= 2 (RoPE rotates halves of "
                         f"a power of two), got {d}")
    if qkv.shape[-1] != (heads + 2 * hkv) * d:
        raise ValueError(f"qkv has {qkv.shape[-1]} columns; {heads} query and 2 x {hkv} KV heads of {d} need "
                         f"{(heads + 2 * hkv) * d}")
    if pos.shape != (B,) or table.dim() != 2 or table.shape[0] != B or inv_freq.shape != (d // 2,):
        raise ValueError(f"need pos [{B}], table [{B}, pages] and inv_freq [{d // 2}], got {tuple(pos.shape)}, "
                         f"{tuple(table.shape)} and {tuple(inv_freq.shape)}")
    if pos.dtype not in INDEX_DTYPES:
        raise TypeError(f"pos must hold integer positions (int64 or int32), got {pos.dtype}: a position counts "
                        f"tokens; pass pos.long() (e.g. lens.long() - 1)")
    if table.dtype not in INDEX_DTYPES:
        raise TypeError(f"table must hold integer block numbers (int32 or int64), got {table.dtype}: pass "
                        f"table.to(torch.int32)")
    if not inv_freq.is_floating_point():
        raise TypeError(f"inv_freq must be a float tensor (the rotary frequencies, float32), got {inv_freq.dtype}")
    dev = qkv.device
    for name, t in (("pos", pos), ("inv_freq", inv_freq), ("table", table), ("k_cache", k_cache),
                    ("v_cache", v_cache)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but qkv on {dev}: the kernel takes every tensor on one "
                             f"device; move it with .to({str(dev)!r})")
    for name, t in (("pos", pos), ("inv_freq", inv_freq)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel reads element i at position i); got stride "
                             f"{t.stride()}: pass {name}.contiguous()")
    if table.stride(1) != 1 and table.shape[1] > 1:
        raise ValueError(f"table's rows must be contiguous (the kernel reads entry i of a row at position i); got "
                         f"strides {table.stride()}: pass table.contiguous()")
    return splits


def rope_write(qkv: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, table: torch.Tensor, heads: int, *, check: bool | None = None) -> torch.Tensor:
    """One decode token per row of ``qkv`` [B, (H_q + 2 H_kv) d] (query, key and value heads side by side):
    the query heads rotated by RoPE at position ``pos[b]`` are returned as [B, H_q, d]; the rotated key and
    the value are written into the paged caches [blocks, H_kv, page, d] at the token's slot, block
    ``table[b, pos // page]``. ``inv_freq`` [d/2] (float32) are the rotary frequencies. ``qkv`` may also be
    the float32 partial sums [splits, B, (H_q + 2 H_kv) d] of a split-K GEMM; q then takes the cache's dtype.
    ``pos`` int64 or int32 [B]; ``table`` int32 or int64 [B, blocks per request], rows contiguous; all on
    one device.

    Everything but the values is checked at every call, with an error that says what to change. The slot of
    row b must exist: 0 <= pos[b] < table.shape[1] * page, and table[b, pos[b] // page] in 0 .. blocks - 1.
    ``check``: read pos and table and refuse a slot that does not. None (the default): on the CPU only,
    where it costs no synchronisation; True: always (on a GPU a synchronisation; refused during a CUDA graph
    capture); False: never. Unchecked, a row without a slot is not written (its query is still returned):
    the kernel masks its K and V writes, so nothing outside the caches is ever written."""
    splits = _check_rope(qkv, pos, inv_freq, k_cache, v_cache, table, heads)
    blocks, hkv, page, d = k_cache.shape
    B = qkv.shape[-2]
    if (check or (check is None and qkv.device.type == "cpu")) and launch.values_readable(check, pos, table):
        _check_slots(pos, table, page, blocks)
    q = torch.empty(B, heads, d, device=qkv.device, dtype=qkv.dtype if qkv.dim() == 2 else k_cache.dtype)
    if B:
        _rope_write_kernel[(B, heads + 2 * hkv)](qkv, pos, inv_freq, q, k_cache, v_cache, table, qkv.stride(-2),
                                                 q.stride(0), q.stride(1), table.stride(0),
                                                 qkv.stride(0) if qkv.dim() == 3 else 0, table.shape[1], blocks,
                                                 HQ=heads, HKV=hkv, D=d, PAGE=page, SPLITS=splits)
    return q


# ---------------------------------------------------------------------------- SwiGLU

@triton.jit
def _silu_mul_kernel(GU, OUT, WIDTH, stride_gu, stride_o, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    g = tl.load(GU + b * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + b * stride_gu + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + b * stride_o + cols, (g / (1.0 + tl.exp(-g)) * u).to(OUT.dtype.element_ty), mask=mask)


def silu_mul(gu: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """silu(gate) * up for gu [B, 2 I] holding gate and up side by side: [B, I]. ``block``: the columns of one
    program, a power of two (a Triton block)."""
    _check("gu", gu, 2)
    B, two_i = gu.shape
    if two_i % 2:
        raise ValueError(f"gu must hold gate and up side by side ([B, 2 I]), got {two_i} columns")
    if not launch.whole(block) or block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1 (the columns one program computes, a Triton block), "
                         f"got {block!r}")
    out = torch.empty(B, two_i // 2, device=gu.device, dtype=gu.dtype)
    if B and two_i:
        _silu_mul_kernel[(B, triton.cdiv(two_i // 2, block))](gu, out, two_i // 2, gu.stride(0), out.stride(0),
                                                              BLOCK=block)
    return out
