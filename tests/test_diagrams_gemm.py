"""lib.diagrams.gemm (chapter 1's figures) and the analysis that feeds them (lib.experiments.matrix_shapes:
the knee, the decode step over B, the weight bytes a decode step reads), worked by hand."""

from __future__ import annotations

import math

import matplotlib
import pandas as pd
import pytest

from lib import costs
from lib.bench import glue
from lib.diagrams import gemm
from lib.experiments import matrix_shapes

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    matplotlib.pyplot.close("all")


# ---------------------------------------------------------------------------- bytes of the shapes

def test_crossover_of_a_square_layer_is_half_its_width():
    # M (K + N) = K N with K = N = 4096: M = 4096^2 / 8192 = 2048
    assert gemm.crossover_M({"o": (4096, 4096)}) == 2048


def test_crossover_of_a_llama_block_by_hand():
    # sum K N = 4096 (6144 + 4096 + 28672 + 14336) = 218,103,808; sum (K + N) = 10240 + 8192 + 32768 + 18432 = 69,632
    assert gemm.crossover_M(costs.LLAMA3_8B["linears"]) == pytest.approx(218_103_808 / 69_632)


def test_block_bytes_by_hand():
    w, act = gemm.block_bytes({"o": (4096, 4096)}, [1, 2048], b=2)
    assert w == 2 * 4096 * 4096
    assert act.tolist() == [2 * 8192, 2 * 2048 * 8192]
    assert act[1] == w  # at the crossover the activations weigh as much as the weight


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="no layers"):
        gemm.crossover_M({})
    with pytest.raises(ValueError, match="o: K must be a positive int"):
        gemm.crossover_M({"o": (0, 4096)})


# ---------------------------------------------------------------------------- the diagram

def test_the_drawing_is_to_scale():
    shapes = {"a": (300, 500), "b": (100, 100)}
    fig = gemm.gemm(shapes, "a", [1, 40, 300], ridge_M=40.0)
    assert len(fig.rects) == 3
    for m, rects in zip([1, 40, 300], fig.rects):
        assert (rects["W"].get_width(), rects["W"].get_height()) == (500, 300)  # W [K, N]: N wide, K high
        assert (rects["X"].get_width(), rects["X"].get_height()) == (300, m)  # X [M, K]
        assert (rects["Y"].get_width(), rects["Y"].get_height()) == (500, m)  # Y [M, N]
        # Y sits under W, X to the left of Y, on the same rows
        assert rects["Y"].get_x() == rects["W"].get_x() and rects["X"].get_y() == rects["Y"].get_y()
        assert rects["X"].get_x() + rects["X"].get_width() < rects["Y"].get_x()


def test_the_diagram_labels_bytes_and_intensity_from_the_formulas():
    fig = gemm.gemm({"o": (4096, 4096)}, "o", [1, 4096])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "W\n32 MiB" in texts  # 2 x 4096 x 4096 bytes
    assert "X\n8 KiB" in texts and "Y\n8 KiB" in texts  # 2 x 4096 bytes each at M = 1
    assert "I = 1" in texts  # 33,554,432 / 33,570,816 = 0.9995
    assert "I = 1,365" in texts  # 2 M K N / (2 (3 x 4096^2)) = 4096 / 3 at M = 4096


def test_the_bytes_panel_marks_the_crossover_and_the_ridge():
    fig = gemm.gemm({"o": (4096, 4096)}, "o", [1], ridge_M=176.0)
    bottom = fig.axes[-1]
    vertical = sorted(ln.get_xdata()[0] for ln in bottom.lines if len(set(ln.get_xdata())) == 1)
    assert vertical == [176.0, 2048.0]


def test_the_diagram_is_legible_in_the_page_column():
    fig = gemm.gemm(costs.LLAMA3_8B["linears"], "o", [1, 176, 4096], ridge_M=175.7)
    assert glue.figure_png("fig_gemm_shapes", fig)[:8] == b"\x89PNG\r\n\x1a\n"  # refused if under 9 pt


def test_bad_diagram_input_is_refused():
    shapes = {"o": (4096, 4096)}
    with pytest.raises(KeyError, match="'qkv' is not one of"):
        gemm.gemm(shapes, "qkv", [1])
    with pytest.raises(ValueError, match="one to three sizes"):
        gemm.gemm(shapes, "o", [1, 2, 3, 4])
    with pytest.raises(ValueError, match="M must be a positive int"):
        gemm.gemm(shapes, "o", [0])
    with pytest.raises(ValueError, match="ridge must be a positive finite"):
        gemm.gemm(shapes, "o", [1], ridge_M=float("nan"))


# ---------------------------------------------------------------------------- the analysis the step figure draws

def cold_rows(times: dict[str, dict[int, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"layer": layer, "M": m, "GPU time (us)": t} for layer, by_m in times.items()
                         for m, t in by_m.items()])


def test_knee_where_the_flat_time_meets_the_line():
    # flat at 10 us up to M = 16; 0.05 us per token from M = 4096: they meet at M = 10 / 0.05 = 200
    times = pd.Series({1: 9.0, 8: 10.0, 16: 11.0, 256: 14.0, 4096: 204.8, 8192: 409.6})
    assert matrix_shapes.knee(times) == pytest.approx(200.0)


