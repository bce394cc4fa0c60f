"""A first look at chapter 7's 8B decode step with int4 and int8 layer weights on a GPU; prints a table.

    python tools/tuning/quant_step_first_look.py [--out rows.json] [--rows 1,16] [--context 1024]

Chapter 9's ``lib.experiments.quantization.measure_step`` at the batch sizes of ``--rows`` and ``--context``
tokens per request (Llama-3-8B, random bf16 weights: the bf16 fused step and ``QuantStep`` in int8 and
int4 in groups of 128, each quantized step checked against the dequantized model before it is timed in
interleaved rounds), and ``step_table``'s floor (every byte the step reads at chapter 0's read rate) and
speedup over bf16 beside each, with the kernels' time by kind.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # noqa: E402

from lib.experiments import quantization as qx  # noqa: E402


def main() -> int:
    args, read_bw, _, _ = records.gpu_sweep("1,16", (("--context", "1024"),))
    L = int(args.context)
    params = {**qx.sweep("full"), "step": {**qx.sweep("full")["step"],
                                           "shapes": [[int(b), L] for b in args.rows.split(",")]}}
    rows = qx.measure_step(params, "cuda")
    table = qx.step_table(rows, read_bw / 1e9)
    for r, (_, t) in zip(rows, table.iterrows()):
        r.update(floor_us=t["floor_us"], over_floor=t["over floor"], speedup=t["speedup"])
        print(f"B={r['B']:3d} L={L} {r['format']}: GPU {t['gpu_us']:8.1f} us, floor {t['floor_us']:8.1f} us, "
              f"x{t['over floor']:.2f} of it, over bf16 {t['speedup']:.2f}; {r['kernels_us']}", flush=True)
    records.write(args.out, rows, tool=__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
