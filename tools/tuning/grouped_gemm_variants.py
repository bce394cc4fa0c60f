"""Variants of ``lib.kernels.grouped_gemm`` that only the tuning sweeps use (bench_grouped_gemm.py).

The book's TMA kernel runs its tile loop plainly or flattened, and takes the tiles expert after expert or
the heavy experts' first. The sweeps also tried, on the TMA kernel:

- ``warp_specialize``: Triton's warp specialization of the tile loop (``tl.range(..., warp_specialize=)``:
  some warps only load, the others only compute);
- ``order="interleave"``: the heavy experts' tiles (more than one row tile) and the light ones', each
  list expert after expert, merged evenly: position i of the schedule takes a heavy tile when
  floor((i + 1) H / total) > floor(i H / total), for H heavy tiles of ``total``, so that every stretch of
  the schedule mixes the products that compute with those that stream weights.

The variant kernel reuses the book's ``@triton.jit`` pieces (descriptors, schedule, list selection, one
output tile by TMA) and differs only in its loop and order. ``GroupedGemmVariant`` is
``lib.kernels.grouped_gemm.GroupedGemm`` (the same plan and planned launch) with this kernel where a
variant knob is set. Nothing in ``lib`` imports this module.

Chapter 4's lab notes report what the sweeps found.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lib.kernels import grouped_gemm as gg  # noqa: E402
from lib.kernels import launch  # noqa: E402
from lib.kernels.grouped_gemm import _in_list, _order, _schedule, _tma_descriptors, _tma_output_tile  # noqa: E402

ORDERS = {**gg.ORDERS, "interleave": max(gg.ORDERS.values()) + 1}
INTERLEAVE: tl.constexpr = tl.constexpr(ORDERS["interleave"])


@triton.jit
def _order_variant(i, tiles, ends, tiles_h, ends_h, total, ORDER: tl.constexpr):
    """``lib``'s orders, and the interleaved one (see the module's docstring)."""
    if ORDER == INTERLEAVE:
        heavy64 = tl.sum(tiles_h, 0).to(tl.int64)  # products past 2^31 for schedules of many tiles
        before = (heavy64 * i // total).to(tl.int32)  # heavy positions before i
        is_heavy = heavy64 * (i + 1) // total > before
        return _in_list(is_heavy, tl.where(is_heavy, before, i - before), tiles, ends, tiles_h, ends_h, total)
    return _order(i, tiles, ends, tiles_h, ends_h, total, ORDER)


@triton.jit
def _grouped_gemm_tma_variant_kernel(
    # pointers
    X, W, Y, OFFS,
    # shapes
    T, E, N, K,
    # strides (elements)
    stride_xm, stride_we, stride_wk, stride_ym, stride_yn,
    # meta-parameters: the book's TMA kernel's, then the variant's
    NUM_PROGRAMS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, FLATTEN: tl.constexpr, HALF_TAIL: tl.constexpr = False, ORDER: tl.constexpr = 0,
    WS: tl.constexpr = False,
):
    pid = tl.program_id(0)
    x_desc, xh_desc, w_desc = _tma_descriptors(X, W, T, E, N, K, stride_xm, stride_we, stride_wk, BLOCK_M, BLOCK_N,
                                               BLOCK_K, HALF_TAIL)
    ee, lo, hi, tiles_m, half, tiles, ends, tiles_h, ends_h, total = _schedule(OFFS, E, N, BLOCK_E, BLOCK_M, BLOCK_N,
                                                                               HALF_TAIL)
    for i in tl.range(pid, total, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        tile, tiles_o, ends_o = _order_variant(i, tiles, ends, tiles_h, ends_h, total, ORDER)
        _tma_output_tile(tile, tiles_o, ends_o, ee, lo, hi, tiles_m, half, x_desc, xh_desc, w_desc, Y, N, K,
                         stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, HALF_TAIL)


class GroupedGemmVariant(gg.GroupedGemm):
    """``GroupedGemm`` planned the same way; with ``warp_specialize`` or ``order="interleave"`` it launches
    the variant TMA kernel (refused where the tensors rule TMA out)."""

    def __init__(self, x, w, offsets, *, warp_specialize: bool = False, order: str | None = None, **plan):
        if order is not None and order not in ORDERS:
            raise ValueError(f"order must be one of {tuple(ORDERS)}, got {order!r}")
        super().__init__(x, w, offsets, order=None if order == "interleave" else order, **plan)
        if not (warp_specialize or order == "interleave"):
            return
        if not self.tma:
            raise ValueError("warp_specialize and order='interleave' exist for the TMA kernel only; these tensors "
                             "(or tma=False) take the pointer kernel")
        order = order or self.config["order"]
        self.config.update(order=order, warp_specialize=bool(warp_specialize))
        self.meta.update(ORDER=ORDERS[order], WS=bool(warp_specialize))
        self.launch = launch.Launch(_grouped_gemm_tma_variant_kernel, self.grid, self.meta, self.options, x.device)


def grouped_gemm(x, w, offsets, *, out=None, **kw):
    """``lib.kernels.grouped_gemm.grouped_gemm`` with the variant's knobs: plans on every call."""
    return GroupedGemmVariant(x, w, offsets, out=out, **kw)(x, w, offsets, out=out)
