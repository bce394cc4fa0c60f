"""Sweep the skinny GEMM's launch parameters at the decode step's shapes on a GPU; prints the best per shape.

    python tools/tuning/skinny_sweep.py [--out rows.json]

For Llama-3-8B's products (QKV, O, gate-up, down, the output head) at 1 and 64 rows: every launch of a
grid of tiles (block_n, block_k), splits of K, warps and pipeline stages, checked against float32 first,
then timed by CUDA-graph replay with enough copies of the matrix to defeat the L2 (``timing.rotation``),
beside torch.mm (cuBLAS) on the same copies. Each row has the GPU time, the matrix's bytes over it, and
that rate over chapter 0's read rate. ``choose_config`` in ``lib.kernels.skinny_gemm`` is read from these
rows.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import torch  # noqa: E402

from lib.bench import timing  # noqa: E402
from lib.kernels import skinny_gemm as sk  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096), "head": (4096, 128256)}
GRID = {"block_n": (64, 128, 256), "block_k": (64, 128), "splits": (1, 2, 4, 8, 16), "num_warps": (4, 8),
        "num_stages": (3, 4)}


def main() -> int:
    args, read_bw, l2, gen = records.gpu_sweep("1,64", ())
    rows = []
    for name, (K, N) in SHAPES.items():
        nbytes = K * N * 2
        copies = timing.rotation(nbytes, l2)
        ws = [torch.randn(K, N, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(copies)]
        for M in (int(m) for m in args.rows.split(",")):
            x = torch.randn(M, K, device="cuda", generator=gen, dtype=torch.bfloat16)
            ref = x.float() @ ws[0].float()

            def time_of(fn, ws=ws):
                t = timing.bench([lambda w=w: fn(w) for w in ws], device="cuda", reps=5, warmup=2, target_ms=1.0)
                return t.gpu_us.median

            cublas = time_of(lambda w, x=x: x @ w)
            best = None
            for vals in itertools.product(*GRID.values()):
                kw = dict(zip(GRID, vals))
                if K % kw["splits"] or (K // kw["splits"]) % kw["block_k"]:
                    continue
                try:
                    y = sk.skinny_mm(x, ws[0], **kw)
                except Exception as ex:  # a launch this GPU refuses (shared memory): recorded, not fatal
                    rows.append({"shape": name, "M": M, "K": K, "N": N, **kw, "error": str(ex)[:200]})
                    continue
                err = float((y.float() - ref).norm() / ref.norm())
                if not err < 2e-2:
                    raise AssertionError(f"{name} M={M} {kw}: relative error {err:.3g}")
                us = time_of(lambda w, kw=kw, x=x: sk.skinny_mm(x, w, **kw))
                row = {"shape": name, "M": M, "K": K, "N": N, **kw, "gpu_us": us, "GBps": nbytes / us / 1e3,
                       "of_read_rate": nbytes / us * 1e6 / read_bw, "cublas_us": cublas,
                       "cublas_of_read_rate": nbytes / cublas * 1e6 / read_bw}
                rows.append(row)
                if best is None or us < best["gpu_us"]:
                    best = row
            chosen = sk.choose_config(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
            auto = time_of(lambda w, x=x: sk.skinny_mm(x, w))
            rows.append({"shape": name, "M": M, "K": K, "N": N, "chosen": chosen, "gpu_us": auto,
                         "of_read_rate": nbytes / auto * 1e6 / read_bw, "cublas_us": cublas})
            print(f"{name:8s} M={M:3d}: cuBLAS {nbytes / cublas * 1e6 / read_bw:.3f} of the read rate; best "
                  f"{best['of_read_rate']:.3f} {({k: best[k] for k in GRID})}; choose_config {nbytes / auto * 1e6 / read_bw:.3f}",
                  flush=True)
            records.write(args.out, rows, tool=__file__)
        del ws
    return 0


if __name__ == "__main__":
    sys.exit(main())
