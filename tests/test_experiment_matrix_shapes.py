"""lib.experiments.matrix_shapes (chapter 1): the smoke sweep measured on the CPU, its check, and its analysis."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lib import costs
from lib.bench import ceilings, results
from lib.experiments import matrix_shapes


def linear(M, K, N, device):
    """The call of chapter 1's notebook."""
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    y = torch.empty(M, N, device=device, dtype=torch.bfloat16)
    return (x, w, y), lambda: torch.mm(x, w.t(), out=y)


@pytest.fixture(scope="module")
def smoke():
    p = matrix_shapes.sweep("smoke")
    return p, matrix_shapes.measure(p, "cpu", linear)


def test_the_full_sweep_has_the_llama_3_8b_shapes():
    shapes = matrix_shapes.sweep("full")["shapes"]
    assert shapes["o"] == (4096, 4096) and shapes["gate_up"] == (4096, 28672)


def test_smoke_data_has_the_reference_structure(smoke):
    p, data = smoke
    ref = results.load("01-matrix-shapes")["data"]
    assert list(data) == list(ref) and data["l2_bytes"] == 0
    assert list(data["points"][0]) == list(ref["points"][0])
    assert list(data["points"][0]["timing"]) == list(ref["points"][0]["timing"])
    # every layer, every M, cold then hot; one set each without an L2 to defeat; no profiler on the CPU
    expected = [(name, K, N, M, cold) for name, (K, N) in p["shapes"].items() for M in p["M"] for cold in (True, False)]
    assert [(r["name"], r["K"], r["N"], r["M"], r["cold"]) for r in data["points"]] == expected
    assert all(r["sets"] == 1 and r["kernels"] is None for r in data["points"])
    assert all(0 < r["rel_err"] < matrix_shapes.MAX_REL_ERR for r in data["points"])
    assert {r["timing"]["gpu_us"]["n"] for r in data["points"]} == {p["reps"]}


def test_the_smoke_points_get_a_model_time(smoke):
    _, data = smoke
    pts = matrix_shapes.points(data, costs.Roofline(100e12, 1e12, 1e-6))
    assert len(pts) == len(data["points"]) and (pts["kernels"] == 1).all()
    assert (pts["model (us)"] >= 1.0).all()  # at least one launch of 1 us


def test_a_wrong_product_raises():
    def negated(M, K, N, device):
        (x, w, y), call = linear(M, K, N, device)
        return (x, w, y), lambda: call().neg_()

    p = {**matrix_shapes.sweep("smoke"), "M": [3], "reps": 1, "target_ms": 0.05}
    with pytest.raises(AssertionError, match="qkv M=3: relative error"):
        matrix_shapes.measure(p, "cpu", negated)


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="'full' and a 'smoke'"):
        matrix_shapes.sweep("tiny")
    with pytest.raises(ValueError, match=r"params lack \['M'\]"):
        matrix_shapes.measure({k: v for k, v in matrix_shapes.sweep("smoke").items() if k != "M"}, "cpu", linear)
    with pytest.raises(TypeError, match="linear must be a function"):
        matrix_shapes.measure(matrix_shapes.sweep("smoke"), "cpu", None)


# ---------------------------------------------------------------------------- the analysis, worked by hand

def t(gpu_us, call_us=None):
    s = lambda m: {"median": m, "q1": m, "q3": m, "min": m, "max": m, "n": 1}  # noqa: E731
    return {"gpu_us": s(gpu_us), "call_us": s(call_us or gpu_us), "calls_per_sample": 1, "buffers": 1, "method": "x"}


def point(name, K, N, M, gpu_us, cold=True, kernels=1):
    return {"name": name, "K": K, "N": N, "M": M, "cold": cold, "sets": 1, "rel_err": 1e-3, "kernels": kernels,
            "timing": t(gpu_us, 2 * gpu_us)}


def test_points_on_the_worked_example():
    """K = N = 4096, b = 2, M = 1 on the worked example's machine (100 TFLOP/s, 1 TB/s): F = 33.55 MFLOP and
    Q = 33.57 MB, so the model's time is Q / BW = 33.57 us."""
    data = {"points": [point("o", 4096, 4096, 1, 40.0)]}
    r = matrix_shapes.points(data, costs.Roofline(100e12, 1e12)).iloc[0]
    assert (r["F"], r["Q"]) == (33_554_432, 33_570_816)
    assert r["model (us)"] == pytest.approx(33.570816)
    assert r["measured / model"] == pytest.approx(40.0 / 33.570816)
    assert r["TFLOP/s"] == pytest.approx(0.8388608) and r["GB/s"] == pytest.approx(839.2704)
    assert r["call time (us)"] == 80.0 and r["L2"] == "cold"


