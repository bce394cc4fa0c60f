"""Check and time grouped-GEMM paths for MoE shapes on a GPU; prints one table.

    python tools/tuning/bench_grouped_gemm.py [--out rows.json]
        [--tiles | --tma | --mid | --tall | --order | --flatten | --mainloop]

For each shape (E experts, K, N), token count and routing: correctness of the lib kernel in bf16 against
a float32 reference, then GPU time (CUDA-graph replay) and call time (eager) of an eager loop of
torch.mm, the loop over 2/4/8 streams, torch._grouped_mm where the build has it, padded bmm, and the lib
kernel over a few launch configurations; against the floor max(F/P, Q/BW) of chapter 0's ceilings.
A first look ahead of chapter 4's notebook.

Launches with the knobs the book's kernel does not have (warp specialization, the interleaved tile
order) run the variant kernel of ``grouped_gemm_variants.py``, beside this file. ``--out`` records are
written with their provenance (``records.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grouped_gemm_variants as variants  # noqa: E402
import records  # noqa: E402
import torch  # noqa: E402

from lib.bench import ceilings, timing  # noqa: E402
from lib.experiments.grouped_gemm import route as counts_for  # noqa: E402  (chapter 4's routing)
from lib.kernels import grouped_gemm as gg  # noqa: E402
from lib.kernels import launch  # noqa: E402


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


TILES = [(128, 256, 64, 8, 3, 1), (16, 64, 128, 4, 6, 1), (16, 128, 128, 4, 5, 1), (16, 128, 64, 4, 6, 1),
         (16, 256, 64, 4, 4, 1), (32, 128, 128, 4, 4, 1), (32, 64, 128, 4, 6, 1), (64, 128, 64, 4, 4, 1),
         (64, 128, 128, 4, 4, 1), (64, 256, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 128, 64, 4, 4, 1),
         (128, 256, 64, 8, 4, 1), (64, 256, 64, 4, 4, 1), (16, 128, 128, 4, 4, 2), (32, 128, 64, 4, 4, 2),
         (64, 128, 64, 4, 3, 2), (16, 64, 128, 4, 4, 2)]  # block m, n, k, warps, stages, programs per SM


def _tile_variants(E, T, sms, tma):
    if not tma:
        return [(f"{bm}x{bn}x{bk} w{nw} s{ns} x{pm}", dict(tma=False, block_m=bm, block_n=bn, block_k=bk, num_warps=nw,
                                                         num_stages=ns, num_programs=pm * sms))
                for bm, bn, bk, nw, ns, pm in TILES]
    variants = [("rule", dict(tma=False)), ("rule tma", dict(tma=True))]
    if tma == "mid":  # a few tokens to a few hundred per expert: tiles between the small and the large
        return variants + [(f"tma {bm}x{bn}x{bk} w{nw} s{ns} x{pm}", dict(tma=True, block_m=bm, block_n=bn, block_k=bk,
                                                                       num_warps=nw, num_stages=ns, num_programs=pm * sms))
                           for bm, bn, bk, nw, ns, pm in [(64, 128, 64, 4, 4, 2), (64, 128, 128, 4, 3, 2),
                                                          (64, 256, 64, 8, 3, 1), (64, 256, 64, 4, 4, 1),
                                                          (128, 128, 64, 8, 4, 1), (128, 128, 64, 4, 4, 2),
                                                          (128, 256, 64, 8, 4, 1), (128, 128, 128, 8, 3, 1)]]
    if T / E > 32:
        return variants + [(f"tma 128x{bn}x64 s{ns} ws{int(ws)} fl{int(fl)}",
                            dict(tma=True, block_m=128, block_n=bn, block_k=64, num_warps=8, num_stages=ns,
                                 warp_specialize=ws, flatten=fl, num_programs=sms))
                           for bn, ns, ws, fl in itertools.product([128, 256], [3, 4], [False, True], [False, True])]
    return variants + [(f"tma {bm}x{bn}x{bk} s{ns} x2", dict(tma=True, block_m=bm, block_n=bn, block_k=bk, num_warps=4,
                                                               num_stages=ns, num_programs=2 * sms))
                       for bm, bn, bk, ns in [(16, 128, 128, 4), (32, 128, 64, 4), (64, 128, 64, 4), (16, 64, 128, 6)]]


def _tile_case(E, K, N, w, T, routing, gen, sms, P, BW, tma):
    dev = "cuda"
    counts = counts_for(T, E, routing, gen)
    offs = torch.tensor([0] + counts.cumsum(0).tolist(), dtype=torch.int32, device=dev)
    ends = offs[1:].contiguous()
    x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
    used = int((counts > 0).sum())
    floor = max(2 * T * K * N / P, 2 * (used * K * N + T * K + T * N) / BW) * 1e6
    ref = torch._grouped_mm(x, w, offs=ends)
    gm = timing.bench([lambda: torch._grouped_mm(x, w, offs=ends)], device=dev, reps=5, target_ms=1.0).gpu_us.median
    out = torch.empty(T, N, device=dev, dtype=torch.bfloat16)
    rows = []
    for name, kw in _tile_variants(E, T, sms, tma):
        def fn(kw=kw):
            return variants.grouped_gemm(x, w, offs, out=out, **kw)
        try:
            out.fill_(float("nan"))
            fn()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            assert err < 2e-2, err
            t = timing.bench([fn], device=dev, reps=5, target_ms=1.0)
        except Exception as ex:  # a configuration this compiler or the GPU refuses
            print("failed", E, T, routing, name, type(ex).__name__, str(ex)[:160], flush=True)
            continue
        rows.append(dict(E=E, K=K, N=N, T=T, routing=routing, path=name, kw=kw, gpu_us=t.gpu_us.median,
                         call_us=t.call_us.median, floor_us=floor, grouped_mm_us=gm))
    return rows


def sweep_tiles(out_path, tma):
    """The lib kernel over tile shapes, warps, stages and programs per SM (pointer loads; or TMA loads, with
    warp specialization and loop flattening tried for the large tiles, against the tile rule), against
    torch._grouped_mm, on the chapter's MoE shapes; correctness against grouped_mm's output first."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    c = ceilings.load("nvidia-h200")
    P, BW = c["bf16_tflops"] * 1e12, c["copy_bw_GBps"] * 1e9
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for E, K, N in [(8, 4096, 14336), (64, 2048, 1408), (128, 7168, 2048), (256, 7168, 2048)]:
        w = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16) * 0.02
        for T, routing in itertools.product([64, 1024, 8192, 16384], ["uniform", "0.1"]):
            if (E == 8 and T == 64) or (E != 8 and T == 16384):
                continue
            if tma == "mid" and not 32 < T / E <= 256:
                continue
            rows += _tile_case(E, K, N, w, T, routing, gen, sms, P, BW, tma)
            print(f"E={E} T={T} {routing} done", flush=True)
            records.write(out_path, rows, tool=__file__)
        torch.cuda.empty_cache()


