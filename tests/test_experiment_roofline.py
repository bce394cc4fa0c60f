"""lib.experiments.roofline (chapter 2): the smoke sweep measured on the CPU, its checks, and its analysis."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F_

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


def attn_prefill(B, T, L, a, device):
    q = torch.randn(B, a["H_q"], T, a["d"], device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, a["H_kv"], L, a["d"], device=device, dtype=torch.bfloat16) for _ in range(2))
    return (lambda: F_.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)), (q, k, v)


def attn_decode(B, T, L, a, device):
    q = torch.randn(B, a["H_q"], T, a["d"], device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, a["H_kv"], L, a["d"], device=device, dtype=torch.bfloat16) for _ in range(2))
    return (lambda: F_.scaled_dot_product_attention(q, k, v, enable_gqa=True)), (q, k, v)


OPS = {"add": add, "rmsnorm": rmsnorm, "embedding": embedding, "softmax": softmax}
ATTENTION = {"attn_prefill": attn_prefill, "attn_decode": attn_decode}
HEADS = {"H_q": 4, "H_kv": 2, "d": 16}
TINY = {"H": 64, "V": 500, "T": [2], "T_softmax": [2], "T_detail": {},
        "attention": {**HEADS, "T": [4], "B": [2], "L": [8]}, "reps": 1, "target_ms": 0.05}


@pytest.fixture(scope="module")
def smoke():
    p = roofline.sweep("smoke")
    return p, roofline.measure(p, "cpu", OPS, ATTENTION)


def test_smoke_data_has_the_reference_structure(smoke):
    p, data = smoke
    ref = results.load("02-roofline")["data"]
    assert list(data) == ["l2_bytes", "points", "detail", "attention"] and data["l2_bytes"] == 0
    for key in ("points", "detail", "attention"):
        if key in ref:
            assert list(data[key][0]) == list(ref[key][0])
    main = [(op, T, True) for op in roofline.OPS for T in (p["T_softmax"] if op == "softmax" else p["T"])]
    assert [(r["op"], r["T"], r["cold"]) for r in data["points"]] == main
    detail = [(op, T, cold) for op, Ts in p["T_detail"].items() for T in Ts for cold in (True, False)]
    assert [(r["op"], r["T"], r["cold"]) for r in data["detail"]] == detail
    for r in data["points"] + data["detail"]:
        assert (r["F"], r["Q"]) == roofline.counts(r["op"], r["T"], p["H"], p["V"])
    a = p["attention"]
    shapes = [("attn_prefill", 1, T, T) for T in a["T"]] + [("attn_decode", B, 1, L) for B in a["B"] for L in a["L"]]
    assert [(r["op"], r["B"], r["T"], r["L"]) for r in data["attention"]] == shapes
    for r in data["attention"]:
        assert (r["F"], r["Q"]) == roofline.attention_counts(r["op"], r["B"], r["T"], r["L"], a["H_q"], a["H_kv"], a["d"])
    for r in data["points"] + data["detail"] + data["attention"]:
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


def test_attention_counts_worked_by_hand():
    """Llama-3-8B's heads (H_q = 32, H_kv = 8, d = 128), bf16.

    Prefill of T = 1024: 1024^2 / 2 = 524,288 (query, key) pairs, 4 d H_q = 16,384 FLOPs each: 8.59 GFLOP;
    q and the output 2 x 1024 x 32 x 128 x 2 B = 16 MiB, K and V 2 x 1024 x 8 x 128 x 2 B = 4 MiB.
    Decode of B = 16 over L = 8192: 131,072 pairs of 16,384 FLOPs (2.15 GFLOP); K and V 16 x 2 x 8192 x 8 x
    128 x 2 B = 512 MiB, q and the output 16 x 2 x 32 x 128 x 2 B = 256 KiB: intensity about H_q/H_kv = 4."""
    MiB = 2**20
    assert roofline.attention_counts("attn_prefill", 1, 1024, 1024, 32, 8, 128) == (8_589_934_592, 20 * MiB)
    F, Q = roofline.attention_counts("attn_decode", 16, 1, 8192, 32, 8, 128)
    assert (F, Q) == (2_147_483_648, 512 * MiB + 256 * 1024)
    assert 3.99 < F / Q < 4
    assert roofline.attention_counts("attn_decode", 1, 1, 10, 2, 1, 1, b=4) == (80, 4 * (2 * 2 + 2 * 10))


def test_attention_shapes_are_the_sweeps():
    a = {"T": [8, 32], "B": [1, 4], "L": [16, 64]}
    assert roofline.attention_shapes(a) == [
        ("attn_prefill", 1, 8, 8), ("attn_prefill", 1, 32, 32), ("attn_decode", 1, 1, 16), ("attn_decode", 1, 1, 64),
        ("attn_decode", 4, 1, 16), ("attn_decode", 4, 1, 64)]


@pytest.mark.parametrize("args, match", [
    (("attn_prefill", 1, 8, 16, 4, 2, 16), "L must equal T"),
    (("attn_decode", 2, 3, 16, 4, 2, 16), "T must be 1"),
    (("attn_decode", 2, 1, 16, 4, 3, 16), "multiple of H_kv"),
    (("attn_decode", 0, 1, 16, 4, 2, 16), "B must be a positive int"),
    (("attn_paged", 1, 1, 16, 4, 2, 16), "op='attn_paged' is not one of"),
])
def test_attention_counts_refuse_shapes_that_are_not_the_operator(args, match):
    with pytest.raises(ValueError, match=match):
        roofline.attention_counts(*args)


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


@pytest.mark.parametrize("op, B, T, L", [("attn_prefill", 1, 24, 24), ("attn_decode", 3, 1, 40)])
def test_attention_right_and_wrong(op, B, T, L):
    """The right call passes; the KV heads shared the wrong way round (head h reading KV head h mod H_kv
    instead of h // (H_q/H_kv)), or a prefill without its causal mask, is refused."""
    call, (q, k, v) = ATTENTION[op](B, T, L, HEADS, "cpu")
    roofline.check_attention(op, call(), (q, k, v))
    g = HEADS["H_q"] // HEADS["H_kv"]
    wrong = F_.scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), is_causal=op == "attn_prefill")
    with pytest.raises(AssertionError, match=f"^{op}: the output has a relative error"):
        roofline.check_attention(op, wrong, (q, k, v))
    if op == "attn_prefill":
        with pytest.raises(AssertionError, match="relative error"):
            roofline.check_attention(op, F_.scaled_dot_product_attention(q, k, v, enable_gqa=True), (q, k, v))
    with pytest.raises(AssertionError, match="has shape"):
        roofline.check_attention(op, call()[:, :1], (q, k, v))


