"""Check and time the decode-attention kernel's variants on a GPU; prints one table.

    python tools/tune_decode_attention.py [--out results.json]

For each shape: correctness in bf16 against a float32 reference, then GPU time and call time (lib.timing)
of torch SDPA on a dense cache and of the kernel over a grid of launch parameters, with the L2 defeated.
Used to choose the kernel's defaults; chapter 3's notebook measures the chosen one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lib import timing  # noqa: E402
from lib.kernels import decode_attention as da  # noqa: E402


def make(B, H_q, H_kv, L, D, page, dev, gen):
    q = torch.randn(B, H_q, D, device=dev, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, H_kv, L, D, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, H_kv, L, D, device=dev, dtype=torch.bfloat16, generator=gen)
    if page:
        kc, bt = da.paginate(k, page)
        vc, _ = da.paginate(v, page, block_table=bt)
    else:
        kc, bt = da.dense_as_paged(k)
        vc = v
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    return q, k, v, kc, vc, bt, lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shapes = [(8, 32, 8, 4096), (1, 32, 8, 131072), (64, 32, 32, 4096), (1, 32, 1, 512), (64, 32, 8, 32768)]
    grid = list(itertools.product([32, 64], [2, 4], [3, 4, 5], [2, 3, 4]))
    rows = []
    for B, H_q, H_kv, L in shapes:
        D = 128
        nbytes = 2 * B * L * H_kv * D * 2
        sets = timing.rotation(nbytes, l2)
        for page in (16, 0):
            data = [make(B, H_q, H_kv, L, D, page, dev, gen) for _ in range(sets)]
            q, k, v, kc, vc, bt, lens = data[0]
            ref = da.reference(q[:2], kc, vc, bt[:2], lens[:2])
            if page == 16:
                t = timing.bench([lambda d=d: F.scaled_dot_product_attention(d[0].unsqueeze(2), d[1], d[2], enable_gqa=True)
                                  for d in data], device=dev, reps=15, target_ms=1.0)
                rows.append({"B": B, "H_kv": H_kv, "L": L, "path": "sdpa", "gpu_us": t.gpu_us.median, "call_us": t.call_us.median,
                             "GBps": nbytes / t.gpu_us.median / 1e3})
            seed = (B, H_kv, L) == (8, 8, 4096)
            configs = grid if (seed and page == 16) else [(64, 4, 3, 2), (32, 4, 4, 2)]
            for bn, nw, ns, waves in configs:
                splits = da.choose_splits(B * H_kv, L, bn, da._sm_count(q.device), waves=waves)
                try:
                    plan = da.DecodeAttention(q, kc, vc, bt, lens, num_splits=splits, block_n=bn, num_warps=nw, num_stages=ns)
                    plan(q, kc, vc, bt, lens)
                    out = plan(q, kc, vc, bt, lens)  # the direct launch
                    err = ((out[:2].float() - ref).norm() / ref.norm()).item()
                    assert err < 1e-2, err
                    fns = [lambda d=d, plan=plan: plan(d[0], d[3], d[4], d[5], d[6]) for d in data]
                    t = timing.bench(fns, device=dev, reps=15, target_ms=1.0)
                    row = {"B": B, "H_kv": H_kv, "L": L, "path": f"kernel page={page or 'dense'}", "block_n": bn, "warps": nw,
                           "stages": ns, "waves": waves, "splits": splits, "err": err, "gpu_us": t.gpu_us.median,
                           "call_us": t.call_us.median, "GBps": nbytes / t.gpu_us.median / 1e3}
                    if (bn, nw, ns, waves) == (64, 4, 3, 2):  # the plain function, which plans on every call
                        fns = [lambda d=d, s=splits: da.decode_attention(d[0], d[3], d[4], d[5], d[6], num_splits=s)
                               for d in data]
                        row["call_us_unplanned"] = timing.bench(fns, device=dev, reps=15, target_ms=1.0).call_us.median
                except Exception as e:  # a config the compiler rejects
                    print("failed", B, H_kv, L, page, bn, nw, ns, waves, type(e).__name__, str(e)[:200], flush=True)
                    continue
                rows.append(row)
            del data
            torch.cuda.empty_cache()
        print(f"shape B={B} H_kv={H_kv} L={L} done", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    import pandas as pd

    df = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    seed = df[(df.B == 8) & (df.H_kv == 8) & (df.L == 4096)].sort_values("gpu_us")
    print(seed.head(12).to_string())
    print(df[~((df.B == 8) & (df.H_kv == 8) & (df.L == 4096))].to_string())


if __name__ == "__main__":
    main()