def sweep_cases(out_path, configs, keep, pair_all=False):
    """Chapter 4's own cases (their token counts read from its results) that ``keep`` accepts, the lib
    kernel over ``configs`` (GroupedGemm keywords; "rule" is its defaults), each checked on some experts
    before it is timed; then in interleaved pairs (lib.bench.timing.paired) against the rule: each case's fastest, or
    with ``pair_all`` every configuration. Rows are written after every case."""
    from lib.bench import timing

    dev = "cuda"
    res = json.loads((Path(__file__).resolve().parents[2] / "results/nvidia-h200/04-grouped-gemm.json").read_text())
    cases = [p for p in res["data"]["points"] if p["path"] == "lib" and keep(p)]
    torch.manual_seed(0)
    rows, ws = [], {}
    for c in cases:
        E, K, N, T, routing, counts = c["E"], c["K"], c["N"], c["T"], c["routing"], c["counts"]
        if (E, K, N) not in ws:
            ws.clear()
            torch.cuda.empty_cache()
            ws[(E, K, N)] = torch.randn(E, K, N, device=dev, dtype=torch.bfloat16)
        w = ws[(E, K, N)]
        offs = [0] + torch.tensor(counts).cumsum(0).tolist()
        offsets = torch.tensor(offs, dtype=torch.int32, device=dev)
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        nonempty = [e for e in range(E) if counts[e]]
        fns, times = {}, {}
        for name, kw in configs.items():
            out = torch.zeros(T, N, device=dev, dtype=torch.bfloat16)
            try:
                plan = variants.GroupedGemmVariant(x, w, offsets, out=out, **kw)
                plan(x, w, offsets, out=out)
            except Exception as ex:  # a launch this compiler refuses (never the rule's)
                if name == "rule":
                    raise
                print("failed", E, T, routing, name, type(ex).__name__, str(ex)[:160], flush=True)
                continue
            for e in nonempty[:3] + nonempty[-2:]:  # checked before timed
                ref = x[offs[e]:offs[e + 1]].float() @ w[e].float()
                err = float((out[offs[e]:offs[e + 1]].float() - ref).norm() / ref.norm())
                assert err < 2e-2, (E, T, routing, name, e, err)
            fns[name] = lambda plan=plan, out=out, x=x, w=w, o=offsets: plan(x, w, o, out=out)
            times[name] = timing.bench([fns[name]], device=dev, reps=5, target_ms=0.5).gpu_us.median
        best = min((n for n in times if n != "rule"), key=times.get)
        paired = [n for n in times if n != "rule"] if pair_all else [best]
        pairs = {n: timing.paired(fns["rule"], fns[n], device=dev, pairs=11, target_ms=0.5).to_dict() for n in paired}
        rows.append({"E": E, "T": T, "routing": routing, "gpu_us": times, "best": best,
                     "over_rule_pairs": pairs})
        print(f"E={E:3d} T={T:5d} {routing:7s} " + " ".join(f"{n}:{t:.1f}" for n, t in times.items()) + " | "
              + " ".join(f"{n} / rule {d['ratio']['median']:.3f} [{d['ratio']['q1']:.3f}-{d['ratio']['q3']:.3f}]"
                         for n, d in pairs.items()), flush=True)
        records.write(out_path, rows, tool=__file__)


