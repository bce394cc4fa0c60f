"""A first look at chapter 7's 8B decode step with int4 and int8 layer weights on a GPU; prints a table.

    python tools/tuning/quant_step_first_look.py [--out rows.json] [--rows 1,16] [--context 1024]

Llama-3-8B with random bf16 weights; at each batch size B (``--rows``) and ``--context`` tokens per request:
the bf16 fused step (``lib.llama.FusedStep``) and ``lib.llama_quant.QuantStep`` in int4 (groups of 128) and
int8, each checked against the fused step of the model with the weights it effectively uses
(``dequantized``) before it is timed, then GPU time by CUDA-graph replay in interleaved rounds. Beside each:
its floor, the bytes the step must read (quantized layer weights and scales, the bf16 output head, the KV
cache, the embedding rows) at chapter 0's read rate, and the time of its kernels by kind (one profiled call).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402
import torch  # noqa: E402

from lib import llama, llama_quant  # noqa: E402
from lib.bench import timing, trace  # noqa: E402
from lib.experiments import decode_step, quantization  # noqa: E402

FORMATS = ("bf16", "int4", "int8")


def main() -> int:
    args, read_bw, _, gen = records.gpu_sweep("1,16", (("--context", "1024"),))
    cfg = llama.LLAMA3_8B
    m = llama.random_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    steps = {"bf16": llama.FusedStep(m), "int4": llama_quant.QuantStep(m, "int4", 128),
             "int8": llama_quant.QuantStep(m, "int8")}
    L, rows = int(args.context), []
    for B in (int(b) for b in args.rows.split(",")):
        pool, table = decode_step._pool(m, B, L + 1, 16, gen)
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        tokens = torch.randint(0, cfg.vocab, (B,), generator=gen, device="cuda")
        a = (tokens, pool, table, lens)
        for fmt in ("int4", "int8"):
            ref = llama.FusedStep(llama_quant.dequantized(m, fmt, 128))(*a).float()
            got = steps[fmt](*a).float()
            err = float((got - ref).abs().max() / ref.abs().max())
            if not err < 0.1:
                raise AssertionError(f"B={B} {fmt}: logits differ from the dequantized model's by {err:.3g} of the largest")
            print(f"B={B} {fmt}: logits within {err:.2g} of the dequantized model's; argmax agrees "
                  f"{float((got.argmax(-1) == ref.argmax(-1)).float().mean()):.2f}", flush=True)
            torch.cuda.empty_cache()
        times = {f: [] for f in FORMATS}
        for r in range(3):
            for f in (FORMATS if r % 2 == 0 else FORMATS[::-1]):
                t = timing.bench([lambda s=steps[f], a=a: s(*a)], device="cuda", reps=5, warmup=2, target_ms=20.0)
                times[f].append(t.gpu_us.median)
        base = decode_step.step_bytes(cfg, B, L)
        for f in FORMATS:
            layer = base["layer weights"] if f == "bf16" else steps[f].bytes_per_step()
            nbytes = layer + base["output head"] + base["attention (K/V)"] + base["embedding rows"]
            us = statistics.median(times[f])
            row = {"format": f, "B": B, "L": L, "gpu_us": us, "rounds_us": times[f], "bytes": nbytes,
                   "floor_us": nbytes / read_bw * 1e6, "over_floor": us / (nbytes / read_bw * 1e6),
                   "kernels_us": quantization._kernel_kinds(trace.kernel_times(lambda s=steps[f], a=a: s(*a), "cuda"))}
            rows.append(row)
            print(f"B={B:3d} L={L} {f}: GPU {us:8.1f} us, floor {row['floor_us']:8.1f} us, x{row['over_floor']:.2f} "
                  f"of it, over bf16 {statistics.median(times['bf16']) / us:.2f}; "
                  f"{ {k: round(v, 1) for k, v in row['kernels_us'].items()} }", flush=True)
        records.write(args.out, rows, tool=__file__)
        del pool, table
    return 0


if __name__ == "__main__":
    sys.exit(main())
