"""Chapter 9's experiment (lib.experiments.quantization) at its smoke size on the CPU: every format is checked
and timed at every shape and row count, and the error study orders the formats as their step sizes say."""

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lib.bench import ceilings, results
from lib.experiments import quantization as qx


@pytest.fixture(scope="module")
def smoke():
    p = qx.sweep("smoke")
    return p, qx.measure(p, "cpu")


def test_every_format_is_checked_and_timed(smoke):
    p, d = smoke
    names = {"bf16", "int8"} | {f"int4 g{g}" for g in p["groups"]}
    assert {c["format"] for c in d["checks"]} == names  # no vendor path on a CPU
    assert all(c["rel_err"] <= p["tolerance"] for c in d["checks"])
    got = {(r["shape"], r["M"], r["format"]) for r in d["rows"]}
    assert got == {(s, M, f) for s in p["shapes"] for M in p["rows"] for f in names}
    assert all(r["call_us"] > 0 for r in d["rows"])
    K, N = p["shapes"]["a"]
    by = {r["format"]: r["bytes"] for r in d["rows"] if r["shape"] == "a"}
    assert by["bf16"] == 2 * K * N and by["int4 g32"] == K * N // 2 + 4 * (K // 32) * N


def test_errors_follow_the_step_sizes(smoke):
    """int8's step is max|w| / 127 per column, int4's max|w| / 7 per group: int8 errs least; a smaller group
    has a smaller max and errs less; outlier input channels raise every column's max, so they hurt int8 (one
    scale per column) more than they hurt int4 in groups of 32 (the outlier rows own few groups)."""
    p, d = smoke
    e = {(r["shape"], r["weights"], r["format"]): r["rel_err"] for r in d["errors"]}
    for s in p["shapes"]:
        for kind in qx.WEIGHT_KINDS:
            assert e[s, kind, "int8"] < e[s, kind, "int4 g32"] <= e[s, kind, "int4 g128"] * 1.05
        assert e[s, "outlier channels", "int8"] > 2 * e[s, "gaussian", "int8"]
        growth8 = e[s, "outlier channels", "int8"] / e[s, "gaussian", "int8"]
        growth4 = e[s, "outlier channels", "int4 g32"] / e[s, "gaussian", "int4 g32"]
        assert growth4 < growth8


def test_bad_sizes_and_kinds_are_refused():
    with pytest.raises(ValueError, match="size"):
        qx.sweep("huge")
    with pytest.raises(ValueError, match="kind"):
        qx.weights("uniform", 8, 8, seed=0, device="cpu")


def test_a_vendor_path_that_fails_is_recorded_and_not_timed_but_a_book_path_that_is_wrong_raises(monkeypatch):
    p = {**qx.sweep("smoke"), "shapes": {"a": [64, 32]}, "rows": [1], "groups": [32]}
    real = qx.formats

    def broken(*_):
        raise RuntimeError("this build has no such kernel")

    def with_vendor(params, device):
        return real(params, device) + [qx.Format("vendor", broken, None, None, lambda K, N: K * N, vendor=True)]

    monkeypatch.setattr(qx, "formats", with_vendor)
    d = qx.measure(p, "cpu")
    bad = [c for c in d["checks"] if c["format"] == "vendor"]
    assert bad and "no such kernel" in bad[0]["error"]
    assert "vendor" not in {r["format"] for r in d["rows"]} and "int8" in {r["format"] for r in d["rows"]}

    def wrong(params, device):  # the book's int8 path returning twice the product
        f = real(params, device)[1]
        return [qx.Format("int8", f.prepare, lambda x, s: 2 * f.call(x, s), f.effective, f.nbytes)]

    monkeypatch.setattr(qx, "formats", wrong)
    with pytest.raises(AssertionError, match="computes something else"):
        qx.measure(p, "cpu")


def test_the_decode_step_is_checked_and_timed_with_each_format(smoke):
    p, d = smoke
    g = p["step"]["group"]
    rows = {(r["format"], r["B"]): r for r in d["step"]}
    assert set(rows) == {(f, B) for f in ("bf16", "int8", f"int4 g{g}") for B, _ in p["step"]["shapes"]}
    for (f, _), r in rows.items():
        assert r["call_us"] > 0 and (r["check"] is None) == (f == "bf16")
        if r["check"]:
            assert r["check"]["max_rel"] <= 2e-5 and r["check"]["argmax_agree"] == 1.0
    # the layer weights' bytes: int4 (half a byte and a scale per group) < int8 < float32 (the smoke's dtype)
    lw = {f: rows[f, 1]["bytes"]["layer weights"] for f in ("bf16", "int8", f"int4 g{g}")}
    assert lw[f"int4 g{g}"] < lw["int8"] < lw["bf16"] / 3


