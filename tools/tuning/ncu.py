"""Nsight Compute's counters read back: what the ``ncu_*`` tools of this folder share.

A tool's ``run`` launches kernels under ``ncu`` (command in its docstring) and writes a manifest, {"provenance",
"launches": [{"case", "path", ...} per profiled launch, in order; "check": true marks one left out of the
medians]}; ``parse`` pairs ncu's CSV rows with the
manifest, checks each row's kernel name against what the launch's path expects, keeps the throughputs (as
shares of each unit's peak), the L2 hit rate, occupancy, registers, grid and the clock, and the warps'
stall reasons (cycles stalled per issued instruction, as shares of all stalled cycles), and writes one row
per launch and the median per (case, path), with the run's provenance, through ``lib.bench.results.write``.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from pathlib import Path

KEEP = [r"^gpu__time_duration\.sum$", r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^lts__throughput\.avg\.pct_of_peak_sustained_elapsed$", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
        r"^sm__pipe_tensor_cycles_active\.avg\.pct_of_peak_sustained_elapsed$", r"^lts__t_sector_hit_rate\.pct$",
        r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$", r"^launch__registers_per_thread$",
        r"^launch__grid_size$", r"^launch__block_size$", r"^gpc__cycles_elapsed\.avg\.per_second$"]
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
SECTIONS = ("--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis "
            "--section WarpStateStats --section Occupancy --csv --page raw")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse(counters: Path, manifest: Path, out: Path, *, tool: str, expect) -> dict:
    """ncu's CSV (``counters``) against the tool's ``manifest`` (see the module); ``expect(launch)`` is a
    substring the profiled kernel's name must hold. Writes ``out`` and returns its summary."""
    lines = counters.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    table = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    header, units, data = table[0], table[1], table[2:]
    listed = json.loads(manifest.read_text())
    # the manifest: {"provenance", "launches"}; a bare list of launches from before provenance was kept
    launches, provenance = (listed, None) if isinstance(listed, list) else (listed["launches"], listed["provenance"])
    if len(data) != len(launches):
        raise ValueError(f"{counters} holds {len(data)} profiled launches but {manifest} lists {len(launches)}: "
                         "profile with the kernel filter of the tool's docstring")
    col = {name: i for i, name in enumerate(header)}
    rows = []
    for values, launch in zip(data, launches):
        name = values[col["Kernel Name"]]
        if expect(launch) not in name:
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
    timed = [r for r in rows if not r.get("check")]  # a launch marked "check" ran first, to check the product
    for key in dict.fromkeys((r["case"], r["path"]) for r in timed):
        group = [r for r in timed if (r["case"], r["path"]) == key]
        numbers = {k: statistics.median(r[k] for r in group) for k, v in group[0].items()
                   if isinstance(v, float) and all(isinstance(r.get(k), float) for r in group)}
        stalls = "stalls (share of stalled cycles)"
        summary[f"{key[0]} | {key[1]}"] = numbers | {stalls: group[-1][stalls]}
    from lib.bench import results

    results.write(out, {"tool": tool, "provenance": provenance, "summary": summary, "launches": rows})
    for key, s in summary.items():
        print(key, {k: round(v, 1) for k, v in s.items() if isinstance(v, float) and "pct" in k})
    return summary


def cli(run, *, tool: str, expect) -> None:
    """The command line every ``ncu_*`` tool has: ``run --manifest M`` calls ``run(M)``; ``parse COUNTERS
    MANIFEST OUT`` calls ``parse`` with the tool's name and ``expect``."""
    import argparse

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
        parse(args.counters, args.manifest, args.out, tool=tool, expect=expect)