def test_a_kernel_count_of_none_is_one_launch():
    data = {"points": [point("o", 16, 16, 1, 1.0, kernels=None), point("o", 16, 16, 2, 1.0, kernels=3)]}
    pts = matrix_shapes.points(data, costs.Roofline(1e15, 1e15, 2e-6))
    assert pts["kernels"].tolist() == [1, 3] and pts["model (us)"].tolist() == pytest.approx([2.0, 6.0])


def test_findings_worked_by_hand():
    times = {1: 10.0, 64: 12.0, 1000: 30.0, 1024: 20.0}
    data = {"points": [point("o", 4096, 4096, M, tt) for M, tt in times.items()]
            + [point("gate_up", 4096, 28672, M, 100.0) for M in times]
            + [point("o", 4096, 4096, 1, 1.0, cold=False)]}
    pts = matrix_shapes.points(data, costs.Roofline(100e12, 1e12))
    cold = pts[pts["L2"] == "cold"]
    decode = pd.DataFrame({"vs B=1": [1.0, 60.0]}, index=[1, 128])
    f = matrix_shapes.findings(cold, decode)
    assert f["o_m1_us"] == 10.0 and f["o_m1_call_us"] == 20.0  # the hot point is not used
    assert f["o_m64_max_over_m1"] == pytest.approx(1.2)
    assert f["m_1000_over_1024"] == pytest.approx(1.5) and math.isnan(f["m_1500_over_1024"])
    assert f["gate_up_m1_GBps"] == pytest.approx(costs.linear_bytes(1, 4096, 28672) / 100.0 / 1e3)
    assert f["o_mmax_tflops"] == pytest.approx(2 * 1024 * 4096 * 4096 / 20.0 / 1e6)
    assert f["decode_gain_b128"] == 60.0


def test_the_page_of_the_stored_h200_results_worked_by_hand():
    stored = results.load("01-matrix-shapes")
    res = SimpleNamespace(data=stored["data"], params=stored["params"], provenance=stored["provenance"],
                          date=stored["provenance"]["date"][:10])
    c = results.load("00-the-machine")["data"]
    c = ceilings.from_data(c)
    roof = costs.Roofline(c["bf16_tflops"] * 1e12, c["read_bw_GBps"] * 1e9, c["launch_graph_us"] * 1e-6)
    pts = matrix_shapes.points(res.data, roof)
    cold = pts[pts["L2"] == "cold"]
    decode = matrix_shapes.decode_steps(cold, 32, max_B=2048)
    knees = pd.DataFrame({"measured knee M*": [64.0], "knee / ridge": [0.5]}, index=pd.Index(["o"], name="layer"))
    hot_cold = pd.DataFrame({"o": [0.9], "gate_up": [0.8]}, index=pd.Index([1], name="M"))
    F1, Q1 = 2 * 4096 * 4096, 2 * (4096 + 4096 * 4096 + 4096)  # K = N = 4096, bf16, M = 1
    worked = {"m1_F": F1, "m1_Q": Q1, "m128_F": 128 * F1, "m128_Q": 2 * (2 * 128 * 4096 + 4096 * 4096),
              "P_seed": 100e12, "BW_seed": 1e12, "table": pd.DataFrame({"match": [True, True, False]})}
    step = {"step_knee_B": 256.0, "tpot_target_ms": 50.0, "tpot_target_max_B": 512, "fit_GBps": 4000.0,
            "fit_t0_us": 3.0}
    page = matrix_shapes.page(res, c, roof, pts, cold, decode, matrix_shapes.findings(cold, decode), knees, hot_cold,
                              worked, step)
    n = page.numbers
    assert n["m1_intensity"] == pytest.approx(33_554_432 / 33_570_816)  # just under 1 FLOP per byte
    assert n["m128_intensity"] == pytest.approx(2048 / 17)  # 128 * 4096 / (2 * 128 + 4096)
    assert n["m1_compute_bound_us_seed"] == pytest.approx(0.33554432)  # 33.55 MFLOP at 100 TFLOP/s
    assert n["m1_traffic_bound_us_seed"] == pytest.approx(33.570816)  # 33.57 MB at 1 TB/s
    assert (n["worked_matches"], n["worked_total"]) == (2, 3)
    # the o projection 4096 x 4096 and gate_up 4096 x 28672 in bf16: 32 MiB and 224 MiB
    assert (n["o_weight_MiB"], n["gate_up_weight_MiB"]) == (32.0, 224.0)
    # one layer's linear weights: 4096 x (6144 + 4096 + 28672) + 14336 x 4096 = 218,103,808; 32 layers in bf16: 13 GiB
    assert n["linear_weights_GiB"] == pytest.approx(13.0)
    assert n["n_layers"] == 32 and n["measured_knee_M"] == 64.0 and n["step_knee_over_ridge"] == pytest.approx(
        256.0 / costs.ridge_M(2, roof.P_flops, roof.BW_Bps))
    assert (n["hot_cold_o_m1"], n["hot_cold_gate_up_m1"]) == (0.9, 0.8)
    assert page.texts["device_name"].startswith("NVIDIA H200")
