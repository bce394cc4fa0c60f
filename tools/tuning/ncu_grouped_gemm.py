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

import argparse
import csv
import io
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES = [(64, 8192, "uniform"), (128, 8192, "0.1"), (128, 8192, "uniform")]
KEEP = [r"^gpu__time_duration\.sum$", r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_elapsed$", r"^lts__t_sector_hit_rate\.pct$",
        r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", r"^launch__registers_per_thread$",
        r"^launch__grid_size$", r"^launch__block_size$", r"^gpc__cycles_elapsed\.avg\.per_second$"]
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


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


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse(counters: Path, manifest: Path, out: Path) -> None:
    lines = counters.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    table = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    header, units, data = table[0], table[1], table[2:]
    listed = json.loads(manifest.read_text())
    # the manifest: {"provenance", "launches"}; a bare list of launches from before provenance was kept
    launches, provenance = (listed, None) if isinstance(listed, list) else (listed["launches"], listed["provenance"])
    if len(data) != len(launches):
        raise ValueError(f"{counters} holds {len(data)} profiled launches but {manifest} lists {len(launches)}: "
                         "profile with the kernel filter of this module's docstring")
    col = {name: i for i, name in enumerate(header)}
    rows = []
    for values, launch in zip(data, launches):
        name = values[col["Kernel Name"]]
        expect = "grouped_gemm" if launch["path"] == "lib" else "nvjet"
        if expect not in name:
            raise ValueError(f"launch {values[col['ID']]} is {name}, but the manifest expects {launch['path']}")
        row = dict(launch, kernel=name)
        for metric, i in col.items():
            if any(re.search(k, metric) for k in KEEP):
                row[f"{metric} ({units[i]})" if units[i] else metric] = _number(values[i])
        stalls = {m.group(1): _number(values[i]) or 0.0 for metric, i in col.items() if (m := STALL.match(metric))}
        total = sum(stalls.values())
        row["stalls (share of stalled cycles)"] = {k: v / total for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])
                                            if total and v / total >= 0.01}
        rows.append(row)
    summary = {}
    for key in dict.fromkeys((r["case"], r["path"]) for r in rows):
        group = [r for r in rows if (r["case"], r["path"]) == key]
        numbers = {k: statistics.median(r[k] for r in group) for k, v in group[0].items()
                   if isinstance(v, float) and all(isinstance(r.get(k), float) for r in group)}
        stalls = "stalls (share of stalled cycles)"
        summary[f"{key[0]} | {key[1]}"] = numbers | {stalls: group[-1][stalls]}
    from lib.bench import results

    results.write(out, {"tool": "tools/tuning/ncu_grouped_gemm.py", "provenance": provenance, "summary": summary,
                        "launches": rows})
    for key, s in summary.items():
        print(key, {k: round(v, 1) for k, v in s.items() if isinstance(v, float) and "pct" in k})


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--manifest", required=True, type=Path)
    p = sub.add_parser("parse")
    p.add_argument("counters", type=Path)
    p.add_argument("manifest", type=Path)
    p.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.manifest)
    else:
        parse(args.counters, args.manifest, args.out)


if __name__ == "__main__":
    main()
