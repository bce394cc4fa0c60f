"""y = x @ w with w stored in int8 or int4 (``lib.quant``), dequantized inside the main loop (chapter 9).

At decode the product is a read of w: storing w in fewer bytes reads fewer bytes, but only if nothing else
takes the time saved. The kernels here read each tile of the quantized weights once, turn it into x's
dtype in registers, and multiply; no dequantized copy of w is ever written.

- ``w8_mm``: int8 weights with one scale per output column. Integers up to 127 are exact in fp16 and bf16,
  so a tile of q is converted and multiplied as it is, and the column scales multiply the accumulated sums
  once, at the end (the scale is the same for every row of K).
- ``w4_mm``: int4 weights, two rows of K per byte, one scale per group of ``group`` rows. A tile of
  ``block_k`` rows (at most one group) is loaded as ``block_k / 2`` rows of bytes; the low four bits give
  the even rows, the high four the odd ones, each sign-extended. x's even and odd columns multiply them as
  two products, and the group's scales multiply the tile's sum before it is added: one multiply per column
  per tile, not per weight. For 16-bit x a nibble becomes a float by one XOR into the bits of a constant
  (``_MAGIC``): the product then carries a known offset times the sum of x, subtracted once per tile.

The weights come in ``Int8Weight`` and ``Int4Weight`` (made by ``lib.quant``'s quantizers); the packing
of int4 (``pack_int4``, ``unpack_int4``) is defined here, beside the kernel that reads it.

With ``swap`` both compute the transposed product w^T x^T, so that the weights converted in registers are
the first operand of the tensor-core product (on Hopper, the operand a product can take from registers)
and x^T the second.

Both split K across programs as ``lib.kernels.skinny_gemm`` does when the matrix is narrow (float32
partial sums, added by a second small kernel), tile M in blocks of 16 or 64 rows, accumulate in float32,
and take x in fp16, bf16 or fp32. In Triton's interpreter (CPU) they run in fp16 and fp32: the interpreter
computes ``tl.dot`` of bf16 operands wrongly, so these two refuse bf16 there (the GEMVs and ``dequantize``,
which use no ``tl.dot``, run in every dtype).

``w4_gemv`` and ``w8_gemv`` are the same products for the few rows of decode, without the tensor cores:
one program multiplies one row of x by a block of columns over a slice of K, with few instructions per
weight. int4 weights are read as 32-bit words of eight nibbles; one XOR flips the eight sign bits, and a
nibble masked in place is, as a float, a denormal worth its value times a power of two, which x was
scaled by beforehand: one logic operation and one and a half fused multiply-adds per weight. An int8
byte with its sign bit flipped, OR'd into the bits of 2^23, is the float 2^23 + q + 128, and one
subtraction makes it q. The products accumulate element by element in a [rows, columns] tile of float32,
summed over K once, at the end.

For many rows (``dequant_rows``: prefill's) both hand the product to the 16-bit GEMM: ``dequantize`` writes
the weights in x's dtype with one kernel, and cuBLAS multiplies. Converting once per call costs less than
converting once per block of rows.

Chapter: 9.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from lib.kernels import interpreter, launch
from lib.kernels.skinny_gemm import _sum_splits_kernel

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GROUPS = (32, 64, 128, 256)  # int4 group sizes (rows of K per scale)


@dataclass(frozen=True)
class Int8Weight:
    """w quantized per output channel: ``q`` int8 [K, N], ``scale`` float32 [N]."""

    q: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale[None, :]).to(dtype)


@dataclass(frozen=True)
class Int4Weight:
    """w quantized in groups of ``group`` rows: ``packed`` uint8 [K / 2, N] (row 2i low, 2i + 1 high),
    ``scale`` float32 [K / group, N]."""

    packed: torch.Tensor
    scale: torch.Tensor
    group: int

    @property
    def K(self) -> int:
        return 2 * self.packed.shape[0]

    def values(self) -> torch.Tensor:
        """The integers q [K, N] (int8, -8..7), unpacked."""
        return unpack_int4(self.packed)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        s = self.scale.repeat_interleave(self.group, dim=0)
        return (self.values().float() * s).to(dtype)


@dataclass(frozen=True)
class Int4Interleaved:
    """An ``Int4Weight`` with each group's scales stored right after its weights, in one int32 tensor
    ``words`` [K / group, group / 2 + 4, N / 4]: rows 0 .. group / 2 - 1 of a group are its packed bytes read
    as words (word c of a row holds columns 4c .. 4c + 3), rows group / 2 + j hold, in word c, the bits of
    the float32 scale of column 4c + j. The same bytes as the separate arrays, in the order the GEMV reads
    them (``interleave_scales`` makes it)."""

    words: torch.Tensor
    group: int

    @property
    def K(self) -> int:
        return self.words.shape[0] * self.group

    @property
    def N(self) -> int:
        return 4 * self.words.shape[2]

    def separate(self) -> Int4Weight:
        """The weights with their scales in their own array again."""
        half = self.group // 2
        packed = self.words[:, :half].reshape(-1, self.words.shape[2]).contiguous().view(torch.uint8)
        scale = self.words[:, half:].view(torch.float32).permute(0, 2, 1).reshape(self.words.shape[0], -1)
        return Int4Weight(packed, scale.contiguous(), self.group)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.separate().dequantize(dtype)


def interleave_scales(w: Int4Weight) -> Int4Interleaved:
    """``w`` with each group's scales after its weights (see ``Int4Interleaved``); N a multiple of 4."""
    if not isinstance(w, Int4Weight):
        raise TypeError(f"w must be an Int4Weight (lib.quant.quantize_int4), got {type(w).__name__}")
    N = w.packed.shape[1]
    if N % 4 or w.scale.dtype != torch.float32:
        raise ValueError(f"interleaving needs N a multiple of 4 (four columns to a word) and float32 scales; got "
                         f"N={N}, {w.scale.dtype}")
    groups, half = w.scale.shape[0], w.group // 2
    words = w.packed.contiguous().view(torch.int32).reshape(groups, half, N // 4)
    scales = w.scale.contiguous().view(torch.int32).reshape(groups, N // 4, 4).permute(0, 2, 1)
    return Int4Interleaved(torch.cat([words, scales], dim=1).contiguous(), w.group)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values in -8..7, [K, N] with K even, to uint8 [K / 2, N]: row 2i in the low four bits."""
    if q.dim() != 2 or q.shape[0] % 2:
        raise ValueError(f"q must be [K, N] with K even (two rows per byte), got {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"int4 values must lie in -8..7, got {int(q.min())}..{int(q.max())}")
    u = (q.to(torch.int16) & 0xF).to(torch.uint8)
    return u[0::2] | (u[1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [K / 2, N] to int8 [K, N], -8..7 (the inverse of ``pack_int4``)."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    lo = (packed & 0xF).to(torch.int8)
    hi = (packed >> 4).to(torch.int8)
    lo = torch.where(lo >= 8, lo - 16, lo)
    hi = torch.where(hi >= 8, hi - 16, hi)
    return torch.stack((lo, hi), dim=1).reshape(2 * packed.shape[0], packed.shape[1])


@triton.jit
def _program(M, N, K_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """This program's rows of x and columns of w with their masks, the start of its slice of K, and a zero
    accumulator: [BLOCK_M, BLOCK_N], or with SWAP the transposed product's [BLOCK_N, BLOCK_M], in which the
    converted weights are the tensor-core product's first operand."""
    rm = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return rm, rn, rm < M, rn < N, tl.program_id(1) * K_SPLIT, acc


@triton.jit
def _store(P, acc, rm, rn, mmask, nmask, stride_ps, stride_pm, SWAP: tl.constexpr):
    """The program's block of the product (transposed back with SWAP) at its split's place in P."""
    if SWAP:
        out = tl.trans(acc)
    else:
        out = acc
    tl.store(P + tl.program_id(1) * stride_ps + rm[:, None] * stride_pm + rn[None, :], out.to(P.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _w8_kernel(X, Q, S, P, M, N, K, K_SPLIT, stride_xm, stride_qk, stride_ps, stride_pm,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):
    rm, rn, mmask, nmask, k_lo, acc = _program(M, N, K_SPLIT, BLOCK_M, BLOCK_N, SWAP)
    for k in range(k_lo, k_lo + K_SPLIT, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        kmask = rk < K
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        q = tl.load(Q + rk[:, None] * stride_qk + rn[None, :], mask=kmask[:, None] & nmask[None, :], other=0)
        if SWAP:
            acc += tl.dot(tl.trans(q.to(X.dtype.element_ty)), tl.trans(x))
        else:
            acc += tl.dot(x, q.to(X.dtype.element_ty))
    s = tl.load(S + rn, mask=nmask, other=0.0)  # the column scales, the same for every row of K: once, at the end
    if SWAP:
        acc = acc * s[:, None]
    else:
        acc = acc * s[None, :]
    _store(P, acc, rm, rn, mmask, nmask, stride_ps, stride_pm, SWAP)


@triton.jit
def _w4_kernel(X, Q, S, P, M, N, K, K_SPLIT, GROUP, stride_xm, stride_qk, stride_sg, stride_ps, stride_pm,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALF_K: tl.constexpr,
               MAGIC: tl.constexpr, OFFSET: tl.constexpr, SWAP: tl.constexpr):
    rm, rn, mmask, nmask, k_lo, acc = _program(M, N, K_SPLIT, BLOCK_M, BLOCK_N, SWAP)
    for k in range(k_lo, k_lo + K_SPLIT, BLOCK_K):  # K is a whole number of tiles; a tile lies in one group
        rb = k // 2 + tl.arange(0, HALF_K)  # rows of bytes: byte row i holds rows 2i and 2i + 1 of w
        b = tl.load(Q + rb[:, None] * stride_qk + rn[None, :], mask=nmask[None, :], other=0)
        re = k + 2 * tl.arange(0, HALF_K)
        xe = tl.load(X + rm[:, None] * stride_xm + re[None, :], mask=mmask[:, None], other=0.0)
        xo = tl.load(X + rm[:, None] * stride_xm + (re + 1)[None, :], mask=mmask[:, None], other=0.0)
        if MAGIC:
            # a nibble n (q's four bits) XOR 0x8 is q + 8; OR'd into the bits of OFFSET - 8 (a 16-bit float
            # whose last mantissa bit is worth 1) it is the float OFFSET + q, made by one XOR and no
            # conversion; x @ (OFFSET + q) less OFFSET times the sum of x is x @ q
            b16 = b.to(tl.int16)
            lo = ((b16 & 0xF) ^ MAGIC).to(tl.int16).to(X.dtype.element_ty, bitcast=True)
            hi = ((b16 >> 4) ^ MAGIC).to(tl.int16).to(X.dtype.element_ty, bitcast=True)
            xsum = OFFSET * tl.sum(xe.to(tl.float32) + xo.to(tl.float32), axis=1)
        else:  # float32 x: unpack and convert (the values -8..7 are exact)
            b = b.to(tl.int32)
            lo = b & 0xF
            hi = (b >> 4) & 0xF
            lo = tl.where(lo >= 8, lo - 16, lo).to(X.dtype.element_ty)
            hi = tl.where(hi >= 8, hi - 16, hi).to(X.dtype.element_ty)
            xsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        s = tl.load(S + (k // GROUP) * stride_sg + rn, mask=nmask, other=0.0)
        if SWAP:
            part = tl.dot(tl.trans(lo), tl.trans(xe)) + tl.dot(tl.trans(hi), tl.trans(xo)) - xsum[None, :]
            acc += part * s[:, None]
        else:
            part = tl.dot(xe, lo) + tl.dot(xo, hi) - xsum[:, None]
            acc += part * s[None, :]
    _store(P, acc, rm, rn, mmask, nmask, stride_ps, stride_pm, SWAP)


@triton.jit
def _denormal(w, MASK: tl.constexpr):
    """The bits of w under MASK (within the low 23) as a float32 with no exponent bits: a denormal worth
    those bits times 2^-149, exactly."""
    return (w & MASK).to(tl.float32, bitcast=True)


@triton.jit
def _w4_pair(lo, hi, xe, xo, c, s, acc):
    """acc + s * (lo xe + hi xo - c), as three fused multiply-adds."""
    t = lo * xe - c
    t = hi * xo + t
    return t * s + acc


@triton.jit
def _w4_gemv_kernel(X, Q, S, P, Out, CNT, N4, K_SPLIT, stride_xm, stride_qk, stride_sg, stride_ps, stride_pm,
                    BLOCK_W: tl.constexpr, ROWS: tl.constexpr, GROUP: tl.constexpr, INTERLEAVED: tl.constexpr,
                    SPLITS: tl.constexpr = 1, INLINE: tl.constexpr = False):
    """Row program_id(2) of x times 4 * BLOCK_W columns of w over slice program_id(1) of K. Q is the packed
    bytes read as 32-bit words [K / 2, N / 4]: word c of byte row i holds columns 4c..4c + 3 of rows 2i
    (low nibbles) and 2i + 1 (high); a tile of ROWS byte rows lies in one group.

    A nibble with its sign bit flipped is u = q + 8 (the word's eight sign bits flip in one XOR). Masked in
    place at bit b of the word, as a float, it is the denormal u 2^(b - 149); x multiplied beforehand by
    2^(149 - b - 64) makes the product u x 2^-64, and 8 x 2^-64 less is q x 2^-64; the sums are scaled by
    2^64 at the end (x may reach 2^42 in magnitude before x 2^85 overflows). Bytes 2 and 3 are shifted
    down to bytes 0 and 1 (bit 23 is a float's exponent). INTERLEAVED: Q and S are one ``Int4Interleaved``,
    each group's four rows of scales after its rows of words. INLINE: each slice writes its float32 sums to
    P, and the last of the SPLITS slices of a block of columns to arrive (an atomic count in CNT) adds
    them and writes Out, instead of a second launch."""
    m = tl.program_id(2)
    rw = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    wmask = rw < N4
    k_lo = tl.program_id(1) * K_SPLIT
    xrow = X + m * stride_xm
    acc0 = tl.zeros((ROWS, BLOCK_W), dtype=tl.float32)
    acc1 = tl.zeros((ROWS, BLOCK_W), dtype=tl.float32)
    acc2 = tl.zeros((ROWS, BLOCK_W), dtype=tl.float32)
    acc3 = tl.zeros((ROWS, BLOCK_W), dtype=tl.float32)
    for k in range(k_lo, k_lo + K_SPLIT, 2 * ROWS):
        if INTERLEAVED:  # four rows of scales after each group's rows of words
            rb = k // 2 + (k // GROUP) * 4 + tl.arange(0, ROWS)
            srow = S + (k // GROUP) * stride_sg + rw[None, :]
            sj = stride_qk
        else:  # scales [K / GROUP, N]
            rb = k // 2 + tl.arange(0, ROWS)
            srow = S + (k // GROUP) * stride_sg + 4 * rw[None, :]
            sj = 1
        w = tl.load(Q + rb[:, None] * stride_qk + rw[None, :], mask=wmask[None, :], other=0) ^ -0x77777778
        w2 = w >> 16
        xe = tl.load(xrow + k + 2 * tl.arange(0, ROWS)[:, None]).to(tl.float32)
        xo = tl.load(xrow + k + 1 + 2 * tl.arange(0, ROWS)[:, None]).to(tl.float32)
        c = (xe + xo) * 4.336808689942018e-19  # 8 * 2^-64
        xe0, xo0 = xe * 3.8685626227668134e+25, xo * 2.4178516392292583e+24  # 2^85, 2^81 (bits 0 and 4)
        xe1, xo1 = xe * 1.5111572745182865e+23, xo * 9.44473296573929e+21  # 2^77, 2^73 (bits 8 and 12)
        acc0 = _w4_pair(_denormal(w, 0xF), _denormal(w, 0xF0), xe0, xo0, c,
                        tl.load(srow, mask=wmask[None, :], other=0.0), acc0)
        acc1 = _w4_pair(_denormal(w, 0xF00), _denormal(w, 0xF000), xe1, xo1, c,
                        tl.load(srow + 1 * sj, mask=wmask[None, :], other=0.0), acc1)
        acc2 = _w4_pair(_denormal(w2, 0xF), _denormal(w2, 0xF0), xe0, xo0, c,
                        tl.load(srow + 2 * sj, mask=wmask[None, :], other=0.0), acc2)
        acc3 = _w4_pair(_denormal(w2, 0xF00), _denormal(w2, 0xF000), xe1, xo1, c,
                        tl.load(srow + 3 * sj, mask=wmask[None, :], other=0.0), acc3)
    out = P + tl.program_id(1) * stride_ps + m * stride_pm + 4 * rw
    ty = P.dtype.element_ty
    tl.store(out, (tl.sum(acc0, axis=0) * 18446744073709551616.0).to(ty), mask=wmask)  # 2^64
    tl.store(out + 1, (tl.sum(acc1, axis=0) * 18446744073709551616.0).to(ty), mask=wmask)
    tl.store(out + 2, (tl.sum(acc2, axis=0) * 18446744073709551616.0).to(ty), mask=wmask)
    tl.store(out + 3, (tl.sum(acc3, axis=0) * 18446744073709551616.0).to(ty), mask=wmask)
    if INLINE:
        _sum_if_last(P, Out, CNT + m * tl.num_programs(0) + tl.program_id(0), m * stride_pm + 4 * rw, wmask,
                     stride_ps, BLOCK_W, SPLITS)


@triton.jit
def _sum_if_last(P, Out, cnt, offs, mask, stride_ps, BLOCK_W: tl.constexpr, SPLITS: tl.constexpr):
    """The last of SPLITS programs to count itself in at ``cnt`` adds the SPLITS partials at ``offs`` (+0..3)
    of P and writes the sums to Out at the same offsets, then resets the count. The atomic is acq_rel: each
    program's partials are visible before its count, so the last one reads them all."""
    if tl.atomic_add(cnt, 1) == SPLITS - 1:
        t0 = tl.zeros([BLOCK_W], tl.float32)
        t1 = tl.zeros([BLOCK_W], tl.float32)
        t2 = tl.zeros([BLOCK_W], tl.float32)
        t3 = tl.zeros([BLOCK_W], tl.float32)
        for i in tl.static_range(SPLITS):
            pi = P + i * stride_ps + offs
            t0 += tl.load(pi, mask=mask, other=0.0, cache_modifier=".cg")
            t1 += tl.load(pi + 1, mask=mask, other=0.0, cache_modifier=".cg")
            t2 += tl.load(pi + 2, mask=mask, other=0.0, cache_modifier=".cg")
            t3 += tl.load(pi + 3, mask=mask, other=0.0, cache_modifier=".cg")
        ty = Out.dtype.element_ty
        tl.store(Out + offs, t0.to(ty), mask=mask)
        tl.store(Out + offs + 1, t1.to(ty), mask=mask)
        tl.store(Out + offs + 2, t2.to(ty), mask=mask)
        tl.store(Out + offs + 3, t3.to(ty), mask=mask)
        tl.atomic_xchg(cnt, 0)  # ready for the next call


@triton.jit
def _w8_gemv_tile(Q, xrow, k, k_end, K, rn, nmask, stride_qk, ROWS: tl.constexpr):
    """The bytes of the tile at row k of w and x's rows [ROWS, 1] (zero past K or at or past k_end)."""
    rk = k + tl.arange(0, ROWS)
    kmask = (rk < K) & (k < k_end)
    b = tl.load(Q + rk[:, None] * stride_qk + rn[None, :], mask=kmask[:, None] & nmask[None, :], other=0)
    return b, tl.load(xrow + rk[:, None], mask=kmask[:, None], other=0.0).to(tl.float32)


@triton.jit
def _w8_gemv_kernel(X, Q, S, P, N, K, K_SPLIT, stride_xm, stride_qk, stride_ps, stride_pm,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """Row program_id(2) of x times columns program_id(0) of w over slice program_id(1) of K; Q is the int8
    weights' bytes (uint8). Each step requests the next tile before it computes on the current one."""
    m = tl.program_id(2)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    k_lo = tl.program_id(1) * K_SPLIT
    k_end = k_lo + K_SPLIT
    xrow = X + m * stride_xm
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    nxt = _w8_gemv_tile(Q, xrow, k_lo, k_end, K, rn, nmask, stride_qk, ROWS)
    for k in range(k_lo, k_end, ROWS):
        b, x = nxt
        nxt = _w8_gemv_tile(Q, xrow, k + ROWS, k_end, K, rn, nmask, stride_qk, ROWS)
        # the byte with its sign bit flipped is q + 128: as the float 2^23 + q + 128, less 2^23 + 128
        acc += ((b.to(tl.int32) ^ 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0) * x
    out = tl.sum(acc, axis=0) * tl.load(S + rn, mask=nmask, other=0.0)
    tl.store(P + tl.program_id(1) * stride_ps + m * stride_pm + rn, out.to(P.dtype.element_ty), mask=nmask)


# for 16-bit x: the bits of OFFSET - 8 XOR 0x8, and OFFSET (the float whose last mantissa bit is worth 1,
# plus 8): bf16 128 (0x4300), fp16 1024 (0x6400); float32 x converts instead
_MAGIC = {torch.bfloat16: (0x4308, 136.0), torch.float16: (0x6408, 1032.0), torch.float32: (0, 0.0)}


@triton.jit
def _dequant_kernel(Q, S, W, K, N, stride_qk, stride_sg, stride_wk, GROUP, BITS: tl.constexpr,
                    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows [BLOCK_K program_id(0), + BLOCK_K) and columns [BLOCK_N program_id(1), + BLOCK_N) of the
    weights, written in W's dtype: int8 q [K, N] times the column scales S [N] (BITS 8), or int4 packed
    bytes [K / 2, N] times the group scales S [K / GROUP, N] (BITS 4; a tile lies in one group)."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    if BITS == 8:
        rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (rk < K)[:, None] & nmask[None, :]
        q = tl.load(Q + rk[:, None] * stride_qk + rn[None, :], mask=mask, other=0).to(tl.float32)
        s = tl.load(S + rn, mask=nmask, other=0.0)
        tl.store(W + rk[:, None] * stride_wk + rn[None, :], (q * s[None, :]).to(W.dtype.element_ty), mask=mask)
    else:
        k0 = tl.program_id(0) * BLOCK_K
        rb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        mask = (rb < K // 2)[:, None] & nmask[None, :]
        b = tl.load(Q + rb[:, None] * stride_qk + rn[None, :], mask=mask, other=0).to(tl.int32)
        s = tl.load(S + (k0 // GROUP) * stride_sg + rn, mask=nmask, other=0.0)[None, :]
        lo = (((b & 0xF) ^ 8) - 8).to(tl.float32) * s  # the low nibble, sign-extended: row 2i
        hi = ((((b >> 4) & 0xF) ^ 8) - 8).to(tl.float32) * s  # the high nibble: row 2i + 1
        out = W + (2 * rb)[:, None] * stride_wk + rn[None, :]
        tl.store(out, lo.to(W.dtype.element_ty), mask=mask)
        tl.store(out + stride_wk, hi.to(W.dtype.element_ty), mask=mask)


def dequantize(w: Int8Weight | Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weights [K, N] in ``dtype``, written by one kernel from the stored integers and scales (reads the
    stored bytes once, writes 2 or 4 bytes a weight): what a product of many rows multiplies by."""
    if isinstance(w, Int8Weight):
        (K, N), q, s, group, bits, block_k = w.q.shape, w.q, w.scale, 1, 8, 32
    elif isinstance(w, Int4Weight):
        K, N, q, s, group, bits = w.K, w.packed.shape[1], w.packed, w.scale, w.group, 4
        block_k = min(32, group)
    else:
        raise TypeError(f"w must be an Int8Weight or an Int4Weight (lib.quant), got {type(w).__name__}")
    out = torch.empty(K, N, device=q.device, dtype=dtype)
    grid = (triton.cdiv(K, block_k), triton.cdiv(N, 128))
    _dequant_kernel[grid](q, s, out, K, N, q.stride(0), s.stride(0) if bits == 4 else 0, out.stride(0), group,
                          BITS=bits, BLOCK_K=block_k, BLOCK_N=128, num_warps=4)
    return out


def choose_config(M: int, N: int, K: int, sms: int, *, block_k: int = 64, int4: bool = False) -> dict:
    """Tiles of ``block_k`` rows of w, columns in blocks of 64 (128 for N >= 16384), rows of x in blocks of
    16 (M <= 16) or 64, and the fewest splits of K (powers of two, slices of at least four tiles) that launch
    1.5 programs per SM. int4 at up to 16 rows: columns in blocks of 256 and the converted weights as the
    product's first operand (``swap``; on the H200, 0.55 to 0.69 of bf16's speed at 16 rows against 0.36 to
    0.55 with the general launch)."""
    block_m = 16 if M <= 16 else 64
    block_n = 128 if N >= 16384 else 64
    swap = int4 and M <= 16
    if swap:
        block_n = 256
    programs = triton.cdiv(N, block_n) * triton.cdiv(M, block_m)
    splits = 1
    while programs * splits < 1.5 * sms and K % (2 * splits) == 0 and K // (2 * splits) >= 4 * block_k \
            and (K // (2 * splits)) % block_k == 0:
        splits *= 2
    return {"block_m": block_m, "block_n": block_n, "block_k": block_k, "splits": splits, "num_warps": 4,
            "num_stages": 4, "swap": swap}


def _check_x(x: torch.Tensor, K: int, device) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor [M, K], got {getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError(f"x must be contiguous in its last dimension, got strides {x.stride()}")
    if x.shape[1] != K:
        raise ValueError(f"x has {x.shape[1]} columns but the weight has K = {K} rows")
    if x.device != device:
        raise ValueError(f"x is on {x.device} but the weight on {device}: put both on one device")
    if x.shape[0] < 1:
        raise ValueError("x has no rows")


INTERPRETED = interpreter.interpreted(_w8_kernel)  # no GPU: see lib.kernels.interpreter


def _launch(kernel, x, args, M, N, K, cfg, splits, extra_strides, block_k, **meta):
    """The tensor-core kernel's launch (``w8_mm``, ``w4_mm``), then the sum of the splits' partials."""
    interpreter.refuse_bf16(INTERPRETED, x.dtype, "x is")
    k_split = cfg["k_split"]
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = out if splits == 1 else torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, cfg["block_n"]), splits, triton.cdiv(M, cfg["block_m"]))
    kernel[grid](x, *args, part, M, N, K, k_split, *extra_strides, M * N if splits > 1 else 0, N,
                 BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], BLOCK_K=block_k, num_warps=cfg["num_warps"],
                 num_stages=cfg["num_stages"], **meta)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](part, out, M * N, SPLITS=splits, BLOCK=1024)
    return out


def _config(x, N, K, block_k, splits, block_n, num_warps, num_stages, *, masked_tail: bool = False,
            int4: bool = False, swap: bool | None = None) -> dict:
    """``choose_config``'s launch with any given parameter put in its place. A kernel that masks the rows of
    its last tile (``masked_tail``, int8) takes any K in one slice; split, every slice is whole tiles."""
    cfg = choose_config(x.shape[0], N, K, launch.sm_count(x.device), block_k=block_k, int4=int4)
    given = {"splits": splits, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages, "swap": swap}
    cfg.update({k: v for k, v in given.items() if v is not None})
    if cfg["splits"] == 1 and masked_tail:
        cfg["k_split"] = triton.cdiv(K, block_k) * block_k
    elif K % (cfg["splits"] * block_k):
        raise ValueError(f"splits={cfg['splits']} must cut K={K} into slices that are whole tiles of {block_k}")
    else:
        cfg["k_split"] = K // cfg["splits"]
    return cfg


DEQUANT_ROWS = 32


def dequant_rows(M: int) -> bool:
    """Whether ``w8_mm`` and ``w4_mm`` dequantize the weights and hand M rows to the bf16 product
    (``dequantize``, then cuBLAS): from ``DEQUANT_ROWS`` rows, where the extra write and read of the
    16-bit weights (about 2.5 bytes a weight) cost less than converting every weight once per block of 16
    or 64 rows (on the H200, the fused int4 kernel ran at 0.16 of bf16's speed at 32 rows)."""
    return M >= DEQUANT_ROWS


def gemv_rows(M: int) -> bool:
    """Whether ``w8_mm`` and ``w4_mm`` hand M rows to the GEMV: one row (on the H200 the GEMV took 0.4 to
    0.6 of the tensor-core kernel's time at one row and was slower at four)."""
    return M == 1


def w8_mm(x: torch.Tensor, w: Int8Weight, *, splits: int | None = None, block_k: int = 64, block_n: int | None = None,
          num_warps: int | None = None, num_stages: int | None = None, swap: bool = False,
          gemv: bool | None = None) -> torch.Tensor:
    """x [M, K] @ (w.q * w.scale) [K, N], the int8 weights dequantized in registers: [M, N] in x's dtype.
    ``gemv`` None: ``w8_gemv`` where ``gemv_rows`` says so and no tensor-core launch parameter is given;
    with no launch parameter, ``dequantize`` and the 16-bit product where ``dequant_rows`` says so."""
    if not isinstance(w, Int8Weight):
        raise TypeError(f"w must be an Int8Weight (lib.quant.quantize_int8), got {type(w).__name__}")
    tc = (splits, block_n, num_warps, num_stages) != (None,) * 4 or swap or block_k != 64
    if gemv or (gemv is None and isinstance(x, torch.Tensor) and x.dim() == 2 and gemv_rows(x.shape[0]) and not tc):
        return w8_gemv(x, w)
    K, N = w.q.shape
    _check_x(x, K, w.q.device)
    if not tc and not gemv and dequant_rows(x.shape[0]):
        return x @ dequantize(w, x.dtype)
    if not w.q.is_contiguous() or not w.scale.is_contiguous() or w.scale.dtype != torch.float32:
        raise ValueError("w.q must be contiguous and w.scale a contiguous float32 vector")
    cfg = _config(x, N, K, block_k, splits, block_n, num_warps, num_stages, masked_tail=True)
    return _launch(_w8_kernel, x, (w.q, w.scale), x.shape[0], N, K, cfg, cfg["splits"], (x.stride(0), w.q.stride(0)),
                   block_k, SWAP=bool(swap))


def w4_mm(x: torch.Tensor, w: Int4Weight, *, splits: int | None = None, block_k: int | None = None,
          block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
          swap: bool | None = None, gemv: bool | None = None) -> torch.Tensor:
    """x [M, K] @ (the int4 weights times their group scales) [K, N], dequantized in registers: [M, N] in x's
    dtype. ``block_k`` (rows of w per tile) defaults to min(64, group) and must divide the group. ``gemv``
    None: ``w4_gemv`` where ``gemv_rows`` says so, N is a multiple of 4 and no tensor-core launch parameter
    is given. ``swap`` None: as ``choose_config`` chooses."""
    if not isinstance(w, Int4Weight):
        raise TypeError(f"w must be an Int4Weight (lib.quant.quantize_int4), got {type(w).__name__}")
    tc = (splits, block_k, block_n, num_warps, num_stages, swap) != (None,) * 6
    if gemv or (gemv is None and isinstance(x, torch.Tensor) and x.dim() == 2 and gemv_rows(x.shape[0]) and not tc
                and w.packed.shape[1] % 4 == 0):
        return w4_gemv(x, w)
    K, N = w.K, w.packed.shape[1]
    _check_x(x, K, w.packed.device)
    if not tc and not gemv and dequant_rows(x.shape[0]):
        return x @ dequantize(w, x.dtype)
    block_k = block_k or min(64, w.group)
    if w.group % block_k or block_k % 2:
        raise ValueError(f"block_k={block_k} must be even and divide the group of {w.group} rows")
    if not w.packed.is_contiguous() or not w.scale.is_contiguous() or w.scale.dtype != torch.float32:
        raise ValueError("w.packed must be contiguous and w.scale a contiguous float32 tensor")
    cfg = _config(x, N, K, block_k, splits, block_n, num_warps, num_stages, int4=True, swap=swap)
    return _launch(_w4_kernel, x, (w.packed, w.scale), x.shape[0], N, K, cfg, cfg["splits"],
                   (w.group, x.stride(0), w.packed.stride(0), w.scale.stride(0)), block_k, HALF_K=block_k // 2,
                   MAGIC=_MAGIC[x.dtype][0], OFFSET=_MAGIC[x.dtype][1], SWAP=bool(cfg["swap"]))


INLINE_SPLITS = 8  # from this many slices of K the int4 GEMV adds them in its last slice (choose_gemv_config)


def choose_gemv_config(M: int, N: int, K: int, sms: int, *, bits: int, group: int = 128) -> dict:
    """int4: tiles of 64 rows of bytes (at most half a group), 128 columns, 4 warps, and the fewest splits
    of K (powers of two) that launch 1.5 programs per SM in slices of at most 1,024 rows of w; from
    ``INLINE_SPLITS`` splits the last slice adds the slices' sums (``inline_sum``), where a second launch
    would be a larger share of a small product's time. int8: tiles of 128 rows, 128 columns, 8
    warps, the fewest splits that launch 1.5 programs per SM in slices of at least two tiles."""
    rows = min(64, group // 2) if bits == 4 else 128
    per = 2 * rows if bits == 4 else rows  # rows of w per tile
    block_n = 128
    programs = triton.cdiv(N, block_n) * M

    def more(splits: int) -> bool:
        short = programs * splits < 1.5 * sms or (bits == 4 and K // splits > 1024)
        return short and K % (2 * splits * per) == 0 and K // (2 * splits) >= (per if bits == 4 else 2 * per)

    splits = 1
    while more(splits):
        splits *= 2
    return {"rows": rows, "block_n": block_n, "splits": splits, "num_warps": 4 if bits == 4 else 8, "num_stages": 1,
            "inline_sum": bits == 4 and splits >= INLINE_SPLITS}


_COUNTERS: dict = {}


def _counters(device, n: int) -> torch.Tensor:
    """n int32 arrival counts on ``device``, zero between calls (the last program of a block resets its own)."""
    key = (torch.device(device), n)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(n, device=device, dtype=torch.int32)
    return _COUNTERS[key]


def _gemv(x, w, bits: int, given: dict) -> torch.Tensor:
    M = x.shape[0]
    inter = isinstance(w, Int4Interleaved)
    K, N, group = (w.K, w.N if inter else w.packed.shape[1], w.group) if bits == 4 else (*w.q.shape, 1)
    cfg = choose_gemv_config(M, N, K, launch.sm_count(x.device), bits=bits, group=group)
    cfg.update({k: v for k, v in given.items() if v is not None})
    rows, splits, block_n = cfg["rows"], cfg["splits"], cfg["block_n"]
    per = 2 * rows if bits == 4 else rows
    if rows < 1 or rows & (rows - 1) or (bits == 4 and group % per):
        raise ValueError(f"rows={rows} must be a power of two" + (f" with 2 * rows dividing the group of {group}"
                                                                    if bits == 4 else ""))
    if bits == 4 and (block_n % 4 or N % 4):
        raise ValueError(f"int4 columns are read four to a word: block_n={block_n} and N={N} must be multiples of 4")
    if splits == 1:
        k_split = triton.cdiv(K, per) * per
    elif splits < 1 or K % (splits * per):
        raise ValueError(f"splits={splits} must cut K={K} into slices that are whole tiles of {per} rows")
    else:
        k_split = K // splits
    out = torch.empty(M, N, device=x.device, dtype=x.dtype)
    part = out if splits == 1 else torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(N, block_n), splits, M)
    meta = {"ROWS": rows, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if bits == 4:
        if inter:  # the scales: the float32 view of each group's last four rows
            q, scale, stride_sg = w.words, w.words.view(torch.float32)[:, group // 2:], w.words.stride(0)
        else:
            q, scale, stride_sg = w.packed.view(torch.int32), w.scale, w.scale.stride(0)
        inline = bool(cfg.get("inline_sum")) and splits > 1
        cnt = _counters(x.device, grid[0] * M) if inline else part
        _w4_gemv_kernel[grid](x, q, scale, part, out, cnt, N // 4, k_split, x.stride(0), N // 4, stride_sg,
                              M * N if splits > 1 else 0, N, BLOCK_W=block_n // 4, GROUP=group, INTERLEAVED=inter,
                              SPLITS=splits, INLINE=inline, **meta)
        if inline:
            return out
    else:
        _w8_gemv_kernel[grid](x, w.q.view(torch.uint8), w.scale, part, N, K, k_split, x.stride(0), w.q.stride(0),
                              M * N if splits > 1 else 0, N, BLOCK_N=block_n, **meta)
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](part, out, M * N, SPLITS=splits, BLOCK=1024)
    return out


def w8_gemv(x: torch.Tensor, w: Int8Weight, *, rows: int | None = None, block_n: int | None = None,
            splits: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """``w8_mm``'s product for the few rows of decode, on the CUDA cores (see the module): [M, N] in x's dtype."""
    if not isinstance(w, Int8Weight):
        raise TypeError(f"w must be an Int8Weight (lib.quant.quantize_int8), got {type(w).__name__}")
    _check_x(x, w.q.shape[0], w.q.device)
    if not w.q.is_contiguous() or not w.scale.is_contiguous() or w.scale.dtype != torch.float32:
        raise ValueError("w.q must be contiguous and w.scale a contiguous float32 vector")
    return _gemv(x, w, 8, {"rows": rows, "block_n": block_n, "splits": splits, "num_warps": num_warps,
                           "num_stages": num_stages})


def w4_gemv(x: torch.Tensor, w: Int4Weight | Int4Interleaved, *, rows: int | None = None, block_n: int | None = None,
            splits: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
            inline_sum: bool | None = None) -> torch.Tensor:
    """``w4_mm``'s product for the few rows of decode, on the CUDA cores (see the module): [M, N] in x's
    dtype, from w's scales in their own array (``Int4Weight``) or after each group (``Int4Interleaved``).
    ``rows`` (bytes of w per tile, two rows of w each) must be a power of two, 2 * rows dividing the
    group; N and ``block_n`` multiples of 4. ``inline_sum``: with splits of K, the last slice of each block of
    columns adds the slices' sums (no second launch)."""
    if isinstance(w, Int4Interleaved):
        _check_x(x, w.K, w.words.device)
        if not w.words.is_contiguous() or w.words.dtype != torch.int32:
            raise ValueError("w.words must be a contiguous int32 tensor (lib.quant.interleave_scales makes it)")
    elif isinstance(w, Int4Weight):
        _check_x(x, w.K, w.packed.device)
        if not w.packed.is_contiguous() or not w.scale.is_contiguous() or w.scale.dtype != torch.float32:
            raise ValueError("w.packed must be contiguous and w.scale a contiguous float32 tensor")
    else:
        raise TypeError(f"w must be an Int4Weight (lib.quant.quantize_int4) or an Int4Interleaved "
                        f"(lib.quant.interleave_scales), got {type(w).__name__}")
    return _gemv(x, w, 4, {"rows": rows, "block_n": block_n, "splits": splits, "num_warps": num_warps,
                           "num_stages": num_stages, "inline_sum": inline_sum})