def test_a_wrong_quantized_step_is_not_timed(monkeypatch):

    p = {**qx.sweep("smoke"), "shapes": {"a": [64, 32]}, "rows": [1], "groups": [32]}
    from lib.models import layers

    real = layers.Quantized.__call__

    def off(self, *a, **kw):
        return real(self, *a, **kw) * 1.01  # one percent off: more than the float32 tolerance

    monkeypatch.setattr(layers.Quantized, "__call__", off)
    with pytest.raises(AssertionError, match="not timed"):
        qx.measure_step(p, "cpu")


def test_kernel_time_by_kind():
    ks = [{"name": "_w4_gemv_kernel", "us": 3.0}, {"name": "_w8_kernel", "us": 2.0}, {"name": "_sum_splits_kernel", "us": 1.0},
          {"name": "nvjet_sm90_head", "us": 4.0}, {"name": "_decode_kernel", "us": 5.0}, {"name": "_rmsnorm_kernel", "us": 0.5}]
    assert qx._kernel_kinds(ks) == {"quantized products": 5.0, "other matrix kernels": 5.0, "attention": 5.0, "other": 0.5}
    assert qx._kernel_kinds(None) is None


def _rows():
    # two shapes, bf16 and int4 g128 and fp8 at M = 1, 16, 256: made-up times whose ratios are worked by hand
    t = {("a", 1): {"bf16": 10.0, "int4 g128": 4.0, "fp8": 6.0}, ("b", 1): {"bf16": 20.0, "int4 g128": 10.0, "fp8": 11.0},
         ("a", 16): {"bf16": 10.0, "int4 g128": 8.0, "fp8": 6.0}, ("b", 16): {"bf16": 20.0, "int4 g128": 25.0, "fp8": 11.0},
         ("a", 256): {"bf16": 12.0, "int4 g128": 30.0, "fp8": 7.0}, ("b", 256): {"bf16": 24.0, "int4 g128": 50.0, "fp8": 13.0}}
    K, N = 4096, 1024
    nbytes = {"bf16": 2 * K * N, "int4 g128": K * N // 2 + 4 * (K // 128) * N, "fp8": K * N}
    return [{"shape": s, "K": K, "N": N, "M": m, "format": f, "gpu_us": us, "bytes": nbytes[f]}
            for (s, m), fs in t.items() for f, us in fs.items()]


def test_speedups_and_where_one_format_overtakes_another_by_hand():
    df = qx.speedups(_rows())
    assert qx.speedup_min(df, "int4 g128", 1) == 2.0  # 10 / 4 and 20 / 10
    assert qx.speedup_min(df, "int4 g128", 16) == 0.8  # 20 / 25
    assert qx.speedup_min(df, "int8", 1) != qx.speedup_min(df, "int8", 1)  # not timed: NaN
    assert qx.speedup_max(df, "int4 g128", 1) == 2.5 and qx.speedup_max(df, "int4 g128", 16) == 1.25  # 10 / 8
    assert qx.first_rows_faster(df, "fp8", "int4 g128") == 16.0  # at M = 1 shape a's int4 is faster
    assert qx.first_rows_faster(df, "int4 g128", "fp8") != qx.first_rows_faster(df, "int4 g128", "fp8")  # never from on


def test_memory_model_and_its_memory_bound_points_by_hand():
    df = qx.speedups(_rows())
    mm = qx.memory_model(df, read_GBps=1000.0)  # a million bytes per microsecond
    r = mm[(mm["shape"] == "a") & (mm["M"] == 1) & (mm["format"] == "bf16")].iloc[0]
    assert r["predicted_us"] == 2 * 4096 * 1024 / 1e6 and r["measured / predicted"] == 10.0 / r["predicted_us"]
    # crossover of bf16 at 1,000 GB/s and 100 TFLOP/s: 2 bytes x 1e14 / (2 x 1e12) = 100 rows; int4 g128 about 26.6
    mb = qx.memory_bound_points(df, read_GBps=1000.0, mma_TFLOPs=100.0)
    assert set(zip(mb["format"], mb["M"])) == {("bf16", 1), ("bf16", 16), ("int4 g128", 1), ("int4 g128", 16),
                                               ("fp8", 1), ("fp8", 16)}
    assert qx.kind_of("torch int4 g128") == ("int4", 128) and qx.kind_of("torch int8") == ("int8", None)
    with pytest.raises(ValueError, match="unknown format"):
        qx.kind_of("int3")


def test_step_table_by_hand():
    b = {"layer weights": 600, "output head": 200, "attention (K/V)": 150, "embedding rows": 50}
    rows = [{"format": "bf16", "B": 1, "L": 8, "gpu_us": 2.0, "call_us": 5.0, "bytes": b},
            {"format": "int4 g128", "B": 1, "L": 8, "gpu_us": 1.0, "call_us": 5.0, "bytes": {**b, "layer weights": 100}}]
    t = qx.step_table(rows, read_GBps=1.0)  # a thousand bytes per microsecond
    assert t["floor_us"].tolist() == [1.0, 0.5] and t["speedup"].tolist() == [1.0, 2.0]
    assert t["over floor"].tolist() == [2.0, 2.0]


def test_kv_table_by_hand():
    rows = [{"B": 1, "L": 1024, "format": "bf16", "gpu_us": 10.0, "bytes": 4e6},
            {"B": 1, "L": 1024, "format": "fp8", "gpu_us": 8.0, "bytes": 2e6},
            {"B": 1, "L": 16384, "format": "bf16", "gpu_us": 100.0, "bytes": 64e6},
            {"B": 1, "L": 16384, "format": "fp8", "gpu_us": 55.0, "bytes": 32e6},
            {"B": 4, "L": 16384, "format": "bf16", "gpu_us": 400.0, "bytes": 256e6},
            {"B": 4, "L": 16384, "format": "fp8", "gpu_us": 200.0, "bytes": 128e6}]
    t = qx.kv_table(rows)
    assert t["speedup"].tolist() == pytest.approx([1.25, 100 / 55, 2.0])
    assert t["bf16 GB/s"].tolist() == pytest.approx([400.0, 640.0, 640.0])  # 4e6 B / 10 us = 400 GB/s
    assert qx.kv_speedup_min(t, 16384) == pytest.approx(100 / 55)  # the short context is left out
    assert qx.kv_speedup_min(t, 1024) == pytest.approx(1.25)
    assert qx.kv_speedup_min(t, 65536) != qx.kv_speedup_min(t, 65536)  # NaN: no such context


def test_layout_table_by_hand():
    rows = [{"shape": "o", "group": 32, "layout": "separate", "gpu_us": 10.0},
            {"shape": "o", "group": 32, "layout": "interleaved", "gpu_us": 12.0},
            {"shape": "o", "group": 128, "layout": "separate", "gpu_us": 8.0},
            {"shape": "o", "group": 128, "layout": "interleaved", "gpu_us": 8.0}]
    t = qx.layout_table(rows)
    assert t["group"].tolist() == [32, 128] and t["interleaved / separate"].tolist() == pytest.approx([1.2, 1.0])


def test_kv_cache_and_scale_layouts_are_checked_and_timed(smoke):
    p, d = smoke
    kv = p["kv"]
    assert {(r["B"], r["L"], r["format"]) for r in d["kv"]["rows"]} == {
        (B, L, f) for B in kv["Bs"] for L in kv["Ls"] for f in ("bf16", "fp8")}
    checked = d["kv"]["checks"]
    assert len(checked) == sum(B * L <= kv["check_tokens"] for B in kv["Bs"] for L in kv["Ls"]) > 0
    for c in checked:  # each kernel exact on what it reads; the 8-bit cache a few percent off the exact values
        assert c["bf16_rel_err"] <= kv["tolerance"] and c["fp8_rel_err"] <= kv["tolerance"]
        assert 0.005 < c["fp8_vs_exact"] < 0.1
    fp8 = {(r["B"], r["L"]): r["bytes"] for r in d["kv"]["rows"] if r["format"] == "fp8"}
    wide = {(r["B"], r["L"]): r["bytes"] for r in d["kv"]["rows"] if r["format"] == "bf16"}
    assert all(wide[k] == 4 * fp8[k] for k in fp8)  # the smoke run's 16-bit cache is float32: 4 bytes to 1
    lay = {(r["shape"], r["group"], r["layout"]) for r in d["layouts"]}
    assert lay == {(s, g, x) for s in p["shapes"] for g in p["groups"] for x in ("separate", "interleaved")}
    assert all(r["max_rel_diff"] == 0.0 for r in d["layouts"])  # the same values in another order


def test_a_path_that_rounds_x_is_checked_against_the_x_it_uses():
    # an emulated W8A8 product (x and w rounded to e4m3): exact against its own x and weights, and about
    # e4m3's step off the product with x unrounded, which is what the check compared before
    import torch

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 256, generator=g), torch.randn(256, 64, generator=g) * 0.02
    state = qx._fp8(w)
    emulated = lambda x, s: qx._fp8_x(x) @ s[2]  # noqa: E731
    own = qx.Format("w8a8", qx._fp8, emulated, lambda s: s[2], lambda K, N: K * N, rounds_x=qx._fp8_x)
    unrounded = qx.Format("w8a8", qx._fp8, emulated, lambda s: s[2], lambda K, N: K * N)
    assert qx.check(own, x, state) < 1e-6
    assert 0.005 < qx.check(unrounded, x, state) < 0.05


