"""The FP8 KV cache's decode attention with its tiles converted to fp16 (the default) and to bf16, beside the
bf16 cache, on a GPU; prints a table. With ``--launches``, the fp16 kernel's tile and warps swept instead
(the default plan's, and each tile of 16-128 tokens with 1, 2 or 4 warps at the default splits and each
pipeline depth of ``--stages``).

    python tools/tuning/fp8_kv_dot.py [--out rows.json] [--launches [--stages 3,4,5]]

Llama-3-8B's heads (32 query, 8 KV, d = 128), pages of 16 in a random order, batches 1 and 16 at 4k and
64k tokens: each variant checked against float64 attention over the dequantized cache, then timed by
CUDA-graph replay over copies of the cache that defeat the L2. Each row: GPU time, the cache's bytes over
it (GB/s) and the speedup over the bf16 cache.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from lib import quant  # noqa: E402
from lib.bench import timing  # noqa: E402
from lib.kernels import decode_attention as da  # noqa: E402
from lib.kernels import decode_attention_fp8 as da8  # noqa: E402
from lib.kernels import launch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", action="store_true")
    ap.add_argument("--stages", type=lambda v: [int(s) for s in v.split(",")], default=[3],
                    help="pipeline depths to sweep with --launches, e.g. 3,4,5")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B, L in ((1, 4096), (1, 65536), (16, 4096), (16, 65536)):
        q = torch.randn(B, 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
        dense = [torch.randn(B, 8, L, 128, generator=gen, device="cuda").to(torch.bfloat16) for _ in "kv"]
        kc, bt = da.paginate(dense[0], 16, generator=torch.Generator().manual_seed(B + L))
        vc, _ = da.paginate(dense[1], 16, block_table=bt)
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        (k8, ks), (v8, vs) = quant.quantize_kv_fp8(kc), quant.quantize_kv_fp8(vc)
        plans = {"bf16 cache": da.DecodeAttention(q, kc, vc, bt, lens)}
        default = da8.DecodeAttentionFP8(q, k8, v8, bt, lens, k_scale=ks, v_scale=vs)
        if args.launches:
            plans["fp8 default"] = default
            for block_n in (16, 32, 64, 128):
                for warps in (1, 2, 4):
                    for stages in args.stages:
                        plans[f"fp8 n={block_n} w={warps} st={stages}"] = da8.DecodeAttentionFP8(
                            q, k8, v8, bt, lens, k_scale=ks, v_scale=vs, block_n=block_n, num_warps=warps,
                            num_splits=default.splits, num_stages=stages)
        else:
            for name, dot in (("fp8, fp16 products", tl.float16), ("fp8, bf16 products", tl.bfloat16)):
                p = da8.DecodeAttentionFP8(q, k8, v8, bt, lens, k_scale=ks, v_scale=vs)
                p.split_launch = launch.Launch(da8._decode_fp8_kernel, p.grid, {**p.meta, "DOT": dot}, p.options,
                                               q.device)
                plans[name] = p
        ref = da.reference(q[:1], k8.double() * ks, v8.double() * vs, bt[:1], lens[:1], dtype=torch.float64)
        copies = {n: timing.rotation(2 * (kc if n == "bf16 cache" else k8).numel()
                                     * (kc if n == "bf16 cache" else k8).element_size(), l2) for n in plans}
        base = None
        for name, plan in plans.items():
            k, v = (kc, vc) if name == "bf16 cache" else (k8, v8)
            out = plan(q, k, v, bt, lens)
            err = float((out[:1].double() - ref).norm() / ref.norm())
            sets = [(k, v)] + [(k.clone(), v.clone()) for _ in range(copies[name] - 1)]
            us = records.time_of([lambda p=plan, s=s, a=(q, bt, lens): p(a[0], *s, *a[1:]) for s in sets])
            base = base or us
            rows.append({"B": B, "L": L, "variant": name, "gpu_us": us, "rel_err_vs_fp8_values": err,
                         "GBps": 2 * k.numel() * k.element_size() / us / 1e3, "speedup": base / us})
            del sets
        del dense, kc, vc, k8, v8
        torch.cuda.empty_cache()
    if args.launches:  # the best launch per case, beside the default and the bf16 cache
        best = {}
        for r in rows:
            if r["variant"].startswith("fp8 n=") and (r["B"], r["L"]) not in best or \
                    r["variant"].startswith("fp8 n=") and r["gpu_us"] < best[r["B"], r["L"]]["gpu_us"]:
                best[r["B"], r["L"]] = r
        shown = [r for r in rows if not r["variant"].startswith("fp8 n=")] + list(best.values())
    else:
        shown = rows
    for r in shown:
        print(f"B={r['B']:3d} L={r['L']:6d} {r['variant']:24s} {r['gpu_us']:9.1f} us {r['GBps']:7.0f} GB/s "
              f"x{r['speedup']:.2f} err {r['rel_err_vs_fp8_values']:.2e}")
    records.write(args.out, rows, tool=__file__)


if __name__ == "__main__":
    main()
