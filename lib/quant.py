"""Weight quantizers for decode's GEMMs: bf16 weights to the integer formats the book's kernels read
(``lib.kernels.quant_gemm``), and back.

The book's products are y = x @ w with w [K, N] (K the input features, N the outputs), so an output
channel is a column of w.

- **int8, per output channel** (``quantize_int8``): q = round(w / s) in [-127, 127], one scale per column,
  s = max |w[:, n]| / 127. One byte per weight and 4 / K bytes of scale per weight.
- **int4, groups along K** (``quantize_int4``): each column is cut into groups of ``group`` consecutive
  rows (32, 64, 128 or 256), each with its scale s = max |w| / 7 over the group; q = round(w / s) in
  [-7, 7] (stored in four bits as -8..7, -8 unused so that the range is symmetric). Two rows share a byte:
  row 2i in the low four bits, row 2i + 1 in the high four. Half a byte per weight plus 4 / group bytes of
  scale per weight (fp32 scales; 2 / group in 16 bits).

Rounding is to nearest (ties to even, torch's ``round``), so a dequantized weight is within half a scale
of the original: |w - s q| <= s / 2. An all-zero column or group gets scale 1 (every q is 0), never a
division by zero.

The containers (``Int8Weight``, ``Int4Weight``, and ``Int4Interleaved``: the int4 scales stored after each
group's weights, ``interleave_scales``) and the packing live with the kernels that read them
(``lib.kernels.quant_gemm``) and are re-exported here. ``bytes_per_weight`` gives each format's bytes per
weight, scales included: what chapter 9's prediction of the decode speedup divides by (``speedup_bound``);
``predict_us`` gives a product's least time as the largest of its memory, matrix and conversion times, and
``crossover_rows`` the row count at which the matrix work catches up with the read.

Chapters: 9.
"""

from __future__ import annotations

import torch

from lib.kernels.quant_gemm import GROUPS, Int4Interleaved, Int4Weight, Int8Weight, interleave_scales, pack_int4, unpack_int4

__all__ = ["FP8_MAX", "GROUPS", "OPS_PER_WEIGHT", "Int4Interleaved", "Int4Weight", "Int8Weight", "bytes_per_weight",
           "crossover_rows", "interleave_scales", "pack_int4", "predict_us", "quantize_int4", "quantize_int8",
           "quantize_kv_fp8", "speedup_bound", "unpack_int4"]