def test_every_timed_point_keeps_its_rounds(smoke):
    p, d = smoke
    for r in d["rows"] + d["layouts"] + d["kv"]["rows"]:
        assert len(r["call_us_rounds"]) == p["rounds"] and r["call_us"] == sorted(r["call_us_rounds"])[p["rounds"] // 2]
    assert all(len(r["gpu_us_rounds"]) == p["rounds"] for r in d["step"])


def test_a_path_handed_x_converted_gets_it_made_once_before_its_timed_calls(monkeypatch):
    # "fp8 gemm" is timed without x's quantization: given_x runs once per check and per row count, outside
    # the timed calls, and the call receives what it made
    p = {**qx.sweep("smoke"), "shapes": {"a": [64, 32]}, "rows": [1, 5], "groups": [32], "reps": 3}
    made = []

    def given(x):
        made.append(x.shape[0])
        return ("given", x)

    def call(xi, s):
        assert xi[0] == "given"
        return xi[1] @ s

    handed = qx.Format("handed", lambda w: w, call, lambda s: s.float(), lambda K, N: 4 * K * N, given_x=given)
    monkeypatch.setattr(qx, "formats", lambda params, device: [qx.Format("bf16", lambda w: w, lambda x, s: x @ s,
                                                                          lambda s: s.float(), lambda K, N: 4 * K * N),
                                                               handed])
    d = qx.measure(p, "cpu")
    assert sorted(r["M"] for r in d["rows"] if r["format"] == "handed") == [1, 5]
    assert made == [1, 1, 5]  # the check's x, then one x per row count, however many calls were timed


def test_the_fp8_paths_with_and_without_the_quantization_of_x_compute_the_same_product():
    import torch

    fmts = {f.name: f for f in qx.formats({**qx.sweep("smoke"), "groups": [32]}, "cuda")}
    full, gemm = fmts["fp8"], fmts["fp8 gemm"]
    assert qx.kind_of("fp8 gemm") == qx.kind_of("fp8") == ("fp8", None)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 128, generator=g), torch.randn(128, 48, generator=g) * 0.02
    try:
        state = gemm.prepare(w)
        y = gemm.call(gemm.input(x), state)
    except (RuntimeError, NotImplementedError) as ex:  # a build without FP8 products on the CPU
        pytest.skip(f"torch._scaled_mm on the CPU: {ex}")
    assert y.shape == (5, 48)  # the rows padded to 16 for the product are cut off again
    assert torch.equal(y, full.call(x, state))
    assert qx.check(gemm, x, state) < 1e-2  # bf16 output against float64 over the rounded x and w


