"""Sweep the quantized GEMVs' launch parameters at decode's rows on a GPU; prints the best per shape.

    python tools/tuning/quant_gemv_sweep.py [--out rows.json] [--rows 1,4] [--formats int8,int4,int4rows] [--grid JSON]

``--grid`` replaces some of the launch grid's lists, e.g. '{"rows": [4, 8], "num_warps": [2, 4]}'.

For Llama-3-8B's four layer products and each row count: every launch of a grid of tiles (rows of bytes,
columns), splits of K and warps for ``w8_gemv`` (int8) and ``w4_gemv`` (int4, groups of 128), checked
against the float32 product of the dequantized weights first, then timed by CUDA-graph replay over copies
of the weights that defeat the L2. Beside them on the same matrices: bf16 cuBLAS, torch's int4 path
(``_weight_int4pack_mm``, groups of 128) and the tensor-core kernels' default launch (``w4_mm``,
``w8_mm``), and two floors: one kernel that only reads the quantized bytes (chapter 0's ``read_sum``), and cuBLAS's
bf16 product over a matrix of as many bytes.
Each row has the GPU time, the bytes read (weights and scales) over it as a fraction of chapter 0's read
rate, and the speedup over bf16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_gemv_variants  # noqa: E402
import records  # noqa: E402
import torch  # noqa: E402

from lib import quant  # noqa: E402
from lib.experiments import quantization  # noqa: E402
from lib.kernels import quant_gemm as qg  # noqa: E402
from lib.kernels import stream  # noqa: E402

GRID = {"rows": (16, 32, 64, 128), "block_n": (128, 256, 512), "splits": (1, 2, 4, 8, 16, 32), "num_warps": (4, 8)}
# "int4rows": the variant of several rows of x per program (tools/tuning/quant_gemv_variants.py)
GRID_ROWS = {"block_m": (2, 4, 8), "rows": (8, 16), "block_n": (128,), "splits": (1, 2, 4, 8), "num_warps": (4,)}


def torch_int4(w: torch.Tensor, x: torch.Tensor):
    """torch's tinygemm int4 path at groups of 128 on w (bf16 [K, N]), prepared as chapter 9's experiment
    prepares it: a call, or None where this build lacks it."""
    try:
        prepared = quantization._torch_int4(w)
        return lambda: quantization._torch_int4_mm(x, prepared)
    except Exception as ex:  # a vendor path this build lacks: recorded, not fatal
        print(f"torch int4: {str(ex)[:120]}")
        return None


def main() -> int:
    args, read_bw, l2, gen = records.gpu_sweep("1,4", (("--formats", "int8,int4"), ("--grid", "")))
    given = json.loads(args.grid) if args.grid else {}
    rows = []
    for name, K, N, ws, M, x, base in records.weight_cases(args.rows, l2, gen):
        ti4 = torch_int4(ws[0], x)
        if ti4 is not None:
            ref4 = x.float() @ quant.quantize_int4(ws[0], 128).dequantize(torch.float32)
            err = float((ti4().float() - ref4).norm() / ref4.norm())
            rows.append({"shape": name, "M": M, "format": "torch int4", "gpu_us": records.time_of([ti4]),
                         "bf16_us": base, "rel_err": err})
        for fmt in args.formats.split(","):
            qws = [quant.quantize_int8(w) if fmt == "int8" else quant.quantize_int4(w, 128) for w in ws]
            fn, mm = {"int8": (qg.w8_gemv, qg.w8_mm), "int4": (qg.w4_gemv, qg.w4_mm),
                      "int4rows": (quant_gemv_variants.w4_gemv_rows, qg.w4_mm)}[fmt]
            grid = {**(GRID_ROWS if fmt == "int4rows" else GRID), **given}
            nbytes = K * N + 4 * N if fmt == "int8" else K * N // 2 + 4 * (K // 128) * N
            half = [torch.empty(nbytes // 2, device="cuda", dtype=torch.uint8).random_(generator=gen)
                    for _ in range(2 * len(ws))]
            floor = records.time_of([lambda a=a, b=b: stream.read_sum(a, b, programs=4 * 132)
                             for a, b in zip(half[::2], half[1::2])])
            del half
            # the vendor's GEMV over as many bf16 bytes as the quantized weights' (K / 4 or K / 2 rows)
            kb = K // 2 if fmt == "int8" else K // 4
            wb = [torch.randn(kb, N, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(len(ws))]
            xb = x[:, :kb].contiguous()
            same_bytes = records.time_of([lambda w=w, xb=xb: xb @ w for w in wb])
            del wb
            mm_us = records.time_of([lambda q=q, x=x, mm=mm: mm(x, q) for q in qws])
            ref = x.float() @ qws[0].dequantize(torch.float32)

            def skip(kw, fmt=fmt, K=K, M=M):
                per = kw["rows"] if fmt == "int8" else 2 * kw["rows"]
                four = fmt != "int8"
                return K % (kw["splits"] * (128 if four else per)) or (four and per > 128) \
                    or kw.get("block_m", 1) > max(2, M)  # more rows per program than x has: nothing to gain

            start = len(rows)
            best = records.launch_search(fn, x, qws, ref, grid, skip, records.time_of,
                                         {"shape": name, "M": M, "K": K, "N": N, "format": fmt}, rows)
            records.rate_columns(rows[start:], nbytes, read_bw, base, read_floor_us=floor, bf16_same_bytes_us=same_bytes,
                                 mm_default_us=mm_us)
            t4 = next((r["gpu_us"] for r in rows[::-1] if r.get("format") == "torch int4" and r["shape"] == name
                       and r["M"] == M), float("nan"))
            print(f"{name:8s} M={M} {fmt}: bf16 {base:6.1f} us, torch int4 {t4:6.1f}, read floor {floor:5.1f}, "
                  f"bf16 same bytes {same_bytes:5.1f}, "
                  f"tensor-core default {mm_us:6.1f}; best GEMV {best['gpu_us']:6.1f} us x{best['speedup']:.2f} "
                  f"({best['of_read_rate']:.2f} of read) {({k: best[k] for k in grid})}", flush=True)
            records.write(args.out, rows, tool=__file__)
            del qws
    return 0


if __name__ == "__main__":
    sys.exit(main())
