"""A first look at the quantized GEMMs on a GPU: int8 and int4 weights against bf16 cuBLAS at decode's rows.

    python tools/tuning/quant_first_look.py [--out rows.json] [--rows 1,4,16,64]

For Llama-3-8B's four layer products (QKV, O, gate-up, down) and each row count: bf16 x @ w (cuBLAS),
``w8_mm`` (int8, per-channel scales) and ``w4_mm`` (int4, groups of 32, 128 and 256) from
``lib.kernels.quant_gemm``, each checked against the float32 product of its own dequantized weights, then
timed by CUDA-graph replay over enough copies of the weights to defeat the L2 (``timing.rotation``). Each
row has the GPU time, the bytes the format reads (weights and scales) over it as a fraction of chapter 0's
read rate, and the speedup over bf16. The launches are ``choose_config``'s; no tuning yet.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import torch  # noqa: E402

from lib import quant  # noqa: E402
from lib.bench import timing  # noqa: E402
from lib.kernels import quant_gemm as qg  # noqa: E402

SHAPES = records.SHAPES_8B


def main() -> int:
    args, read_bw, l2, gen = records.gpu_sweep("1,4,16,64", ())
    rows = []
    for name, (K, N) in SHAPES.items():
        copies = timing.rotation(K * N * 2, l2)
        ws = [(torch.randn(K, N, device="cuda", generator=gen) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        formats = {"int8": [quant.quantize_int8(w) for w in ws]}
        for g in (32, 128, 256):
            formats[f"int4 g{g}"] = [quant.quantize_int4(w, g) for w in ws]
        nbytes = {"bf16": K * N * 2, "int8": K * N + 4 * N,
                  **{f"int4 g{g}": K * N // 2 + 4 * (K // g) * N for g in (32, 128, 256)}}
        for M in (int(m) for m in args.rows.split(",")):
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)

            def time_of(calls):
                return timing.bench(calls, device="cuda", reps=5, warmup=2, target_ms=1.0)

            t = time_of([lambda w=w, x=x: x @ w for w in ws])
            base = t.gpu_us.median
            rows.append({"shape": name, "M": M, "K": K, "N": N, "format": "bf16", "gpu_us": base,
                         "call_us": t.call_us.median, "of_read_rate": nbytes["bf16"] / base * 1e6 / read_bw,
                         "speedup": 1.0})
            line = [f"{name:8s} M={M:3d} bf16 {base:7.1f} us"]
            for fmt, qws in formats.items():
                fn = qg.w8_mm if fmt == "int8" else qg.w4_mm
                ref = x.float() @ qws[0].dequantize(torch.float32)
                err = float((fn(x, qws[0]).float() - ref).norm() / ref.norm())
                if not err < 2e-2:
                    raise AssertionError(f"{name} M={M} {fmt}: relative error {err:.3g} against its own weights")
                t = time_of([lambda q=q, x=x, fn=fn: fn(x, q) for q in qws])
                us = t.gpu_us.median
                rows.append({"shape": name, "M": M, "K": K, "N": N, "format": fmt, "gpu_us": us,
                             "call_us": t.call_us.median, "of_read_rate": nbytes[fmt] / us * 1e6 / read_bw,
                             "speedup": base / us, "rel_err": err})
                line.append(f"{fmt} x{base / us:4.2f} ({nbytes[fmt] / us * 1e6 / read_bw:.2f} of read)")
            print(" | ".join(line), flush=True)
            records.write(args.out, rows, tool=__file__)
        del ws, formats
    return 0


if __name__ == "__main__":
    sys.exit(main())
