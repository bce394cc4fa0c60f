"""lib.experiments.machine (chapter 0): the smoke sweep measured on the CPU, its checks, and its analysis."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lib import costs
from lib.bench import ceilings, results, timing
from lib.bench.device import DATASHEETS
from lib.experiments import machine
from lib.kernels import stream

MiB = 1 << 20
OPS = {  # the calls of chapter 0's notebook
    "copy": lambda dst, src: dst.copy_(src),
    "copy_kernel": lambda dst, src: torch.mul(src, 1.0, out=dst),
    "read": lambda x, s: torch.sum(x, dim=0, out=s),
    "read_kernel": lambda a, b, out, launch: stream.read_sum(a, b, out=out, **launch),
    "matmul": lambda a, b, c: torch.mm(a, b, out=c),
    "launch": lambda x, y, z: torch.add(x, y, out=z),
}
TINY = {"reps": 2, "target_ms": 0.05}


def keys(x):
    """The nested keys of a record (lists by their first item): its structure, without the values."""
    if isinstance(x, dict):
        return {k: keys(v) for k, v in x.items()}
    if isinstance(x, list):
        return [keys(x[0])] if x else []
    return None


@pytest.fixture(scope="module")
def smoke():
    p = machine.sweep("smoke")
    return p, machine.measure(p, "cpu", OPS)


def test_smoke_data_has_the_reference_structure(smoke):
    p, data = smoke
    ref = results.load("00-the-machine")["data"]
    assert list(data) == list(ref)
    for key in ("copy", "copy_kernel", "read", "matmul", "zeros"):
        assert keys(data[key][0]) == {**keys(ref[key][0]), **({"clocks": None} if "clocks" in ref[key][0] else {})}
    assert keys(data["launch"]) == keys(ref["launch"])
    # what the sweep decides: one row per size, per dtype and n; no L2 on the CPU, so no rotated copy
    assert data["l2_bytes"] == 0 and data["copy_cold"] == []
    assert [r["bytes"] for r in data["copy"]] == [r["bytes"] for r in data["read"]] == p["buffer_bytes"]
    assert all(r["pairs"] == 1 for r in data["copy"] + data["copy_kernel"])
    # the read kernel: on the CPU at the smallest buffer only, once per launch, each checked
    assert [(r["bytes"], r["launch"]) for r in data["read_kernel"]] == \
        [(min(p["buffer_bytes"]), launch) for launch in p["read_launches"]]
    assert all(r["rel_err"] < 1e-4 for r in data["read_kernel"])
    assert [r["shape"] for r in data["matmul_shapes"]] == p["matmul_shapes"]
    assert [(r["dtype"], r["n"]) for r in data["matmul"]] == [(d, n) for d in p["dtypes"] for n in p["matmul_n"]]
    assert [(r["n"], r["zeros"], r["rel_err"] == 0.0) for r in data["zeros"]] == [(p["zeros_n"], False, False),
                                                                                  (p["zeros_n"], True, True)]
    assert all(r["rel_err"] <= machine.MAX_REL_ERR[r["dtype"]] for r in data["matmul"])
    assert data["launch"]["timing"]["method"] == "cpu-wall" and data["launch"]["timing"]["gpu_us"]["n"] == p["reps"]
    assert torch.get_float32_matmul_precision() == "highest"


def test_the_smoke_data_gives_every_table(smoke):
    _, data = smoke
    bw, mm = machine.bandwidth(data), machine.matmul(data)
    # memcpy, kernel copy and read at every size; the read kernel's fastest launch at the one size it ran
    assert len(bw) == 3 * len(data["copy"]) + 1 and len(mm) == len(data["matmul"])
    items = machine.call_over_gpu(bw, mm, timing.Timing.from_dict(data["launch"]["timing"]))
    assert len(items) == len(bw) + len(mm) + 1
    c = ceilings.from_data(data)
    f = machine.findings(bw, mm, c)
    assert math.isnan(f["l2_peak_GBps"]) and math.isnan(f["cold_small_max_GBps"])  # no L2 on the CPU
    assert machine.against_datasheet(c, {})["datasheet"].isna().all()


# ---------------------------------------------------------------------------- a wrong call is not timed

def wrong(**ops):
    return {**OPS, **ops}


@pytest.mark.parametrize("name, op, what", [
    ("copy", lambda dst, src: dst.zero_(), "copy"),
    ("copy_kernel", lambda dst, src: torch.mul(src, 1.001, out=dst), "copy"),
    ("read", lambda x, s: torch.sum(x[: x.numel() // 2], dim=0, out=s), "read"),
    ("launch", lambda x, y, z: torch.sub(x, y, out=z), "add"),
])
def test_a_wrong_copy_read_or_add_raises(name, op, what):
    p = {**machine.sweep("smoke"), **TINY, "buffer_bytes": [64 << 10], "matmul_n": [8], "zeros_n": 8}
    with pytest.raises(AssertionError, match=what):
        machine.measure(p, "cpu", wrong(**{name: op}))


@pytest.mark.parametrize("dtype", machine.DTYPES)
def test_a_wrong_product_raises_and_leaves_tf32_off(dtype):
    transposed = lambda a, b, c: torch.mm(b, a, out=c)  # noqa: E731
    with pytest.raises(AssertionError, match=f"{dtype} n=32"):
        machine.measure_matmul(transposed, dtype, 32, "cpu", TINY)
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_product_that_is_not_zero_on_zeros_raises():
    ones = lambda a, b, c: c.fill_(1)  # noqa: E731
    with pytest.raises(AssertionError, match="on zeros"):
        machine.measure_matmul(ones, "bf16", 16, "cpu", TINY, zeros=True)


def test_tf32_is_allowed_only_while_timing_tf32():
    seen = []

    def mm(a, b, c):
        seen.append(torch.get_float32_matmul_precision())
        return torch.mm(a, b, out=c)

    for dtype, precision in (("tf32", "high"), ("fp32", "highest")):
        seen.clear()
        machine.measure_matmul(mm, dtype, 16, "cpu", TINY)
        assert set(seen) == {precision}
        assert torch.get_float32_matmul_precision() == "highest"


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="'full' and a 'smoke'"):
        machine.sweep("large")
    with pytest.raises(ValueError, match=r"ops lack callables for \['launch'\]"):
        machine.measure(machine.sweep("smoke"), "cpu", {k: v for k, v in OPS.items() if k != "launch"})
    with pytest.raises(ValueError, match=r"params lack \['reps'\]"):
        machine.measure({k: v for k, v in machine.sweep("smoke").items() if k != "reps"}, "cpu", OPS)


# ---------------------------------------------------------------------------- the analysis, worked by hand

def t(gpu_us, call_us=None):
    s = lambda m: {"median": m, "q1": m, "q3": m, "min": m, "max": m, "n": 1}  # noqa: E731
    return {"gpu_us": s(gpu_us), "call_us": s(call_us or gpu_us), "calls_per_sample": 1, "buffers": 1, "method": "x"}


def at(footprint: int, GBps: float) -> float:
    """The time (us) at which ``footprint`` bytes move at ``GBps``."""
    return footprint / GBps / 1e3


def synthetic():
    """L2 of 8 MiB; copies of 1, 2, 4 and 16 MiB (footprints 2, 4, 8, 32 MiB); bf16 and fp16 products
    at n = 256 (full clock, 1980 MHz) and 512 (clock down to 1700 MHz)."""
    copy = [(1, 6000), (2, 5000), (4, 3000), (16, 2000)]
    kernel = [(1, 4000), (2, 4000), (4, 2500), (16, 1900)]
    cold = [(1, 1500), (2, 1800), (4, 1900)]
    rates = {"bf16": (500, 600), "fp16": (450, 650), "tf32": (200, 250), "fp32": (40, 50)}
    return {
        "l2_bytes": 8 * MiB,
        "copy": [{"bytes": m * MiB, "pairs": 1, "timing": t(at(2 * m * MiB, g))} for m, g in copy],
        "copy_kernel": [{"bytes": m * MiB, "pairs": 1, "timing": t(at(2 * m * MiB, g))} for m, g in kernel],
        "copy_cold": [{"bytes": m * MiB, "pairs": 8, "timing": t(at(2 * m * MiB, g))} for m, g in cold],
        "read": [{"bytes": 32 * MiB, "rel_err": 0.0, "timing": t(at(32 * MiB, 1900))}],
        "matmul": [{"dtype": dt, "n": n, "zeros": False, "rel_err": 1e-6 if dt == "fp32" else 1e-3,
                    "timing": t(2 * n**3 / (r * 1e6)), "clocks": {"sm_MHz": mhz, "power_W": 500.0, "temp_C": 50}}
                   for dt, rs in rates.items() for n, r, mhz in zip((256, 512), rs, (1980, 1700))],
        "zeros": [],
        "launch": {"timing": t(1.0, 5.0)},
    }


def test_findings_worked_by_hand():
    data = synthetic()
    bw, mm, c = machine.bandwidth(data), machine.matmul(data), ceilings.from_data(data)
    assert c["copy_bw_GBps"] == pytest.approx(2000)  # only the 32 MiB footprint is beyond 4x the L2
    f = machine.findings(bw, mm, c)
    assert f["l2_peak_GBps"] == pytest.approx(6000)  # the best copy of a footprint up to L2/2 = 4 MiB
    assert f["l2_edge_bytes"] == 8 * MiB and f["l2_edge_over_l2"] == 1.0  # the last to beat 1.2 x 2000 GB/s
    assert f["cold_small_max_GBps"] == pytest.approx(1800) and f["cold_smallest_GBps"] == pytest.approx(1500)
    assert f["cold_smallest_footprint_bytes"] == 2 * MiB
    assert (f["copy_best_method"], f["copy_best_footprint_bytes"]) == ("memcpy", 32 * MiB)
    assert math.isnan(f["memcpy_graph_over_eager"])  # no footprint of 1 GiB here
    assert (f["bf16_best_n"], f["bf16_largest_n"]) == (512, 512)
    assert f["bf16_largest_tflops"] == pytest.approx(600) and f["bf16_clock_drop"] == pytest.approx(1700 / 1980)
    assert f["full_clock_n"] == 256 and f["fp16_over_bf16_full_clock"] == pytest.approx(450 / 500)
    assert (f["fp32_rel_err_max"], f["tf32_rel_err_min"]) == (1e-6, 1e-3)


def test_bandwidth_counts_both_buffers_of_a_copy_and_one_of_a_read():
    data = {"copy": [{"bytes": MiB, "timing": t(1.048576)}], "copy_kernel": [], "copy_cold": [],
            "read": [{"bytes": MiB, "timing": t(1.048576, 2.097152)}]}
    bw = machine.bandwidth(data).set_index("method")
    assert bw.loc["memcpy", "GB/s"] == pytest.approx(2000) and bw.loc["read", "GB/s"] == pytest.approx(1000)
    assert bw.loc["read", "GB/s, call time"] == pytest.approx(500)


def test_call_over_gpu_summary_splits_short_and_long_items():
    import pandas as pd

    items = pd.DataFrame({"method": ["read", "launch", "matmul", "memcpy"], "GPU time (us)": [2.0, 1.0, 2000.0, 3000.0],
                          "call time (us)": [8.0, 5.0, 2020.0, 1000.0]})
    items["call/GPU"] = items["call time (us)"] / items["GPU time (us)"]
    s = machine.call_over_gpu_summary(items)
    assert s.loc[machine.SHORT].tolist() == [2, 4.5]
    assert s.loc[machine.LONG].tolist() == [1, 1.01]  # the memcpy is left out


def test_against_the_h200_datasheet():
    c = {"copy_bw_GBps": 4320.0, "read_bw_GBps": 4400.0, "bf16_tflops": 791.2, "fp16_tflops": 791.2,
         "tf32_tflops": 400.0, "fp32_tflops": 50.0, "ridge_flop_per_byte": 791.2e12 / 4320e9}
    s = machine.against_datasheet(c, DATASHEETS["nvidia-h200"])
    assert s.loc["copy bandwidth (GB/s)", "measured / datasheet"] == pytest.approx(0.9)
    assert s.loc["bf16 matmul (TFLOP/s)", "measured / datasheet"] == pytest.approx(0.8)
    assert s.loc["ridge, bf16 / copy (FLOP/byte)", "datasheet"] == pytest.approx(989 / 4.8)


# ---------------------------------------------------------------------------- the page's numbers

def page_from(stored: dict, sheet: dict):
    """Chapter 0's page from stored results, through the notebook's own tables."""
    data, params, prov = stored["data"], stored["params"], stored["provenance"]
    res = SimpleNamespace(data=data, params=params, provenance=prov, date=prov["date"][:10])
    bw, mm = machine.bandwidth(data), machine.matmul(data)
    c = ceilings.from_data(data)
    summary = machine.against_datasheet(c, sheet)
    vs = machine.against_prediction(machine.prediction(sheet), summary).set_index("quantity")
    items = machine.call_over_gpu(bw, mm, timing.Timing.from_dict(data["launch"]["timing"]))
    b, K = 2, 4096
    example = pd.DataFrame([
        {"M": M, "F (MFLOP)": costs.linear_flops(M, K, K) / 1e6, "Q (MB)": costs.linear_bytes(M, K, K, b) / 1e6,
         "I (FLOP/byte)": costs.intensity(costs.linear_flops(M, K, K), costs.linear_bytes(M, K, K, b)),
         "Q / read rate (us)": costs.linear_bytes(M, K, K, b) / (c["read_bw_GBps"] * 1e3),
         "F / bf16 rate (us)": costs.linear_flops(M, K, K) / (c["bf16_tflops"] * 1e6)} for M in (1, 128)]).set_index("M")
    worked = {"b": b, "ridge_M_read": 1.0, "ridge_M_datasheet": 2.0, "ex_params": 8e9,
              "ex_step_floor_ms": b * 8e9 / (c["read_bw_GBps"] * 1e9) * 1e3}
    page = machine.page(res, c, summary, vs, machine.findings(bw, mm, c), machine.zeros(data),
                        machine.call_over_gpu_summary(items), example, worked)
    return page, c


def test_the_page_of_the_stored_h200_results_worked_by_hand():
    page, c = page_from(results.load("00-the-machine"), DATASHEETS["nvidia-h200"])
    n, t = page.numbers, page.texts
    assert len(n) == 86 and len(t) == 12 and not set(n) & set(t)
    # K = N = 4096 in bf16: F = 2 M K N; Q = 2 (M K + K N + M N) bytes
    assert n["example_M1_mflop"] == pytest.approx(2 * 4096 * 4096 / 1e6)  # 33.554432
    assert n["example_M1_MB"] == pytest.approx(2 * (4096 + 4096 * 4096 + 4096) / 1e6)  # 33.570816
    assert n["example_M128_intensity"] == pytest.approx(2048 / 17)  # 128 * 4096 / (2 * 128 + 4096)
    # 8e9 bf16 weights: 16 GB read once per step, so tokens/s is the read rate over 16 GB
    assert (n["ex_params_billion"], n["ex_weights_GB"]) == (8.0, 16.0)
    assert n["ex_tokens_per_s"] == pytest.approx(c["read_bw_GBps"] / 16)
    assert (n["ridge_M_read"], n["ridge_M_datasheet"]) == (1.0, 2.0)  # handed on as given
    # the sweep's buffers run from 1 MiB to 4 GiB
    assert (n["buffer_min_MiB"], n["buffer_max_GiB"]) == (1.0, 4.0)
    assert all(t[f"{k}_band"] in ("inside", "above", "below") for k in ("copy", "read", "bf16", "ridge"))
    assert t["device_name"].startswith("NVIDIA H200") and len(t["measured_date"]) == 10


def test_the_page_without_a_datasheet_says_not_predicted():
    page, _ = page_from(results.load("00-the-machine"), {})
    assert page.texts["copy_band"] == "not predicted"
    assert math.isnan(page.numbers["copy_measured_over_predicted"])
    assert math.isnan(page.numbers["datasheet_hbm_GBps"])
