"""Numbers, words and figures handed from a notebook to the book's prose (myst-nb glue).

A page never types a measured number: it pastes a glued one, for example
{glue:text}`../notebooks/00-the-machine.ipynb::copy_bw_GBps:.0f`. Numbers are glued as plain
Python floats (a ratio as 0.85, not "85%"), in the unit their name says (``_us``, ``_GBps``).
Words (a device name, a date) are glued as strings and pasted the same way, with {glue:text}.

Chapters: all.
"""

from __future__ import annotations

from numbers import Real

from lib.bench.page import Page


def number(name: str, value) -> None:
    """Glue a number under ``name`` as a float (not displayed here).

    NaN is allowed (a smoke run may lack the sizes a quantity needs) and shows as "nan"; the
    chapter's claims fail on it, so the reference set can never carry one into the book.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"glue {name!r}: expected a real number, got {type(value).__name__} {value!r}")
    _paste(name, float(value))


def numbers(values: dict) -> None:
    """Glue every number of a table {name: value}: how a notebook hands its numbers to the page, as data."""
    for name, value in values.items():
        number(name, value)


def texts(values: dict) -> None:
    """Glue every text of a table {name: words}."""
    for name, words in values.items():
        text(name, words)


def text(name: str, words: str) -> None:
    """Glue a short text (a device name, a date), pasted with {glue:text}."""
    if not isinstance(words, str) or not words.strip():
        raise TypeError(f"glue {name!r}: expected a non-empty string, got {words!r}")
    _paste(name, words)


# How a figure is shown: a figure's image is at most COLUMN_PX CSS pixels wide (the page column of
# sphinx-book-theme in a 1280-pixel window, inside a figure's margins); a wider image is scaled down, and its
# text with it. A CSS pixel is 1/96 inch, so text keeps its size in an image up to 7 inches wide.
COLUMN_PX = 672
MIN_SHOWN_PT = 9.0
DPI = 110
# the PNG text keys that carry a figure's smallest font and dpi to the site check (tools/site/check_html.py)
PNG_FONT_KEY = "book-min-font-pt"
PNG_DPI_KEY = "book-dpi"


def shown_pt(font_pt: float, dpi: float, natural_px: float, shown_px: float) -> float:
    """The size in points at which ``font_pt`` text of a ``dpi`` PNG ``natural_px`` wide is seen when the
    page shows the image ``shown_px`` CSS pixels wide: one point is dpi/72 image pixels, 96/72 CSS pixels."""
    return font_pt * (dpi / 96.0) * (shown_px / natural_px)


def figure_text(fig) -> tuple[float, list[str]]:
    """(smallest font size in points of any visible text, tick labels printed with exponents)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    sizes, exponents = [], []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and t.get_figure() is not None:
            sizes.append(t.get_fontsize())
    for ax in fig.axes:
        for label in ax.get_xticklabels(which="both") + ax.get_yticklabels(which="both"):
            s = label.get_text()
            if label.get_visible() and ("^{" in s or "\\times" in s or "times10" in s.replace(" ", "")):
                exponents.append(s)
    return (min(sizes) if sizes else float("inf")), exponents


def figure_png(name: str, fig) -> bytes:
    """The PNG a page shows for ``fig``, after checking that it is legible in the page column.

    Refuses (ValueError) a figure whose smallest text would be shown under ``MIN_SHOWN_PT`` points, or
    whose tick labels print as powers (4x10^3): the reader cannot read them. The PNG carries its smallest
    font size and dpi as text entries, so that the site check can recompute the shown size from the
    width the browser really gives the image.
    """
    import io
    import struct

    smallest, exponents = figure_text(fig)
    if exponents:
        raise ValueError(f"figure {name!r}: tick labels {exponents[:3]} print as powers; label the log axis "
                         f"with lib.bench.plots.plain_log(ax) (plots.finish does it for every log axis)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight",
                metadata={PNG_FONT_KEY: f"{smallest:.2f}", PNG_DPI_KEY: str(DPI)})
    png = buf.getvalue()
    width = struct.unpack(">I", png[16:20])[0]  # the IHDR chunk's width
    shown = shown_pt(smallest, DPI, width, min(width, COLUMN_PX))
    if shown < MIN_SHOWN_PT:
        raise ValueError(f"figure {name!r}: its smallest text ({smallest:.1f} pt in a {width}-pixel-wide image) "
                         f"would be shown at {shown:.1f} pt in the {COLUMN_PX}-pixel page column, under "
                         f"{MIN_SHOWN_PT:.0f} pt; stack panels in rows (plots.figure(panels=k)), keep the "
                         f"figure's image under {COLUMN_PX / 96:.1f} inches wide, or enlarge its smallest text")
    return png


def figure(name: str, fig) -> None:
    """Glue a matplotlib figure as the PNG the page shows ({glue:figure} with its :doc: option),
    once ``figure_png`` has found it legible; the notebook shows the same PNG, and the figure is closed.

    The notebook's own page must show the very bytes the chapter pastes: the site's image file is
    written when the notebook page renders it (a pasted image names the file by its content's hash)."""
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    image = Image(data=figure_png(name, fig), format="png")
    _paste(name, image)
    plt.close(fig)  # or the notebook would also show its own rendering, with other bytes
    display(image)


class Table:
    """A results table as a page shows it: no index column, integers as integers, "–" where a cell has
    no value (NaN), numbers to four significant digits (whole units from 10,000 up, never an exponent);
    wide tables scroll inside the column."""

    NA = "–"

    def __init__(self, frame):
        self.frame = self.tidy(frame)

    @classmethod
    def tidy(cls, frame):
        import pandas as pd

        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"a table is a pandas DataFrame, got {type(frame).__name__}")
        df = frame.copy()
        if any(n is not None for n in df.index.names):  # a named index is data: make it columns
            df = df.reset_index()
        df = df.reset_index(drop=True)
        out = {}
        for col in df.columns:
            out[str(col)] = [cls.cell(v) for v in df[col].tolist()]
        return pd.DataFrame(out)

    @classmethod
    def cell(cls, v) -> str:
        import math as _m
        from numbers import Integral

        if v is None or (isinstance(v, float) and _m.isnan(v)):
            return cls.NA
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, Integral):
            return f"{int(v)}"
        if isinstance(v, Real):
            f = float(v)
            if _m.isinf(f):
                return "∞" if f > 0 else "-∞"
            if f == int(f) and abs(f) < 1e15:
                return f"{int(f)}"
            if abs(f) >= 1e4:  # four significant digits would print 1.487e+04: whole units read better
                return f"{round(f)}"
            return f"{f:.4g}"
        return str(v)

    def _repr_html_(self) -> str:
        html = self.frame.to_html(index=False, escape=True, classes="book-table", border=0)
        return f'<div class="book-table-scroll">{html}</div>'

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)


def table(name: str, frame) -> None:
    """Glue a pandas DataFrame (a claims table, a summary) as a clean ``Table``; a page shows it with
    {glue:figure} and a :name: starting ``tab-``, numbered "Table N"."""
    _paste(name, Table(frame))


def publish(page: Page) -> None:
    """Glue every number, text and table of ``page`` (a ``lib.bench.page.Page``)."""
    if not isinstance(page, Page):
        raise TypeError(f"publish takes a glue.Page, got {type(page).__name__}")
    numbers(page.numbers)
    texts(page.texts)
    for name, frame in page.tables.items():
        table(name, frame)


def _paste(name: str, value) -> None:
    from myst_nb import glue

    if not name.isidentifier():
        raise ValueError(f"glue name {name!r} must be an identifier such as copy_bw_GBps")
    glue(name, value, display=False)
