"""lib.diagrams.roofline (chapter 2): the operators placed on the roofline from their formulas."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from lib.bench import glue  # noqa: E402
from lib.diagrams import roofline as diagram  # noqa: E402
from lib.experiments import roofline  # noqa: E402

C = {"bf16_tflops": 800.0, "read_bw_GBps": 4000.0, "copy_bw_GBps": 3200.0}


@pytest.fixture(scope="module")
def drawn():
    ops = roofline.intensities(roofline.sweep("full"), [1, 16, 256, 4096])
    return ops, diagram.operators(C, ops, device="Test GPU")


def test_roofs_bend_at_the_ridges():
    """min(P, BW I): at 4 TB/s the roof reaches 800 TFLOP/s at I* = 200 FLOP/byte, at 3.2 TB/s at 250."""
    assert diagram.attainable(100, 800, 4000) == pytest.approx(400)
    assert diagram.attainable(200, 800, 4000) == pytest.approx(800)
    assert diagram.attainable(10_000, 800, 3200) == pytest.approx(800)
    assert diagram.attainable(250, 800, 3200) == pytest.approx(800) and diagram.attainable(125, 800, 3200) == pytest.approx(400)
    with pytest.raises(ValueError, match="positive rate and bandwidth"):
        diagram.attainable(1, 0, 4000)


def test_every_operator_with_arithmetic_sits_on_its_roof(drawn):
    ops, fig = drawn
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    for fam in ("linear layers", "add", "rmsnorm", "softmax", "prefill attention", "decode attention"):
        assert fam in labels
    assert fig.book_left_out == ["embedding"]  # F = 0: no place on a log axis
    marked = {line.get_label(): line for line in ax.get_lines() if line.get_marker() not in ("None", "", None)}
    dec = marked["decode attention"]
    rows = ops[ops["family"] == "decode attention"].sort_values("I (FLOP/byte)")
    assert list(dec.get_xdata()) == pytest.approx(list(rows["I (FLOP/byte)"]))
    assert list(dec.get_ydata()) == pytest.approx([4000 * i / 1e3 for i in rows["I (FLOP/byte)"]])  # the read roof
    pre = marked["prefill attention"]
    assert max(pre.get_ydata()) == pytest.approx(800)  # compute-bound: on the flat roof
    shapes = [line.get_marker() for line in marked.values()]
    assert len(shapes) == len(set(shapes))  # every operator its own marker shape
    assert all(line.get_color() not in ("0.5", "C7", "#7f7f7f") for line in marked.values())  # none grey


def test_the_figure_is_legible_in_the_page(drawn):
    _, fig = drawn
    glue.figure_png("fig_test", fig)  # raises under 9 pt or with 2^{k} tick labels


def test_bad_input_is_refused():
    ops = roofline.intensities(roofline.sweep("smoke"), [1])
    with pytest.raises(ValueError, match="ceilings lack positive values"):
        diagram.operators({**C, "read_bw_GBps": 0}, ops, device="x")
    with pytest.raises(KeyError, match="lacks"):
        diagram.operators(C, ops.drop(columns="rate"), device="x")
    with pytest.raises(ValueError, match="no style"):
        diagram.style("gelu")
