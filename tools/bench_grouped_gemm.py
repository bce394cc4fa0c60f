"""Check and time grouped-GEMM paths for MoE shapes on a GPU; prints one table.

    python tools/bench_grouped_gemm.py [--out rows.json]

For each shape (E experts, K, N), token count and routing: correctness of the lib kernel in bf16 against
a float32 reference, then GPU time (CUDA-graph replay) and call time (eager) of an eager loop of
torch.mm, the loop over 2/4/8 streams, torch._grouped_mm where the build has it, padded bmm, and the lib
kernel over a few launch configurations; against the floor max(F/P, Q/BW) of chapter 0's ceilings.
A first look ahead of chapter 4's notebook.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from lib import ceilings, timing  # noqa: E402
from lib.kernels import grouped_gemm as gg  # noqa: E402


def counts_for(T, E, routing, gen):
    if routing == "uniform":
        p = torch.full((E,), 1.0 / E)
    else:  # Dirichlet(alpha) expert popularity
        p = torch.distributions.Dirichlet(torch.full((E,), float(routing))).sample()
    return torch.multinomial(p, T, replacement=True, generator=gen).bincount(minlength=E)


def measure_case(E, K, N, w, w_nk, T, routing, gen, P, BW, rows):
    dev = "cuda"
    counts = counts_for(T, E, routing, gen)
    ends = counts.cumsum(0)
    offs_host = [0] + ends.tolist()
    offsets = torch.tensor(offs_host, dtype=torch.int32, device=dev)
    ends_dev = ends.to(torch.int32).to(dev)
    x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
    y = torch.empty(T, N, device=dev, dtype=torch.bfloat16)
    used = int((counts > 0).sum())
    F = 2 * T * K * N
    Q = 2 * (used * K * N + T * K + T * N)
    floor_us = max(F / P, Q / BW) * 1e6
    sample = [e for e in range(E) if counts[e] > 0][:4]
    ref = {e: x[offs_host[e]:offs_host[e + 1]].float() @ w[e].float() for e in sample}

    def err(out):
        num = sum(float((out[offs_host[e]:offs_host[e + 1]].float() - ref[e]).norm() ** 2) for e in sample)
        den = sum(float(ref[e].norm() ** 2) for e in sample)
        return (num / den) ** 0.5

    def loop():
        for e in range(E):
            a, b = offs_host[e], offs_host[e + 1]
            if b > a:
                torch.mm(x[a:b], w[e], out=y[a:b])
        return y

    def streams_fn(n):
        ss = [torch.cuda.Stream() for _ in range(n)]

        def run():
            cur = torch.cuda.current_stream()
            for s in ss:
                s.wait_stream(cur)
            for e in range(E):
                a, b = offs_host[e], offs_host[e + 1]
                if b > a:
                    with torch.cuda.stream(ss[e % n]):
                        torch.mm(x[a:b], w[e], out=y[a:b])
            for s in ss:
                cur.wait_stream(s)
            return y
        return run

    paths = {"loop": loop, "streams 2": streams_fn(2), "streams 4": streams_fn(4), "streams 8": streams_fn(8)}
    if hasattr(torch, "_grouped_mm"):
        for name, ww in (("grouped_mm", w), ("grouped_mm [E,N,K]", w_nk)):
            paths[name] = lambda ww=ww: torch._grouped_mm(x, ww, offs=ends_dev)
    Mmax = int(counts.max())
    xp = torch.zeros(E, Mmax, K, device=dev, dtype=torch.bfloat16)
    for e in range(E):
        xp[e, : counts[e]] = x[offs_host[e]:offs_host[e + 1]]
    paths["padded bmm"] = lambda: torch.bmm(xp, w)
    for bm, bn, bk, nw, ns in [(64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 64, 64, 4, 4),
                               (128, 256, 64, 8, 3), (32, 128, 128, 4, 4)]:
        out = torch.empty(T, N, device=dev, dtype=torch.bfloat16)
        paths[f"lib {bm}x{bn}x{bk} w{nw} s{ns}"] = (
            lambda bm=bm, bn=bn, bk=bk, nw=nw, ns=ns, out=out: gg.grouped_gemm(
                x, w, offsets, out=out, block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns))
    for name, fn in paths.items():
        try:
            o = fn()
            e_ = err(o) if name != "padded bmm" else None
            t = timing.bench([fn], device=dev, reps=7, target_ms=0.5)
        except Exception as ex:  # a path this build or layout does not support
            print("failed", E, K, N, T, routing, name, type(ex).__name__, str(ex)[:160], flush=True)
            continue
        rows.append({"E": E, "K": K, "N": N, "T": T, "routing": str(routing), "used": used, "Mmax": Mmax,
                     "path": name, "err": e_, "gpu_us": t.gpu_us.median, "call_us": t.call_us.median,
                     "floor_us": floor_us, "floor_frac": floor_us / t.gpu_us.median, "TFLOPs": F / t.gpu_us.median / 1e6})
    print(f"E={E} K={K} N={N} T={T} {routing} done", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    c = ceilings.load("nvidia-h200")
    P, BW = c["bf16_tflops"] * 1e12, c["copy_bw_GBps"] * 1e9
    rows = []
    for E, K, N in [(64, 2048, 1408), (128, 7168, 2048), (8, 4096, 14336)]:
        w = torch.randn(E, K, N, device=dev, dtype=torch.bfloat16)
        w_nk = w.transpose(1, 2).contiguous().transpose(1, 2)  # the same weights stored [E, N, K]
        for T in (256, 4096):
            for routing in ("uniform", 0.1):
                measure_case(E, K, N, w, w_nk, T, routing, gen, P, BW, rows)
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    import pandas as pd

    df = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print(df.drop(columns=["K", "N"]).round(3).to_string())


if __name__ == "__main__":
    main()
