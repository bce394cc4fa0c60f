"""lib.diagrams.machine (chapter 0): the roofline's arithmetic worked by hand, and the diagrams drawing it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from lib.diagrams import machine as dm  # noqa: E402

# round numbers, so every expected value below is worked out by hand
C = {"read_bw_GBps": 4000.0, "copy_bw_GBps": 3200.0, "bf16_tflops": 800.0, "launch_eager_us": 8.0,
     "launch_graph_us": 1.25, "l2_bytes": 60 << 20}


def test_ridge_is_rate_over_bandwidth():
    assert dm.ridge(800.0, 4000.0) == pytest.approx(200.0)  # 800e12 FLOP/s / 4000e9 B/s
    assert dm.ridge(800.0, 3200.0) == pytest.approx(250.0)


def test_roof_is_bandwidth_bound_below_the_ridge_and_flat_above():
    got = dm.roof([1, 100, 200, 400, 10_000], 800.0, 4000.0)
    np.testing.assert_allclose(got, [4.0, 400.0, 800.0, 800.0, 800.0])  # 4000 GB/s * 1 FLOP/B = 4 TFLOP/s


@pytest.mark.parametrize("p, bw", [(0.0, 4000.0), (800.0, 0.0), (-1.0, 10.0)])
def test_ridge_and_roof_refuse_nonpositive_rates(p, bw):
    with pytest.raises(ValueError, match="positive"):
        dm.ridge(p, bw)
    with pytest.raises(ValueError, match="positive"):
        dm.roof([1.0], p, bw)


def texts_of(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [fig._suptitle.get_text() if fig._suptitle else ""]


def test_roofline_draws_both_roofs_and_marks_both_ridges():
    fig = dm.roofline(C, device="Test GPU", sheet={"bf16_tflops": 1000.0, "hbm_GBps": 5000.0})
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    read = next(ln for k, ln in lines.items() if "read 4000 GB/s" in k)
    copy = next(ln for k, ln in lines.items() if "copy 3200 GB/s" in k)
    sheet = next(ln for k, ln in lines.items() if k.startswith("datasheet"))
    x = read.get_xdata()
    np.testing.assert_allclose(read.get_ydata(), np.minimum(800.0, 4.0 * x))
    np.testing.assert_allclose(copy.get_ydata(), np.minimum(800.0, 3.2 * x))
    np.testing.assert_allclose(sheet.get_ydata(), np.minimum(1000.0, 5.0 * x))
    ridges = sorted(ln.get_xdata()[0] for ln in ax.get_lines() if len(set(ln.get_xdata())) == 1)
    assert ridges == pytest.approx([200.0, 250.0])
    text = " ".join(texts_of(fig))
    assert "200 FLOP/byte" in text and "250 FLOP/byte" in text and "Test GPU" in text
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert "1k" in ticks and not any("10^" in t or "times" in t for t in ticks), ticks
    plt.close(fig)


def test_hierarchy_labels_each_level_with_the_numbers_it_is_given():
    fig = dm.hierarchy(C, sms=132, memory_bytes=141 << 30, l2_hot_GBps=5700.0, device="Test GPU")
    text = "\n".join(texts_of(fig))
    for words in ("132 SMs", "800 TFLOP/s", "L2 60 MiB", "5700 GB/s", "HBM 141 GiB", "read 4000 GB/s",
                  "copy 3200 GB/s", "8.0 us a launch eagerly", "1.25 us in a CUDA graph", "Test GPU"):
        assert words in text, words
    assert min(t.get_fontsize() for ax in fig.axes for t in ax.texts) >= 9
    plt.close(fig)


def test_a_missing_ceiling_is_named():
    with pytest.raises(KeyError, match="read_bw_GBps"):
        dm.roofline({k: v for k, v in C.items() if k != "read_bw_GBps"}, device="x")


def test_a_run_without_an_l2_gets_a_box_that_says_so():
    fig = dm.hierarchy({**C, "l2_bytes": 0}, sms=8, memory_bytes=1 << 30, l2_hot_GBps=float("nan"), device="cpu")
    text = "\n".join(texts_of(fig))
    assert "not measured" in text and "GB/s, " not in text.split("L2")[1].split("HBM")[0]
    plt.close(fig)


def test_hierarchy_refuses_a_nan_l2_rate_when_there_is_an_l2():
    with pytest.raises(ValueError, match="l2_hot_GBps"):
        dm.hierarchy(C, sms=132, memory_bytes=1 << 30, l2_hot_GBps=float("nan"), device="x")


def test_roofline_refuses_a_zero_bandwidth_with_the_reason():
    with pytest.raises(ValueError, match="positive finite"):
        dm.roofline({**C, "read_bw_GBps": 0.0}, device="x")


def test_roofline_refuses_an_empty_intensity_range():
    with pytest.raises(ValueError, match="intensity"):
        dm.roofline(C, device="x", intensity=(64, 8))
