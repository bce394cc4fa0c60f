"""Hardware counters of the grouped-GEMM kernel at a few of chapter 4's cases, read by Nsight Compute.

On a GPU machine with ``ncu``:

    ncu --clock-control none -k regex:'grouped_gemm|nvjet' --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --csv --page raw \\
        python tools/tuning/ncu_grouped_gemm.py run --manifest launches.json > counters.csv
    python tools/tuning/ncu_grouped_gemm.py parse counters.csv launches.json out.json

``run`` launches the lib kernel (planned, its defaults) at each case, with chapter 4's token counts read
from its results, a few times; at the worst weight-bound case it also runs cuBLAS's batched GEMM over
every expert padded to the largest (``torch.bmm``). It writes the order of its launches to the
manifest, with the provenance of the GPU run (``lib.bench.device.provenance``). ``parse`` pairs ncu's
rows with the manifest, keeps the throughputs (as shares of each unit's peak), the L2 hit rate,
occupancy, the clock, and the warps' stall reasons (cycles stalled per issued instruction, as shares of
all stalled cycles), and writes one row per launch and the median per case and path, with the run's
provenance, through ``lib.bench.results.write``. The clocks are left as they are, so the durations are
those of a GPU under profiling, not chapter 4's timings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ncu  # noqa: E402

CASES = [(64, 8192, "uniform"), (128, 8192, "0.1"), (128, 8192, "uniform")]


def run(manifest: Path) -> None:
    import torch

    from lib.kernels import grouped_gemm as gg

    res = json.loads((ROOT / "results/nvidia-h200/04-grouped-gemm.json").read_text())
    pts = {(p["E"], p["T"], str(p["routing"])): p for p in res["data"]["points"] if p["path"] == "lib"}
    torch.manual_seed(0)
    launches = []
    for E, T, routing in CASES:
        p = pts[(E, T, routing)]
        K, N, counts = p["K"], p["N"], p["counts"]
        case = f"E={E}, T={T}, {'uniform' if routing == 'uniform' else 'Dirichlet(' + routing + ')'}"
        w = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
        plan = gg.GroupedGemm(x, w, offs, out=out)
        for _ in range(3):
            plan(x, w, offs, out=out)
            launches.append({"case": case, "path": "lib"})
        e = next(i for i, c in enumerate(counts) if c)  # checked on the CPU: no GPU product to profile by mistake
        a = sum(counts[:e])
        n = min(8, counts[e])
        ref = x[a:a + n].double().cpu() @ w[e].double().cpu()
        err = float((out[a:a + n].double().cpu() - ref).norm() / ref.norm())
        assert err < 2e-2, (case, err)
        if (E, T, routing) == CASES[0]:
            xp = torch.randn(E, max(counts), K, device="cuda", dtype=torch.bfloat16)
            for _ in range(2):
                torch.bmm(xp, w)
                launches.append({"case": case, "path": "padded bmm"})
            del xp
        torch.cuda.synchronize()
        del w, x, out
        torch.cuda.empty_cache()
    from lib.bench import device, results

    results.write(manifest, {"provenance": device.provenance("cuda"), "launches": launches})


def main() -> None:
    ncu.cli(run, tool="tools/tuning/ncu_grouped_gemm.py",
            expect=lambda launch: "grouped_gemm" if launch["path"] == "lib" else "nvjet")


if __name__ == "__main__":
    main()