def test_knee_without_large_M_is_nan_and_bad_ranges_are_refused():
    assert math.isnan(matrix_shapes.knee(pd.Series({1: 9.0, 100: 10.0})))
    with pytest.raises(ValueError, match="must end below"):
        matrix_shapes.knee(pd.Series({1: 1.0}), flat_max_M=64, line_min_M=64)
    with pytest.raises(TypeError, match="pandas Series"):
        matrix_shapes.knee([1.0, 2.0])


def test_decode_steps_sum_the_layers_of_every_block():
    cold = cold_rows({"a": {1: 10.0, 4: 12.0, 8: 20.0, 16: 40.0}, "b": {1: 30.0, 4: 28.0, 8: 60.0}})
    d = matrix_shapes.decode_steps(cold, n_layers=2)
    # M = 16 lacks layer b: not a whole step; step = (a + b) x 2 blocks
    assert d.index.tolist() == [1, 4, 8] and d.index.name == "B"
    assert d["step (us)"].tolist() == [80.0, 80.0, 160.0]
    assert d["per token (us)"].tolist() == [80.0, 20.0, 20.0]
    assert d["vs B=1"].tolist() == [1.0, 4.0, 4.0]
    assert matrix_shapes.decode_steps(cold, n_layers=2, max_B=4).index.tolist() == [1, 4]


def test_decode_steps_refuse_bad_input():
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        matrix_shapes.decode_steps(cold_rows({"a": {1: 1.0}}), n_layers=0)
    with pytest.raises(ValueError, match="no points"):
        matrix_shapes.decode_steps(cold_rows({}).reindex(columns=["layer", "M", "GPU time (us)"]), n_layers=32)


def test_the_weights_a_llama_decode_step_reads():
    w = matrix_shapes.weight_bytes(costs.LLAMA3_8B)
    assert w["linear layers"] == 2 * 32 * 4096 * 53_248 == 13_958_643_712  # 53,248 = 6144 + 4096 + 28672 + 14336
    assert w["LM head"] == w["embedding"] == 2 * 4096 * 128_256 == 1_050_673_152
    # the step reads the linear layers and the LM head, not the embedding table it gathers from
    assert w["decode step reads"] == 15_009_316_864
    with pytest.raises(KeyError, match=r"lacks \['vocab'\]"):
        matrix_shapes.weight_bytes({k: v for k, v in costs.LLAMA3_8B.items() if k != "vocab"})


def test_largest_batch_within_a_time():
    step = pd.Series({1: 4000.0, 64: 4100.0, 256: 6000.0, 1024: 19000.0, 2048: 38000.0})
    assert matrix_shapes.largest_within(step, 20_000) == 1024
    assert matrix_shapes.largest_within(step, 6000) == 256  # at most: equal fits
    assert matrix_shapes.largest_within(step, 3000) == 0  # under the weights' read: no batch
    with pytest.raises(ValueError, match="must be positive"):
        matrix_shapes.largest_within(step, 0)


# ---------------------------------------------------------------------------- the step figure

def decode_table():
    cold = cold_rows({"a": {1: 10.0, 64: 11.0, 256: 20.0, 1024: 80.0}})
    return matrix_shapes.decode_steps(cold, n_layers=32)


def test_step_figure_marks_floor_knee_ridge_and_target():
    fig = gemm.step_and_cost(decode_table(), knee_B=200.0, ridge_B=176.0, floor_us=300.0, target_us=2000.0)
    top, bottom = fig.axes
    assert top.lines[0].get_ydata().tolist() == [0.32, 0.352, 0.64, 2.56]  # 32 x 10 us = 0.32 ms, ...
    assert bottom.lines[0].get_ydata().tolist() == [320.0, 5.5, 2.5, 2.5]  # step over B, in us
    horizontal = sorted(ln.get_ydata()[0] for ln in top.lines if len(set(ln.get_ydata())) == 1 and len(ln.get_ydata()) == 2)
    assert horizontal == [0.3, 2.0]  # the floor and the target, in ms
    for ax in (top, bottom):
        vertical = sorted(ln.get_xdata()[0] for ln in ax.lines if len(set(ln.get_xdata())) == 1)
        assert vertical == [176.0, 200.0]
    assert glue.figure_png("fig_decode_step", fig)[:4] == b"\x89PNG"


def test_step_figure_without_a_knee_and_with_bad_input():
    fig = gemm.step_and_cost(decode_table(), knee_B=float("nan"), ridge_B=176.0, floor_us=300.0)
    vertical = [ln.get_xdata()[0] for ln in fig.axes[0].lines if len(set(ln.get_xdata())) == 1]
    assert vertical == [176.0]
    with pytest.raises(KeyError, match="lacks 'per token"):
        gemm.step_and_cost(decode_table()[["step (us)"]], 200.0, 176.0, 300.0)
    with pytest.raises(ValueError, match="floor_us must be a positive finite"):
        gemm.step_and_cost(decode_table(), 200.0, 176.0, 0.0)