def test_a_wrong_attention_is_not_timed():
    def unscaled(B, T, L, a, device):  # scores not divided by sqrt(d)
        call, (q, k, v) = attn_decode(B, T, L, a, device)
        return (lambda: F_.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=1.0)), (q, k, v)

    with pytest.raises(AssertionError, match="attn_decode: the output has a relative error"):
        roofline.measure(TINY, "cpu", OPS, {**ATTENTION, "attn_decode": unscaled})


def test_a_wrong_operator_is_not_timed():
    def doubled(T, H, V, device, shared):
        call, inputs = add(T, H, V, device, shared)
        return (lambda: call().mul_(2)), inputs

    with pytest.raises(AssertionError, match="add: the output differs from a"):
        roofline.measure(TINY, "cpu", {**OPS, "add": doubled}, ATTENTION)


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="'full' and a 'smoke'"):
        roofline.sweep("medium")
    with pytest.raises(ValueError, match="ops must map each of"):
        roofline.measure(TINY, "cpu", {k: v for k, v in OPS.items() if k != "softmax"}, ATTENTION)
    with pytest.raises(ValueError, match="attention must map each of"):
        roofline.measure(TINY, "cpu", OPS, {"attn_prefill": attn_prefill})
    with pytest.raises(ValueError, match=r"params lack \['T_detail'\]"):
        roofline.measure({k: v for k, v in TINY.items() if k != "T_detail"}, "cpu", OPS, ATTENTION)
    with pytest.raises(ValueError, match=r"params lack \['L'\]"):
        roofline.measure({**TINY, "attention": {**HEADS, "T": [4], "B": [2]}}, "cpu", OPS, ATTENTION)
    with pytest.raises(ValueError, match="op='gelu'"):
        roofline.check("gelu", torch.zeros(1), ())