# ---------------------------------------------------------------------------- the page's numbers

BOOK = Path(__file__).resolve().parents[1] / "book"
CLAIMS_NAMES = {"claims_table", "claims_held", "claims_total", "book_targets", "book_targets_table"}


def page_from(stored: dict, ceil: dict, *, without=()):
    """Chapter 9's page from stored results, through the notebook's own tables; ``without``: formats left out
    of the products' rows (as a run without those paths)."""
    data, params, prov = stored["data"], stored["params"], stored["provenance"]
    res = SimpleNamespace(data=data, params=params, provenance=prov, date=prov["date"][:10])
    read, mma = ceil["read_bw_GBps"], ceil["bf16_tflops"]
    df = qx.speedups([r for r in data["rows"] if r["format"] not in without])
    checks = pd.DataFrame(data["checks"])
    checks["timed"] = ["yes" if e <= params["tolerance"] else "no" for e in checks["rel_err"]]
    return qx.page(res, df, qx.memory_bound_points(df, read, mma), qx.step_table(data["step"], read),
                   qx.layout_table(data["layouts"]), qx.kv_table(data["kv"]["rows"]),
                   pd.DataFrame(data["kv"]["checks"]), checks, read)


@pytest.fixture(scope="module")
def h200():
    stored = results.load("09-quantization")
    return stored, page_from(stored, ceilings.load())