def sweep_tall(out_path):
    """Cases with at least 32 tokens per expert: row tiles of 256, 128 x 128 or 128 x 256 with four stages,
    and 64 x 128 with two programs per SM, against the tile rule."""
    sms = launch.sm_count("cuda")
    configs = {
        "rule": {},
        "64x128 w4 s4 x2": dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4, num_programs=2 * sms),
        "256x128 w8 s3": dict(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
        "256x128 w8 s4": dict(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=4),
        "256x64 w4 s4": dict(block_m=256, block_n=64, block_k=64, num_warps=4, num_stages=4),
        "256x64 w8 s4": dict(block_m=256, block_n=64, block_k=64, num_warps=8, num_stages=4),
        "128x128 w8 s4": dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
        "128x256 w8 s4": dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
    }
    sweep_cases(out_path, configs, lambda p: p["T"] / p["E"] >= 32)


def sweep_order(out_path):
    """Every case: the tile orders of the schedule (``tile_schedule``), alone and with half-height last
    tiles, each against the rule in pairs."""
    configs = {"rule": {}, "interleave": dict(order="interleave"), "heavy first": dict(order="heavy_first"),
               "interleave, half tails": dict(order="interleave", half_tail=True)}
    sweep_cases(out_path, configs, lambda p: True, pair_all=True)


def sweep_flatten(out_path):
    """Every case: the TMA kernel's tile loop flattened into its K loop (Triton's ``flatten``: the pipeline
    runs on across tiles, loading the next tile's first steps while the current one finishes), alone and
    with warp specialization, each against the rule in pairs."""
    configs = {"rule": {}, "flatten": dict(flatten=True), "flatten, warp specialized": dict(flatten=True,
                                                                                           warp_specialize=True)}
    sweep_cases(out_path, configs, lambda p: True, pair_all=True)


def sweep_mainloop(out_path):
    """Cases with at least 32 tokens per expert: the main loop's depth and step (four stages; steps of 128
    along K with two stages) and 128 x 128 tiles with two programs per SM, each against the rule (its
    tile loop flattened) in pairs."""
    sms = launch.sm_count("cuda")
    configs = {"rule": {}, "s4": dict(num_stages=4), "k128 s2": dict(block_k=128, num_stages=2),
               "128x128 w8 s3 x2": dict(block_n=128, num_warps=8, num_stages=3, num_programs=2 * sms),
               "128x128 w4 s4 x2": dict(block_n=128, num_warps=4, num_stages=4, num_programs=2 * sms)}
    sweep_cases(out_path, configs, lambda p: p["T"] / p["E"] >= 32, pair_all=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--tiles", action="store_true", help="the lib kernel's tiles with pointer loads")
    ap.add_argument("--tma", action="store_true", help="the lib kernel with TMA loads, against its tile rule")
    ap.add_argument("--mid", action="store_true", help="TMA tiles for 32 to 256 tokens per expert")
    ap.add_argument("--tall", action="store_true", help="row tiles of 256 and four stages on chapter 4's cases")
    ap.add_argument("--order", action="store_true", help="the schedule's tile orders on chapter 4's cases")
    ap.add_argument("--flatten", action="store_true", help="the tile loop flattened, on chapter 4's cases")
    ap.add_argument("--mainloop", action="store_true", help="stages, K step and two programs per SM, large tiles")
    args = ap.parse_args()
    if args.mainloop:
        return sweep_mainloop(args.out)
    if args.flatten:
        return sweep_flatten(args.out)
    if args.tall:
        return sweep_tall(args.out)
    if args.order:
        return sweep_order(args.out)
    if args.tiles or args.tma or args.mid:
        return sweep_tiles(args.out, tma="mid" if args.mid else args.tma)
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
    records.write(args.out, rows, tool=__file__)
    import pandas as pd

    df = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    print(df.drop(columns=["K", "N"]).round(3).to_string())


if __name__ == "__main__":
    main()
