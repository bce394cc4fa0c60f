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

The containers (``Int8Weight``, ``Int4Weight``) and the packing live with the kernels that read them
(``lib.kernels.quant_gemm``) and are re-exported here. ``bytes_per_weight`` gives each format's bytes per
weight, scales included: what chapter 9's prediction of the decode speedup divides by.

Chapters: 9.
"""

from __future__ import annotations

import torch

from lib.kernels.quant_gemm import GROUPS, Int4Weight, Int8Weight, pack_int4, unpack_int4

__all__ = ["GROUPS", "Int4Weight", "Int8Weight", "bytes_per_weight", "pack_int4", "quantize_int4", "quantize_int8",
           "unpack_int4"]


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
