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

All take fp16, bf16 or fp32 and compute in fp32. On a CPU they run in Triton's interpreter (fp16 and fp32;
the interpreter computes bf16 wrongly).

Chapter: 7.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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
    if B:
        r = residual if residual is not None else out
        _rmsnorm_kernel[(B,)](x, r, weight, out, h, N, float(eps), x.stride(-2), r.stride(0), out.stride(0), h.stride(0),
                              x.stride(0) if x.dim() == 3 else 0, HAS_RES=residual is not None, STORE_H=keep, SPLITS=splits,
                              BLOCK=triton.next_power_of_2(N))
    return out, h


# ---------------------------------------------------------------------------- RoPE + the K/V write

@triton.jit
def _rope_write_kernel(QKV, POS, INV, Q, KC, VC, TABLE, stride_qkv, stride_q, stride_qh, stride_t, stride_s,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr):
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
        block = tl.load(TABLE + b * stride_t + pos // PAGE).to(tl.int64)
        row = ((block * HKV + kv) * PAGE + pos % PAGE) * D  # the page layout [blocks, H_kv, PAGE, d]
        if head < HQ + HKV:
            tl.store(KC + row + half, y1.to(KC.dtype.element_ty))
            tl.store(KC + row + D // 2 + half, y2.to(KC.dtype.element_ty))
        else:
            tl.store(VC + row + half, y1.to(VC.dtype.element_ty))
            tl.store(VC + row + D // 2 + half, y2.to(VC.dtype.element_ty))


def rope_write(qkv: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, table: torch.Tensor, heads: int) -> torch.Tensor:
    """One decode token per row of ``qkv`` [B, (H_q + 2 H_kv) d] (query, key and value heads side by side):
    the query heads rotated by RoPE at position ``pos[b]`` are returned as [B, H_q, d]; the rotated key and
    the value are written into the paged caches [blocks, H_kv, page, d] at the token's slot, block
    ``table[b, pos // page]``. ``inv_freq`` [d/2] (float32) are the rotary frequencies. ``qkv`` may also be
    the float32 partial sums [splits, B, (H_q + 2 H_kv) d] of a split-K GEMM; q then takes the cache's dtype."""
    splits = _check_input("qkv", qkv)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(name, t, 4)
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous [blocks, H_kv, page, d]")
    _, hkv, page, d = k_cache.shape
    B = qkv.shape[-2]
    if qkv.shape[-1] != (heads + 2 * hkv) * d:
        raise ValueError(f"qkv has {qkv.shape[-1]} columns; {heads} query and 2 x {hkv} KV heads of {d} need "
                         f"{(heads + 2 * hkv) * d}")
    if d % 2 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two (halves of a power of two), got {d}")
    if pos.shape != (B,) or table.dim() != 2 or table.shape[0] != B or inv_freq.shape != (d // 2,):
        raise ValueError(f"need pos [{B}], table [{B}, pages] and inv_freq [{d // 2}], got {tuple(pos.shape)}, "
                         f"{tuple(table.shape)} and {tuple(inv_freq.shape)}")
    q = torch.empty(B, heads, d, device=qkv.device, dtype=qkv.dtype if qkv.dim() == 2 else k_cache.dtype)
    if B:
        _rope_write_kernel[(B, heads + 2 * hkv)](qkv, pos, inv_freq, q, k_cache, v_cache, table, qkv.stride(-2),
                                                 q.stride(0), q.stride(1), table.stride(0),
                                                 qkv.stride(0) if qkv.dim() == 3 else 0, HQ=heads, HKV=hkv, D=d,
                                                 PAGE=page, SPLITS=splits)
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
    """silu(gate) * up for gu [B, 2 I] holding gate and up side by side: [B, I]."""
    _check("gu", gu, 2)
    B, two_i = gu.shape
    if two_i % 2:
        raise ValueError(f"gu must hold gate and up side by side ([B, 2 I]), got {two_i} columns")
    out = torch.empty(B, two_i // 2, device=gu.device, dtype=gu.dtype)
    if B:
        _silu_mul_kernel[(B, triton.cdiv(two_i // 2, block))](gu, out, two_i // 2, gu.stride(0), out.stride(0),
                                                              BLOCK=block)
    return out