# ---------------------------------------------------------------------------- the analysis, worked by hand

def t(gpu_us, call_us=None):
    s = lambda m: {"median": m, "q1": m, "q3": m, "min": m, "max": m, "n": 1}  # noqa: E731
    return {"gpu_us": s(gpu_us), "call_us": s(call_us or gpu_us), "calls_per_sample": 1, "buffers": 1, "method": "x"}


# 100 TFLOP/s; reads at 2 TB/s, copies at 1 TB/s; 2 us per launch in a graph, 5 us eager
C = {"bf16_tflops": 100.0, "read_bw_GBps": 2000.0, "copy_bw_GBps": 1000.0, "launch_graph_us": 2.0, "launch_eager_us": 5.0}
PARAMS = {"H": 4096, "V": 1000, "attention": {"H_q": 32, "H_kv": 8, "d": 128}}


def op_row(op, T, Q, gpu_us, kernels=1, names=None, cold=True, F=0):
    return {"op": op, "T": T, "cold": cold, "F": F, "Q": Q, "sets": 1, "kernels": kernels,
            "kernel_names": names, "timing": t(gpu_us, 3 * gpu_us)}


def attn_row(op, B, T, L, gpu_us):
    F, Q = roofline.attention_counts(op, B, T, L, 32, 8, 128)
    return {"op": op, "B": B, "T": T, "L": L, "cold": True, "F": F, "Q": Q, "sets": 1, "kernels": 1,
            "kernel_names": None, "timing": t(gpu_us)}


def test_floor_rate_is_read_where_reads_are_twice_the_writes():
    assert roofline.floor_rate(3, 1) == "read"  # the add: two inputs read, one output written
    assert roofline.floor_rate(299, 100) == "copy"  # writes just over a third
    assert roofline.floor_rate(4, 2) == "copy"  # a copy: as much written as read
    assert roofline.floor_rate(10, 0) == "read"
    with pytest.raises(ValueError, match="written <= Q"):
        roofline.floor_rate(10, 11)


def test_points_and_their_bounds():
    """Each point's floor with the rate its traffic uses.

    A 4096 x 4096 layer at M = 1 reads 33.57 MB of weights: 16.79 us at the 2 TB/s read rate. An add of
    T = 1024 (two [1024, 4096] bf16 inputs read, one written: 25.17 MB) reads twice what it writes: 12.58 us
    at the read rate. RMSNorm of T = 1024 writes as much as it reads: 16.79 MB at the 1 TB/s copy rate. A
    gather of 1 token moves 16 KB, under one 2 us launch (a kernel count of None still pays one). Decode
    attention, 16 requests over 8192 tokens, reads 537 MB of K and V: 268.6 us at the read rate; prefill of
    8192 tokens does 549.8 GFLOP: 5.50 ms at 100 TFLOP/s, compute-bound."""
    ch1 = {"points": [{"name": "o", "K": 4096, "N": 4096, "M": 1, "cold": False, "kernels": 1, "timing": t(30.0)}]}
    data = {"points": [op_row("add", 1024, 25_165_824, 12.58291712 * 1.5, F=1024 * 4096),
                       op_row("rmsnorm", 1024, 16_785_408, 20.0, F=4 * 1024 * 4096),
                       op_row("embedding", 1, 16_392, 3.0, kernels=None)],
            "attention": [attn_row("attn_decode", 16, 1, 8192, 300.0), attn_row("attn_prefill", 1, 8192, 8192, 8000.0)],
            "detail": []}
    pts = roofline.points(ch1, data, PARAMS, C).set_index("what")
    assert pts.loc["o", "model (us)"] == pytest.approx(16.785408) and pts.loc["o", "bound"] == "memory"
    assert pts.loc["o", "rate"] == "read" and pts.loc["o", "L2"] == "hot" and pts.loc["o", "source"] == "linear"
    assert pts.loc["add", "rate"] == "read" and pts.loc["add", "model (us)"] == pytest.approx(12.582912)
    assert pts.loc["add", "measured / model"] == pytest.approx(1.5)
    assert pts.loc["add", "call model (us)"] == pytest.approx(12.582912)
    assert pts.loc["rmsnorm", "rate"] == "copy" and pts.loc["rmsnorm", "model (us)"] == pytest.approx(16.785408)
    assert pts.loc["embedding", "kernels"] == 1 and pts.loc["embedding", "model (us)"] == pytest.approx(2.0)
    assert pts.loc["embedding", "bound"] == "launch" and pts.loc["embedding", "call model (us)"] == pytest.approx(5.0)
    dec, pre = pts.loc["decode attention"], pts.loc["prefill attention"]
    assert (dec["source"], dec["size"], dec["L"], dec["rate"], dec["bound"]) == ("attention", 16, 8192, "read", "memory")
    assert dec["model (us)"] == pytest.approx(268.566528) and dec["GB/s"] == pytest.approx(537_133_056 / 300.0 / 1e3)
    assert (pre["size"], pre["L"], pre["rate"], pre["bound"]) == (8192, 8192, "copy", "compute")
    assert pre["model (us)"] == pytest.approx(5497.55813888) and pre["TFLOP/s"] == pytest.approx(549.755813888 / 8.0)


