"""Sweep the quantized GEMMs' launch parameters at decode's rows on a GPU; prints the best per shape.

    python tools/tuning/quant_sweep.py [--out rows.json] [--rows 1,16] [--formats int8,int4] [--grid JSON]

``--grid`` replaces some of the launch grid's lists, e.g. '{"swap": [true]}'.

For Llama-3-8B's four layer products and each row count: every launch of a grid of tiles (block_n,
block_k), splits of K, warps and the operand order (``swap``) for ``w8_mm`` (int8) and ``w4_mm`` (int4,
groups of 128), checked against the float32 product of the dequantized weights first, then timed by
CUDA-graph replay over copies of the weights that defeat the L2, beside bf16 cuBLAS on the same matrices.
Each row has the GPU time, the bytes read (weights and scales) over it as a fraction of chapter 0's read
rate, and the speedup over bf16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import torch  # noqa: E402

from lib import quant  # noqa: E402
from lib.kernels import quant_gemm as qg  # noqa: E402

GRID = {"block_n": (64, 128, 256), "block_k": (64, 128), "splits": (1, 2, 4, 8, 16), "num_warps": (4, 8),
        "swap": (False, True)}


def main() -> int:
    args, read_bw, l2, gen = records.gpu_sweep("1,16", (("--formats", "int8,int4"), ("--grid", "")))
    grid = {**GRID, **json.loads(args.grid)} if args.grid else GRID
    rows = []
    for name, K, N, ws, M, x, base in records.weight_cases(args.rows, l2, gen):
        for fmt in args.formats.split(","):
            qws = [quant.quantize_int8(w) if fmt == "int8" else quant.quantize_int4(w, 128) for w in ws]
            fn = qg.w8_mm if fmt == "int8" else qg.w4_mm
            nbytes = K * N + 4 * N if fmt == "int8" else K * N // 2 + 4 * (K // 128) * N
            ref = x.float() @ qws[0].dequantize(torch.float32)
            base_row = {"shape": name, "M": M, "K": K, "N": N, "format": fmt}
            start = len(rows)
            best = records.launch_search(fn, x, qws, ref, grid, lambda kw, K=K: K % (kw["splits"] * kw["block_k"]),
                                         records.time_of, base_row, rows)
            records.rate_columns(rows[start:], nbytes, read_bw, base)
            print(f"{name:8s} M={M:3d} {fmt}: bf16 {base:6.1f} us; best {best['gpu_us']:6.1f} us x{best['speedup']:.2f} "
                  f"({best['of_read_rate']:.2f} of read) {({k: best[k] for k in grid})}", flush=True)
            records.write(args.out, rows, tool=__file__)
            del qws
    return 0


if __name__ == "__main__":
    sys.exit(main())
