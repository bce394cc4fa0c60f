"""lib.bench.plots and lib.bench.glue: the shared style's helpers, and what glue accepts."""

import matplotlib.pyplot as plt
import pytest

from lib.bench import glue, plots
from lib.bench.results import Result


@pytest.mark.parametrize(
    "n, text", [(512, "512 B"), (1024, "1 KiB"), (1 << 20, "1 MiB"), (3 << 29, "1.5 GiB"), (4 << 30, "4 GiB")]
)
def test_human_bytes(n, text):
    assert plots.human_bytes(n) == text


def test_labels_need_units():
    with pytest.raises(ValueError, match="no unit"):
        plots.figure("t", "size", "time (us)")
    fig, ax = plots.figure("t", "size (bytes)", "time (us)", logx=True)
    assert ax.get_xscale() == "log"
    plt.close(fig)


def test_caption_names_device_date_and_method():
    r = Result({}, {}, {"name": "NVIDIA H200", "date": "2026-11-30T01:02:03Z", "torch": "2.11.0"}, None, True)
    assert plots.caption(r, "median of 30") == "NVIDIA H200, 2026-11-30, torch 2.11.0: median of 30"


def test_glue_accepts_numbers_and_words_only(capsys, monkeypatch):
    pasted = []
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.append((name, value)))
    glue.number("x_us", 3)
    glue.number("ratio", float("nan"))
    glue.text("device_name", "NVIDIA H200")
    assert pasted[0] == ("x_us", 3.0) and isinstance(pasted[0][1], float)
    assert pasted[1][0] == "ratio" and pasted[1][1] != pasted[1][1]
    assert pasted[2] == ("device_name", "NVIDIA H200")
    monkeypatch.undo()
    with pytest.raises(TypeError):
        glue.number("flag", True)
    with pytest.raises(TypeError):
        glue.number("s", "85%")
    with pytest.raises(TypeError):
        glue.text("empty", " ")
    with pytest.raises(ValueError, match="identifier"):
        glue.number("not a name", 1.0)


def test_glue_tables_of_numbers_and_texts(monkeypatch):
    pasted = []
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.append((name, value)))
    glue.numbers({"a_us": 1, "b": 2.5})
    glue.texts({"device_name": "NVIDIA H200"})
    assert pasted == [("a_us", 1.0), ("b", 2.5), ("device_name", "NVIDIA H200")]
    with pytest.raises(TypeError):
        glue.numbers({"flag": True})


def test_a_page_publishes_its_numbers_texts_and_tables_by_name(monkeypatch):
    import pandas as pd

    pasted = []
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.append((name, value)))
    page = glue.Page({"x_ms": 2}, {"device_name": "H200"}).merged(glue.Page(tables={"t": pd.DataFrame({"a": [1]})}))
    glue.publish(page)
    assert [n for n, _ in pasted] == ["x_ms", "device_name", "t"]
    assert pasted[0][1] == 2.0 and isinstance(pasted[2][1], glue.Table)
    with pytest.raises(ValueError, match="once"):
        glue.Page({"x": 1}, {"x": "one"})
    with pytest.raises(ValueError, match="both pages"):
        page.merged(glue.Page({"x_ms": 3}))
    with pytest.raises(TypeError, match="Page"):
        glue.publish({"x_ms": 2})


def test_a_legible_figure_is_glued_as_the_png_the_page_shows(monkeypatch):
    import io

    from PIL import Image

    pasted = {}
    monkeypatch.setattr(glue, "_paste", lambda name, value: pasted.__setitem__(name, value))
    fig, ax = plots.figure("A title", "bytes (B)", "time (us)", logx=True)
    ax.plot([1, 1000, 1e6], [1, 2, 3])
    plots.plain_axes(fig)
    glue.figure("fig_ok", fig)
    png = pasted["fig_ok"].data
    with Image.open(io.BytesIO(png)) as im:
        font, dpi = float(im.text[glue.PNG_FONT_KEY]), float(im.text[glue.PNG_DPI_KEY])
        width = im.size[0]
    assert font >= 9.0 and dpi == glue.DPI
    assert glue.shown_pt(font, dpi, width, min(width, glue.COLUMN_PX)) >= glue.MIN_SHOWN_PT


def test_small_text_and_powers_on_ticks_are_refused():
    fig, ax = plots.figure("A title", "bytes (B)", "time (us)")
    ax.plot([1, 2], [1, 2])
    ax.set_xlabel("bytes (B)", fontsize=6)
    with pytest.raises(ValueError, match="would be shown at .* under 9 pt"):
        glue.figure_png("fig_small", fig)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(plots.WIDTH_IN, 4))
    ax.set_xscale("log")
    ax.plot([1, 10, 1e4], [1, 2, 3])
    ax.set_xlabel("x (B)")
    with pytest.raises(ValueError, match="print as powers"):
        glue.figure_png("fig_powers", fig)
    plots.plain_log(ax, "x")
    glue.figure_png("fig_plain", fig)  # labelled plainly, it passes


def test_a_wide_figure_is_shrunk_and_refused():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14.0, 4.0))  # twice the column: its 10 pt text shown near 5.7 pt
    ax.plot([1, 2], [1, 2])
    with pytest.raises(ValueError, match="under 9 pt"):
        glue.figure_png("fig_wide", fig)


def test_plain_tick_labels():
    assert [plots.plain_number(v, 2) for v in (1, 16, 1024, 4096, 65536, 1 << 20)] == \
        ["1", "16", "1k", "4k", "64k", "1M"]
    assert [plots.plain_number(v) for v in (0.5, 5, 1000, 2500, 1e6)] == ["0.5", "5", "1k", "2.5k", "1M"]


def test_a_table_prints_clean():
    import pandas as pd

    frame = pd.DataFrame({"B": [1.0, 32.0], "t (us)": [3.14159, float("nan")], "ok": [True, False]},
                         index=pd.Index(["a", "b"], name="case"))
    table = glue.Table(frame)
    assert list(table.frame.columns) == ["case", "B", "t (us)", "ok"]  # a named index becomes a column
    assert table.frame.values.tolist() == [["a", "1", "3.142", "yes"], ["b", "32", "–", "no"]]
    html = table._repr_html_()
    assert "book-table-scroll" in html and "<th></th>" not in html and "nan" not in html.lower()
    unnamed = glue.Table(pd.DataFrame({"x": [1, 2]}, index=[7, 8]))
    assert unnamed.frame.values.tolist() == [["1"], ["2"]]  # an unnamed index is dropped
    with pytest.raises(TypeError, match="DataFrame"):
        glue.Table([1, 2])


def test_large_and_small_numbers_print_without_exponents_where_they_can():
    assert [glue.Table.cell(v) for v in (14870.4, 34060.0, 9727.3, 0.0003476, 2.5e-07, -12345.6)] == \
        ["14870", "34060", "9727", "0.0003476", "2.5e-07", "-12346"]
