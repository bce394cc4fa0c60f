"""Chapter 9's experiment (lib.experiments.quantization) at its smoke size on the CPU: every format is checked
and timed at every shape and row count, and the error study orders the formats as their step sizes say."""

import pytest

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
    from lib import llama_quant

    p = {**qx.sweep("smoke"), "shapes": {"a": [64, 32]}, "rows": [1], "groups": [32]}
    real = llama_quant.QuantStep._final_hidden

    def off(self, *a):
        return real(self, *a) * 1.01  # one percent off: more than the float32 tolerance

    monkeypatch.setattr(llama_quant.QuantStep, "_final_hidden", off)
    with pytest.raises(AssertionError, match="not timed"):
        qx.measure_step(p, "cpu")


def test_kernel_time_by_kind():
    ks = [{"name": "_w4_gemv_kernel", "us": 3.0}, {"name": "_w8_kernel", "us": 2.0}, {"name": "_sum_splits_kernel", "us": 1.0},
          {"name": "nvjet_sm90_head", "us": 4.0}, {"name": "_decode_kernel", "us": 5.0}, {"name": "_rmsnorm_kernel", "us": 0.5}]
    assert qx._kernel_kinds(ks) == {"quantized products": 5.0, "other matrix kernels": 5.0, "attention": 5.0, "other": 0.5}
    assert qx._kernel_kinds(None) is None
