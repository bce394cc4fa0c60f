"""Nsight Compute's counters read back (tools/tuning/ncu.py): rows paired with the manifest's launches, kernel
names checked, stall reasons as shares, medians per (case, path)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "tuning"))
import ncu  # noqa: E402

HEADER = ['"ID"', '"Kernel Name"', '"gpu__time_duration.sum"', '"launch__registers_per_thread"',
          '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"']
UNITS = ['""', '""', '"us"', '"register/thread"', '"ratio"', '"ratio"']


def _csv(rows):
    lines = ["==PROF== a line ncu prints first", ",".join(HEADER), ",".join(UNITS)]
    lines += [",".join(f'"{v}"' for v in r) for r in rows]
    return "\n".join(lines) + "\n"


def test_parse_pairs_rows_with_launches_and_takes_medians(tmp_path):
    (tmp_path / "c.csv").write_text(_csv([[0, "_w4_gemv_kernel", "10.0", "164", "3", "1"],
                                          [1, "_w4_gemv_kernel", "12.0", "164", "3", "1"],
                                          [2, "gemv2T_kernel", "20.0", "64", "1", "1"]]))
    launches = [{"case": "o", "path": "int4"}, {"case": "o", "path": "int4"}, {"case": "o", "path": "bf16"}]
    (tmp_path / "m.json").write_text(json.dumps({"provenance": {"name": "gpu"}, "launches": launches}))
    summary = ncu.parse(tmp_path / "c.csv", tmp_path / "m.json", tmp_path / "out.json", tool="t",
                        expect=lambda launch: "_w4_gemv" if launch["path"] == "int4" else "")
    s = summary["o | int4"]
    assert s["gpu__time_duration.sum (us)"] == 11.0 and s["launch__registers_per_thread (register/thread)"] == 164
    assert s["stalls (share of stalled cycles)"] == {"long_scoreboard": 0.75, "wait": 0.25}
    assert json.loads((tmp_path / "out.json").read_text())["tool"] == "t"


def test_parse_refuses_a_kernel_the_launch_did_not_expect_or_a_count_that_differs(tmp_path):
    (tmp_path / "c.csv").write_text(_csv([[0, "_sum_splits_kernel", "1.0", "32", "1", "1"]]))
    (tmp_path / "m.json").write_text(json.dumps([{"case": "o", "path": "int4"}]))
    with pytest.raises(ValueError, match="expects int4"):
        ncu.parse(tmp_path / "c.csv", tmp_path / "m.json", tmp_path / "o.json", tool="t", expect=lambda launch: "_w4_gemv")
    (tmp_path / "m.json").write_text(json.dumps([{"case": "o", "path": "int4"}] * 2))
    with pytest.raises(ValueError, match="1 profiled launches"):
        ncu.parse(tmp_path / "c.csv", tmp_path / "m.json", tmp_path / "o.json", tool="t", expect=lambda launch: "")