def test_the_prediction_before_measuring():
    """Llama-3-8B's heads on the test machine: causal prefill turns compute-bound at T = 2 I* (H_q + H_kv) /
    H_q = 2 x 100 x 40 / 32 = 250 tokens (copy ridge 100 FLOP/byte); decode stays near H_q / H_kv = 4."""
    a = {"H_q": 32, "H_kv": 8, "d": 128, "T": [128, 1024], "B": [16], "L": [8192]}
    assert roofline.prefill_knee_T(a, 100.0) == pytest.approx(250.0)
    pred = roofline.predict_attention(a, C).set_index(["what", "L"])
    short, long = pred.loc[("prefill attention", 128)], pred.loc[("prefill attention", 1024)]
    assert short["bound"] == "memory" and long["bound"] == "compute"  # on either side of 250 tokens
    assert short["I (FLOP/byte)"] == pytest.approx(128 * 32 / 80)
    assert long["floor (us)"] == pytest.approx(8_589_934_592 / 100e12 * 1e6)
    dec = pred.loc[("decode attention", 8192)]
    assert dec["rate"] == "read" and dec["floor (us)"] == pytest.approx(268.566528)
    assert 3.99 < dec["I (FLOP/byte)"] < 4


def test_intensities_list_every_operator_from_the_formulas():
    p = {**roofline.sweep("smoke"), "T": [4], "T_softmax": [2]}
    out = roofline.intensities(p, [1, 64])
    assert list(out["family"].unique()) == ["linear", *roofline.OPS, "prefill attention", "decode attention"]
    assert len(out[out["family"] == "linear"]) == 4 * 2  # Llama-3-8B's four linear layers at two M
    emb = out[out["family"] == "embedding"].iloc[0]
    assert emb["I (FLOP/byte)"] == 0 and emb["rate"] == "copy"
    add = out[out["family"] == "add"].iloc[0]
    assert add["I (FLOP/byte)"] == pytest.approx(1 / 6) and add["rate"] == "read"
    o1 = out[(out["what"] == "linear o") & (out["size"] == 1)].iloc[0]
    assert o1["Q"] == 33_570_816 and o1["rate"] == "read"


