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
