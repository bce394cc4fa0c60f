"""Hardware counters of chapter 9's GEMVs at one row, beside torch's int4 and cuBLAS bf16, read by Nsight Compute.

On a GPU machine with ``ncu`` (the sections are ``ncu.SECTIONS``):

    ncu --clock-control none -k regex:'gemv|tinygemm|nvjet|gemm' --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --csv --page raw \\
        python tools/tuning/ncu_quant_gemv.py run --manifest launches.json > counters.csv
    python tools/tuning/ncu_quant_gemv.py parse counters.csv launches.json out.json

``run`` launches, at Llama-3-8B's O and gate-up products and one row of x, ``w4_gemv`` (int4, groups of
128) and ``w8_gemv`` at their default launches, torch's int4 path (the tinygemm kernel) and bf16 cuBLAS,
each checked against the float32 product of its weights first and then launched a few times; it writes
the order of its launches (the checking one marked) to the manifest with the run's provenance. ``parse`` (``ncu.parse``) keeps the
throughputs, occupancy, registers and the warps' stall reasons: what limits a GEMV that reads its bytes
at a fraction of the read rate. The clocks are left as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ncu  # noqa: E402

SHAPES = {"o": (4096, 4096), "gate_up": (4096, 28672)}
EXPECT = {"int4 gemv": "_w4_gemv", "int8 gemv": "_w8_gemv", "torch int4": "", "bf16": ""}


def run(manifest: Path) -> None:
    import torch

    from lib import quant
    from lib.bench import device, results
    from lib.experiments import quantization
    from lib.kernels import quant_gemm as qg

    gen = torch.Generator(device="cuda").manual_seed(0)
    launches = []
    for case, (K, N) in SHAPES.items():
        w = (torch.randn(K, N, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        x = torch.randn(1, K, device="cuda", generator=gen).to(torch.bfloat16)
        q4, q8 = quant.quantize_int4(w, 128), quant.quantize_int8(w)
        t4 = quantization._torch_int4(w)
        paths = {"int4 gemv": (lambda x=x, q=q4: qg.w4_gemv(x, q), q4.dequantize()),
                 "int8 gemv": (lambda x=x, q=q8: qg.w8_gemv(x, q), q8.dequantize()),
                 "torch int4": (lambda x=x, t=t4: quantization._torch_int4_mm(x, t), t4[3]),
                 "bf16": (lambda x=x, w=w: x @ w, w.float())}
        for path, (call, weights) in paths.items():
            ref = x.float() @ weights.float()
            err = float((call().float() - ref).norm() / ref.norm())
            launches.append({"case": case, "path": path, "check": True})  # ncu profiles the checking launch too
            if not err < 2e-2:
                raise AssertionError(f"{case} {path}: relative error {err:.3g}: a wrong product is not profiled")
            for _ in range(3):
                call()
                launches.append({"case": case, "path": path})
        torch.cuda.synchronize()
        del paths
        torch.cuda.empty_cache()
    results.write(manifest, {"provenance": device.provenance("cuda"), "launches": launches})


def main() -> None:
    ncu.cli(run, tool="tools/tuning/ncu_quant_gemv.py", expect=lambda launch: EXPECT[launch["path"]])


if __name__ == "__main__":
    main()