def test_model_summary():
    import pandas as pd

    cold = pd.DataFrame({"bound": ["memory", "memory", "memory", "launch"], "measured / model": [1.0, 1.2, 3.0, 0.5]})
    s = roofline.model_summary(cold).set_index("bound")
    assert s.loc["memory"].tolist() == pytest.approx([3, 1.2, 0.2])
    assert s.loc["launch"].tolist() == pytest.approx([1, 0.5, 0.5])
    assert s.loc["all (L2 defeated)"].tolist() == pytest.approx([4, 1.1, 0.35])
    assert s["points"].dtype.kind == "i"  # counts print as integers


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
        "attention": [],
    }
    c = {**C, "read_bw_GBps": 1000.0}  # one bandwidth, 1 TB/s, whatever the traffic
    pts = roofline.points({"points": []}, data, {**PARAMS, "H": 8, "V": 8}, c)
    f = roofline.findings(pts, roofline.detail(data))
    assert f["model_points"] == 8 and f["outliers_hot_beat"] == 0
    assert f["floor_min_what"] == "add at T = 1" and f["floor_min_ratio"] == 1.0  # at its one launch of 2 us
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


def test_attention_findings_worked_by_hand():
    """Decode of 16 requests over 1024 tokens reads 67.37 MB; over 8192, 537.1 MB: at 300 us that is 1790 GB/s,
    0.895 of the 2 TB/s read rate. Prefill of 8192 tokens, 549.8 GFLOP in 8 ms: 68.7 TFLOP/s, 0.687 of P."""
    data = {"points": [], "detail": [],
            "attention": [attn_row("attn_decode", 16, 1, 1024, 60.0), attn_row("attn_decode", 16, 1, 8192, 300.0),
                          attn_row("attn_decode", 4, 1, 8192, 80.0),
                          attn_row("attn_prefill", 1, 512, 512, 50.0), attn_row("attn_prefill", 1, 8192, 8192, 8000.0)]}
    fa = roofline.attention_findings(roofline.points({"points": []}, data, PARAMS, C), C)
    assert fa["attn_decode_small_us"] == 60.0 and fa["attn_decode_big_us"] == 300.0
    assert fa["attn_decode_big_frac_read"] == pytest.approx(537_133_056 / 300.0 / 1e3 / 2000)
    assert fa["attn_decode_min_frac_read"] == pytest.approx(67_371_008 / 60.0 / 1e3 / 2000)
    assert fa["attn_decode_big_ratio"] == pytest.approx(300.0 / 268.566528)
    assert fa["attn_prefill_big_tflops"] == pytest.approx(549.755813888 / 8) and fa["attn_prefill_big_us"] == 8000.0
    assert fa["attn_prefill_big_frac_P"] == pytest.approx(549.755813888 / 8 / 100)
    assert fa["attn_prefill_small_ratio"] == pytest.approx(50.0 / (2_147_483_648 / 100e12 * 1e6))
    assert (fa["attn_decode_small_B"], fa["attn_decode_small_L"]) == (16, 1024)


def test_attention_findings_say_how_decode_grows_with_the_batch():
    """At the longest context, 4 requests read 4 x 33.55 MB of K and V (plus q and the output) and 16 read
    4 times that: 50 us then 190 us is 3.8x the time for 4x the bytes. Without attention points: an error
    that says to re-measure."""
    data = {"points": [], "detail": [],
            "attention": [attn_row("attn_decode", 4, 1, 8192, 50.0), attn_row("attn_decode", 16, 1, 8192, 190.0),
                          attn_row("attn_decode", 16, 1, 1024, 30.0), attn_row("attn_prefill", 1, 512, 512, 50.0)]}
    fa = roofline.attention_findings(roofline.points({"points": []}, data, PARAMS, C), C)
    assert (fa["attn_decode_batch_from"], fa["attn_decode_batch_to"]) == (4, 16)
    assert fa["attn_decode_batch_time_ratio"] == pytest.approx(3.8) and fa["attn_decode_batch_bytes_ratio"] == pytest.approx(4.0)
    assert fa["attn_decode_max_frac_read"] == pytest.approx(537_133_056 / 190.0 / 1e3 / 2000)
    no_prefill = {**data, "attention": data["attention"][:3]}
    with pytest.raises(ValueError, match="re-measure the chapter"):
        roofline.attention_findings(roofline.points({"points": []}, no_prefill, PARAMS, C), C)