def _check_weight(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a 2-D tensor [K, N], got {getattr(w, 'shape', type(w).__name__)}")
    if not w.is_floating_point():
        raise TypeError(f"w must be floating point (the weights to quantize), got {w.dtype}")
    if not torch.isfinite(w).all():
        raise ValueError("w holds NaN or infinite values: no scale represents them; check the weights")


def _scale(absmax: torch.Tensor, qmax: int) -> torch.Tensor:
    s = absmax.float() / qmax
    return torch.where(s > 0, s, torch.ones_like(s))


def quantize_int8(w: torch.Tensor) -> Int8Weight:
    """w [K, N] to int8 with one scale per column (see the module)."""
    _check_weight(w)
    s = _scale(w.abs().amax(dim=0), 127)
    q = torch.round(w.float() / s[None, :]).clamp_(-127, 127).to(torch.int8)
    return Int8Weight(q, s)


def quantize_int4(w: torch.Tensor, group: int = 128) -> Int4Weight:
    """w [K, N] to int4 in groups of ``group`` rows along K, packed two per byte (see the module)."""
    _check_weight(w)
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS} (rows of K per scale), got {group!r}")
    K, N = w.shape
    if K % group:
        raise ValueError(f"K = {K} is not a multiple of the group size {group}: pad K or choose a group that divides it")
    g = w.float().reshape(K // group, group, N)
    s = _scale(g.abs().amax(dim=1), 7)
    q = torch.round(g / s[:, None, :]).clamp_(-7, 7).to(torch.int8).reshape(K, N)
    return Int4Weight(pack_int4(q), s, group)


def bytes_per_weight(fmt: str, group: int | None = None, *, K: int = 4096, scale_bytes: int = 4) -> float:
    """Bytes a format reads per weight, its scales included: "bf16" 2, "int8" 1 + scale_bytes / K (one
    scale per column of K weights), "int4" 0.5 + scale_bytes / group, "fp8" 1 (one scale per tensor)."""
    if fmt == "bf16":
        return 2.0
    if fmt == "fp8":
        return 1.0
    if fmt == "int8":
        return 1.0 + scale_bytes / K
    if fmt == "int4":
        if group not in GROUPS:
            raise ValueError(f"int4 needs a group in {GROUPS}, got {group!r}")
        return 0.5 + scale_bytes / group
    raise ValueError(f"unknown format {fmt!r}: one of 'bf16', 'fp8', 'int8', 'int4'")


# CUDA-core instructions that turn one stored weight into the product's input in the main loop of
# lib.kernels.quant_gemm's tensor-core kernels, counted from its source: int8 one conversion; int4 (two
# weights a byte) an AND, a shift, two XORs and the byte's widening, 2.5 a weight; bf16 none. A model's count,
# to be set against measurement. (The GEMVs that take one row multiply on the CUDA cores too: their int4 loop
# compiles to about four instructions a weight for sm_90a, conversion, multiply-adds and addressing.)
OPS_PER_WEIGHT = {"bf16": 0.0, "int8": 1.0, "int4": 2.5}


def predict_us(fmt: str, M: int, K: int, N: int, *, read_GBps: float, mma_TFLOPs: float, alu_Tops: float,
               group: int = 128, block_m: int = 64) -> dict:
    """The least time of x [M, K] @ w [K, N] with w stored as ``fmt`` (microseconds), as the largest of three:
    reading the weights and scales at ``read_GBps``; the product's 2 M K N FLOPs at ``mma_TFLOPs``; and
    turning the weights into 16-bit values on the CUDA cores, OPS_PER_WEIGHT[fmt] instructions per weight at
    ``alu_Tops`` (tera-instructions per second), once per block of ``block_m`` rows of x. Returns each
    term, the time and which term bounds it."""
    if M < 1 or K < 1 or N < 1:
        raise ValueError(f"M, K and N must be at least 1, got {M}, {K}, {N}")
    weights = K * N
    terms = {"memory": weights * bytes_per_weight(fmt, group if fmt == "int4" else None, K=K) / (read_GBps * 1e3),
             "mma": 2.0 * M * weights / (mma_TFLOPs * 1e6),
             "alu": weights * OPS_PER_WEIGHT.get(fmt, 0.0) * -(-M // block_m) / (alu_Tops * 1e6)}
    bound = max(terms, key=terms.get)
    return {**terms, "time": terms[bound], "bound": bound}


def speedup_bound(fmt: str, group: int | None = None, *, K: int = 4096) -> float:
    """The most a format can speed up a memory-bound product over bf16: bf16's bytes over its bytes."""
    return bytes_per_weight("bf16") / bytes_per_weight(fmt, group, K=K)


def crossover_rows(fmt: str, group: int | None = None, *, read_GBps: float, mma_TFLOPs: float, K: int = 4096) -> float:
    """The row count M at which the product's matrix work takes as long as reading the weights: below it the
    format's fewer bytes set the time, above it the FLOPs do, the same for every format."""
    return bytes_per_weight(fmt, group, K=K) * mma_TFLOPs * 1e12 / (2.0 * read_GBps * 1e9)


FP8_MAX = 448.0  # the largest finite float8 e4m3 value


def quantize_kv_fp8(cache: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A K or V cache in float8 e4m3 with one scale for the whole tensor (as vLLM's ``kv_cache_dtype="fp8"``
    with per-tensor scales): (cache / scale in e4m3, scale), scale = max |cache| / 448; an all-zero cache gets
    scale 1. ``lib.kernels.decode_attention_fp8`` reads it with ``k_scale`` / ``v_scale`` = scale."""
    if not isinstance(cache, torch.Tensor) or not cache.is_floating_point():
        raise TypeError(f"cache must be a floating-point tensor, got {getattr(cache, 'dtype', type(cache).__name__)}")
    if not torch.isfinite(cache).all():
        raise ValueError("the cache holds NaN or infinite values: no scale represents them")
    amax = float(cache.abs().max()) if cache.numel() else 0.0
    scale = amax / FP8_MAX if amax > 0 else 1.0
    return (cache.float() / scale).to(torch.float8_e4m3fn), scale
