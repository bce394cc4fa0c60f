"""lib.experiments.roofline (chapter 2): the smoke sweep measured on the CPU, its checks, and its analysis."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F_

from lib import costs
from lib.bench import results
from lib.experiments import roofline


# the operators of chapter 2's notebook
def add(T, H, V, device, shared):
    a, b = (torch.randn(T, H, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    return (lambda: torch.add(a, b, out=c)), (a, b)


def rmsnorm(T, H, V, device, shared):
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    w = torch.randn(H, device=device, dtype=torch.bfloat16)
    return (lambda: F_.rms_norm(x, (H,), w, 1e-6)), (x, w)


def embedding(T, H, V, device, shared):
    if "table" not in shared:
        shared["table"] = torch.randn(V, H, device=device, dtype=torch.bfloat16)
    table = shared["table"]
    ids = torch.randint(0, V, (T,), device=device)
    return (lambda: F_.embedding(ids, table)), (ids, table)


def softmax(T, H, V, device, shared):
    x = torch.randn(T, V, device=device, dtype=torch.float32)
    return (lambda: torch.softmax(x, -1)), (x,)


OPS = {"add": add, "rmsnorm": rmsnorm, "embedding": embedding, "softmax": softmax}
TINY = {"H": 64, "V": 500, "T": [2], "T_softmax": [2], "T_detail": {}, "reps": 1, "target_ms": 0.05}


@pytest.fixture(scope="module")
def smoke():
    p = roofline.sweep("smoke")
    return p, roofline.measure(p, "cpu", OPS)


def test_smoke_data_has_the_reference_structure(smoke):
    p, data = smoke
    ref = results.load("02-roofline")["data"]
    assert list(data) == list(ref) and data["l2_bytes"] == 0
    for key in ("points", "detail"):
        assert list(data[key][0]) == list(ref[key][0])
    main = [(op, T, True) for op in roofline.OPS for T in (p["T_softmax"] if op == "softmax" else p["T"])]
    assert [(r["op"], r["T"], r["cold"]) for r in data["points"]] == main
    detail = [(op, T, cold) for op, Ts in p["T_detail"].items() for T in Ts for cold in (True, False)]
    assert [(r["op"], r["T"], r["cold"]) for r in data["detail"]] == detail
    for r in data["points"] + data["detail"]:
        assert (r["F"], r["Q"]) == roofline.counts(r["op"], r["T"], p["H"], p["V"])
        assert r["sets"] == 1 and r["kernels"] is None and r["kernel_names"] is None  # no L2, no profiler
        assert r["timing"]["gpu_us"]["n"] == p["reps"]


def test_counts_are_the_chapters_table():
    """T = 2 tokens, H = 3, V = 5: bf16 tensors of 6 elements (12 bytes), an fp32 [2, 5] of 40 bytes."""
    assert roofline.counts("add", 2, 3, 5) == (6, 36)  # read a and b, write c
    assert roofline.counts("rmsnorm", 2, 3, 5) == (24, 30)  # read x, write y, read the weight (6 bytes)
    assert roofline.counts("embedding", 2, 3, 5) == (0, 40)  # read 2 rows, write them, read 2 int64 ids
    assert roofline.counts("softmax", 2, 3, 5) == (50, 80)  # read the logits, write the probabilities
    with pytest.raises(ValueError, match="op='gelu' is not one of"):
        roofline.counts("gelu", 1, 1, 1)


# ---------------------------------------------------------------------------- a wrong call is not timed

@pytest.mark.parametrize("op", roofline.OPS)
def test_the_right_output_passes_its_check(op):
    call, inputs = OPS[op](3, 64, 500, "cpu", {})
    roofline.check(op, call(), inputs)


@pytest.mark.parametrize("op, wrong", [
    ("add", lambda a, b: a - b),
    ("rmsnorm", lambda x, w: F_.rms_norm(x, (x.shape[-1],), None, 1e-6)),  # the weight forgotten
    ("embedding", lambda ids, table: table[(ids + 1) % table.shape[0]]),  # one row off
    ("softmax", lambda x: torch.softmax(x / 1.01, -1)),  # 1% off in the exponent
])
def test_a_wrong_output_raises(op, wrong):
    _, inputs = OPS[op](3, 64, 500, "cpu", {})
    with pytest.raises(AssertionError, match=f"^{op}: the output"):
        roofline.check(op, wrong(*inputs), inputs)


def test_a_wrong_operator_is_not_timed():
    def doubled(T, H, V, device, shared):
        call, inputs = add(T, H, V, device, shared)
        return (lambda: call().mul_(2)), inputs

    with pytest.raises(AssertionError, match="add: the output differs from a"):
        roofline.measure(TINY, "cpu", {**OPS, "add": doubled})


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="'full' and a 'smoke'"):
        roofline.sweep("medium")
    with pytest.raises(ValueError, match="ops must map each of"):
        roofline.measure(TINY, "cpu", {k: v for k, v in OPS.items() if k != "softmax"})
    with pytest.raises(ValueError, match=r"params lack \['T_detail'\]"):
        roofline.measure({k: v for k, v in TINY.items() if k != "T_detail"}, "cpu", OPS)
    with pytest.raises(ValueError, match="op='gelu'"):
        roofline.check("gelu", torch.zeros(1), ())


# ---------------------------------------------------------------------------- the analysis, worked by hand

def t(gpu_us, call_us=None):
    s = lambda m: {"median": m, "q1": m, "q3": m, "min": m, "max": m, "n": 1}  # noqa: E731
    return {"gpu_us": s(gpu_us), "call_us": s(call_us or gpu_us), "calls_per_sample": 1, "buffers": 1, "method": "x"}


ROOF = costs.Roofline(100e12, 1e12, 2e-6)  # 100 TFLOP/s, 1 TB/s, 2 us per launch in a graph
ROOF_EAGER = costs.Roofline(100e12, 1e12, 5e-6)


def op_row(op, T, Q, gpu_us, kernels=1, names=None, cold=True, F=0):
    return {"op": op, "T": T, "cold": cold, "F": F, "Q": Q, "sets": 1, "kernels": kernels,
            "kernel_names": names, "timing": t(gpu_us, 3 * gpu_us)}


def test_points_and_their_bounds():
    """A 4096 x 4096 layer at M = 1 reads 33.57 MB: 33.57 us at 1 TB/s; a 1 MB add: 1 us of traffic under
    a 2 us launch; a gather of 1 kernel counted as None still pays one launch."""
    ch1 = {"points": [{"name": "o", "K": 4096, "N": 4096, "M": 1, "cold": False, "kernels": 1, "timing": t(30.0)}]}
    data = {"points": [op_row("add", 1, 10**6, 4.0, kernels=2), op_row("embedding", 1, 10**3, 3.0, kernels=None)]}
    pts = roofline.points(ch1, data, ROOF, ROOF_EAGER).set_index("what")
    assert pts.loc["o", "model (us)"] == pytest.approx(33.570816) and pts.loc["o", "bound"] == "memory"
    assert pts.loc["o", "L2"] == "hot" and pts.loc["o", "source"] == "linear"
    assert pts.loc["add", "model (us)"] == pytest.approx(4.0) and pts.loc["add", "bound"] == "launch"
    assert pts.loc["add", "measured / model"] == pytest.approx(1.0)
    assert pts.loc["add", "call model (us)"] == pytest.approx(10.0)
    assert pts.loc["add", "call / call model"] == pytest.approx(1.2)
    assert pts.loc["embedding", "kernels"] == 1 and pts.loc["embedding", "model (us)"] == pytest.approx(2.0)


def test_model_summary():
    import pandas as pd

    cold = pd.DataFrame({"bound": ["memory", "memory", "memory", "launch"], "measured / model": [1.0, 1.2, 3.0, 0.5]})
    s = roofline.model_summary(cold)
    assert s.loc["memory"].tolist() == pytest.approx([3, 1.2, 0.2])
    assert s.loc["launch"].tolist() == pytest.approx([1, 0.5, 0.5])
    assert s.loc["all (L2 defeated)"].tolist() == pytest.approx([4, 1.1, 0.35])


def test_findings_worked_by_hand():
    MiB = 2**20
    data = {
        "points": [op_row("add", 1, MiB // 4, 2.0), op_row("add", 256, 24 * MiB, 30.0),
                   op_row("rmsnorm", 1, MiB // 4, 4.0, kernels=2), op_row("rmsnorm", 256, 16 * MiB, 40.0),
                   op_row("embedding", 1, MiB // 4, 3.0), op_row("embedding", 256, 4 * MiB, 8.0),
                   op_row("softmax", 1, MiB, 5.0, F=10**6), op_row("softmax", 256, 128 * MiB, 300.0, F=10**9)],
        "detail": [op_row("embedding", T, 1, tt, names=[name], cold=cold)
                   for T, tt, name in [(1, 3.0, "indexSelectSmallIndex"), (2, 3.5, "indexSelectSmallIndex"),
                                       (4, 6.0, "indexSelectLargeIndex")] for cold in (True, False)]
        + [op_row("rmsnorm", T, 1, tt, cold=cold) for T, tt, cold in [(1, 4.0, True), (2, 5.0, True), (1, 2.0, False)]]
        + [op_row("softmax", T, 1, tt) for T, tt in [(1, 5.0), (16, 7.0)]],
    }
    pts = roofline.points({"points": []}, data, ROOF, ROOF_EAGER)
    ops = pts[pts["source"] == "memory-bound"].copy()
    ops["GB/s"] = ops["Q"] / ops["GPU time (us)"] / 1e3
    f = roofline.findings(pts, ops, roofline.detail(data))
    assert f["model_points"] == 8 and f["outliers_hot_beat"] == 0
    assert f["add_big_GBps"] == pytest.approx(24 * MiB / 30.0 / 1e3) and f["add_small_gpu_us"] == 2.0
    assert f["add_small_call_us"] == 6.0 and f["small_call_over_gpu"] == 3.0
    assert f["mid_T"] == 256 and f["add_mid_MiB"] == 24.0 and f["emb_mid_MiB"] == 4.0
    assert f["add_mid_ratio"] == pytest.approx(30.0 / (24 * MiB / 1e6))
    assert f["rmsnorm_kernels"] == 2 and f["rmsnorm_small_ratio"] == pytest.approx(4.0 / 4.0)  # two launches of 2 us
    assert f["emb_small_kernel_max_T"] == 2 and f["emb_small_kernel_max_us"] == 3.5
    assert (f["emb_gather_min_T"], f["emb_gather_first_us"]) == (4, 6.0)
    assert (f["rms_floor_cold_us"], f["rms_floor_hot_us"], f["rms_detail_max_T"]) == (4.5, 2.0, 2)
    assert (f["softmax_t1_us"], f["softmax_t16_us"]) == (5.0, 7.0)
    assert all(f[f"softmax_t{T}_us"] != f[f"softmax_t{T}_us"] for T in (64, 132, 528))  # NaN: not in the sweep