def test_the_page_of_the_stored_h200_results_worked_by_hand(h200):
    stored, page = h200
    data, n, t = stored["data"], page.numbers, page.texts
    assert len(n) == 85 and set(t) == {"device_name", "measured_date", "fp8_gemm_max_shape"}
    # int4 in groups of 128 reads 0.5 + 4 / 128 = 17/32 bytes a weight, in groups of 32 0.5 + 4 / 32 = 5/8
    assert n["int4_g128_bound"] == pytest.approx(2 / (17 / 32))
    assert n["g32_over_g128_bytes"] == pytest.approx((5 / 8) / (17 / 32))
    assert (n["scale_share_g32"], n["scale_share_g128"]) == (pytest.approx(0.2), pytest.approx(1 / 17))
    assert (n["tolerance"], n["step_b16"]) == (0.02, 16.0)

    def gpu(fmt, M):  # GPU time by product at M rows, from the stored rows
        return {r["shape"]: r["gpu_us"] for r in data["rows"] if r["format"] == fmt and r["M"] == M}

    int4, bf16 = gpu("int4 g128", 1), gpu("bf16", 1)
    assert n["int4_g128_speedup_m1_min"] == pytest.approx(min(bf16[s] / int4[s] for s in int4))
    assert n["int4_m1_share_of_bound_max"] == pytest.approx(max(bf16[s] / int4[s] for s in int4) / (64 / 17))
    gemm = [(gpu("bf16", r["M"])[r["shape"]] / r["gpu_us"], r["shape"], r["M"]) for r in data["rows"]
            if r["format"] == "fp8 gemm" and r["gpu_us"] is not None]
    best = max(gemm)
    assert (n["fp8_gemm_speedup_max"], n["fp8_gemm_max_rows"]) == (pytest.approx(best[0]), best[2])
    assert t["fp8_gemm_max_shape"] == best[1].replace("_", "-")
    step = {(r["format"], r["B"]): r["gpu_us"] for r in data["step"]}
    assert n["step_int4_b1_ms"] == pytest.approx(step[("int4 g128", 1)] / 1e3)
    assert n["step_int8_speedup_b16"] == pytest.approx(step[("bf16", 16)] / step[("int8", 16)])
    kv = {(r["B"], r["L"], r["format"]): r["gpu_us"] for r in data["kv"]["rows"]}
    assert n["fp8_kv_speedup_max"] == pytest.approx(max(kv[(B, L, "bf16")] / kv[(B, L, "fp8")] for B, L, _ in kv))
    assert n["err_int8_gauss"] == max(r["rel_err"] for r in data["errors"]
                                      if r["format"] == "int8" and r["weights"] == "gaussian")
    assert n["checks_max_err_timed"] == max(r["rel_err"] for r in data["checks"] if r["rel_err"] <= 0.02)
    assert t["device_name"].startswith("NVIDIA H200") and len(t["measured_date"]) == 10


def test_the_page_without_the_fp8_gemm_path_says_nan(h200):
    page = page_from(h200[0], ceilings.load(), without=("fp8 gemm",))
    n = page.numbers
    for name in ("fp8_gemm_speedup_max", "fp8_gemm_max_rows", "fp8_gemm_speedup_min", "bf16_at_fp8_max_us",
                 "fp8_quantize_x_us_m1", "fp8_gemm_over_int4_from_rows", "fp8_gemm_speedup_m1_min"):
        assert math.isnan(n[name]), name
    assert page.texts["fp8_gemm_max_shape"] == "-"
    assert n["int4_g128_speedup_m1_min"] == h200[1].numbers["int4_g128_speedup_m1_min"]  # the rest as before


def test_the_page_holds_every_name_the_book_pastes(h200):
    names = set()
    for md in BOOK.rglob("*.md"):
        names |= set(re.findall(r"09-quantization\.ipynb::(\w+)", md.read_text(encoding="utf-8")))
    names -= CLAIMS_NAMES
    assert {"int4_g128_speedup_m1_min", "fp8_gemm_max_shape"} <= names  # the search works
    missing = names - set(h200[1].numbers) - set(h200[1].texts)
    assert not missing, f"the book pastes {sorted(missing)}, which the page lacks"
