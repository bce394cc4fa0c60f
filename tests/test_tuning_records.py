"""The GEMM sweeps' shared launch search (tools/tuning/records.py), on the CPU with a made-up product and clock."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "tuning"))
import records  # noqa: E402


def test_launch_search_skips_records_refusals_times_the_rest_and_returns_the_fastest():
    x, w = torch.ones(1, 4), torch.ones(4, 2)
    ref = x @ w

    def fn(x, w, a, b):
        if a == 3:
            raise RuntimeError("out of resources")
        return x @ w

    def clock(calls):  # a made-up time: launch a = 2 is fastest
        calls[0]()
        return {1: 5.0, 2: 3.0, 4: 9.0}[clock.a]

    rows = []

    def fn_timed(x, w, a, b):
        clock.a = a
        return fn(x, w, a, b)

    best = records.launch_search(fn_timed, x, [w, w], ref, {"a": (1, 2, 3, 4), "b": (0, 1)}, lambda kw: kw["b"] == 1,
                                 clock, {"shape": "s"}, rows)
    assert best == {"shape": "s", "a": 2, "b": 0, "gpu_us": 3.0}
    assert [r.get("gpu_us") for r in rows] == [5.0, 3.0, None, 9.0] and "out of resources" in rows[2]["error"]
    records.rate_columns(rows, nbytes=6000, read_bw=1e9, bf16_us=6.0, floor=1.0)
    assert rows[1]["of_read_rate"] == 2.0 and rows[1]["speedup"] == 2.0 and rows[1]["floor"] == 1.0
    assert "speedup" not in rows[2]


def test_launch_search_stops_at_a_wrong_product():
    x, w = torch.ones(1, 4), torch.ones(4, 2)
    with pytest.raises(AssertionError, match="relative error"):
        records.launch_search(lambda x, w, a: 2 * (x @ w), x, [w], x @ w, {"a": (1,)}, lambda kw: False,
                              lambda calls: 1.0, {}, [])
