"""tools/site/check_html.py in headless Chromium, on a small site with one good page and one of every fault.

`make test` installs Debian's Chromium first and sets BOOK_REQUIRE_BROWSER, so these run in CI; a
machine without Chromium skips them otherwise.
"""

import base64
import os
from pathlib import Path

import pytest

from tools.site import check_html

if not Path(check_html.CHROMIUM).exists():
    if os.environ.get("BOOK_REQUIRE_BROWSER"):
        raise RuntimeError(f"{check_html.CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    pytest.skip(f"{check_html.CHROMIUM} is not installed", allow_module_level=True)

def png(width: int, font_pt: float | None, dpi: float = 110.0) -> bytes:
    """A blank PNG ``width`` pixels wide that records (or not) its smallest font as glue.figure does."""
    import io

    from PIL import Image, PngImagePlugin

    from lib.bench import glue

    info = PngImagePlugin.PngInfo()
    if font_pt is not None:
        info.add_text(glue.PNG_FONT_KEY, f"{font_pt}")
        info.add_text(glue.PNG_DPI_KEY, f"{dpi}")
    buf = io.BytesIO()
    Image.new("RGB", (width, 40), "white").save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==")
GOOD = """<!doctype html><html><body>
<h1 id="top">Good</h1><p>See <a href="#fig-a">the figure</a> and <a href="other.html#sec">the other page</a>.</p>
<figure id="fig-a"><img src="../img/legible.png"><figcaption>A dot measured on nothing at all, for the test.</figcaption></figure>
<pre>$not math, in code$ \\frac{a}{b}</pre>
</body></html>"""
CHAPTER_GOOD = """<!doctype html><html><body><h1 id="c">Chapter</h1>
<div class="admonition key-takeaways"><p>Key takeaways</p><ul><li>one</li></ul></div>
<div class="exercise admonition" id="ex-1"><p>one</p></div><div class="solution admonition" id="s1"><p>a</p></div>
<div class="exercise admonition" id="ex-2"><p>two</p></div><div class="solution admonition" id="s2"><p>a</p></div>
<div class="exercise admonition" id="ex-3"><p>three</p></div><div class="solution admonition" id="s3"><p>a</p></div>
<section id="references"><h2>References</h2><div class="citation" role="doc-biblioentry">A paper.</div></section>
</body></html>"""
CHAPTER_BAD = """<!doctype html><html><body><h1 id="c">Chapter</h1>
<div class="exercise admonition" id="ex-1"><p>one</p></div>
</body></html>"""
OTHER = """<!doctype html><html><body><h2 id="sec">Other</h2><p>Plain text, 5 $ and 7 $ apart is fine.</p></body></html>"""
BAD = """<!doctype html><html><head><style>img { max-width: 100%; }</style></head><body>
<p>raw $x^2$ and \\(y\\) left as text</p>
<img src="missing.png">
<a href="nowhere.html">gone</a> <a href="good.html#nope">no anchor</a>
<span class="xref std std-ref">lost-label</span>
<p>{glue:text}`../notebooks/x.ipynb::copy_bw_GBps:.0f`</p>
<figure id="fig-b"><img src="../img/dot.png"><figcaption>A caption long enough but never referenced.</figcaption></figure>
<table class="dataframe"><tr><td>1</td></tr></table>
<p>See <a href="#tab-c">the table</a>, <a href="#fig-tiny">the tiny figure</a>, <a href="#fig-plain">the plain one</a>.</p>
<figure id="tab-c"><table class="book-table"><tr><td>nan</td><td>32.0</td><td>7</td></tr></table>
<figcaption>Fig. 3 A table of results that the page numbers as a figure.</figcaption></figure>
<figure id="fig-tiny"><img src="../img/tiny.png"><figcaption>A figure whose text is far too small to read.</figcaption></figure>
<figure id="fig-plain"><img src="../img/dot.png"><figcaption>A figure that does not record its font size.</figcaption></figure>
<script>throw new Error("boom");</script>
</body></html>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "img").mkdir()
    (root / "img" / "dot.png").write_bytes(PNG)
    (root / "img" / "legible.png").write_bytes(png(700, 9.0))  # 9 pt at 110 dpi shown at its width: 10.3 pt
    (root / "img" / "tiny.png").write_bytes(png(2400, 9.0))  # shown at most 1280 pixels wide: under 6 pt
    (root / "book").mkdir()
    (root / "book" / "07-good.html").write_text(CHAPTER_GOOD)
    (root / "book" / "08-bad.html").write_text(CHAPTER_BAD)
    (root / "book" / "good.html").write_text(GOOD)
    (root / "book" / "other.html").write_text(OTHER)
    (root / "book" / "bad.html").write_text(BAD)
    (root / "index.html").write_text('<html><head><meta http-equiv="refresh" content="0; url=book/good.html">'
                                     '</head></html>')
    return root


@pytest.fixture(scope="module")
def found(site, tmp_path_factory):
    return check_html.check_site(site, tmp_path_factory.mktemp("shots"), log=lambda *a: None)


def test_good_pages_pass(found):
    assert found["book/good.html"] == [] and found["book/other.html"] == [] and found["index.html"] == []
    assert found["book/07-good.html"] == []


def test_a_chapter_page_needs_takeaways_exercises_and_references(found):
    bad = "\n".join(found["book/08-bad.html"])
    for fault in ["without a 'Key takeaways' box", "chapter with 1 exercises (at least 3",
                  "1 exercise(s) without a solution", "without a references section"]:
        assert fault in bad, f"{fault!r} not reported in:\n{bad}"
    assert not any("Key takeaways" in p for p in found["book/good.html"])  # only chapter pages (book/NN-...)


def test_legibility_of_figures_and_tables(found):
    bad = "\n".join(found["book/bad.html"])
    for fault in ["table 'tab-c' is numbered as a figure", "table cell prints 'nan'", "table cell prints '32.0'",
                  "figure 'fig-tiny': its smallest text is shown at", "figure 'fig-plain': its image does not record"]:
        assert fault in bad, f"{fault!r} not reported in:\n{bad}"
    assert "'7'" not in bad and "fig-a" not in bad


def test_shown_size_of_a_figure_font():
    from lib.bench import glue

    # 9 pt at 110 dpi is 13.75 image pixels; shown at the image's own width that is 13.75 CSS pixels = 10.3 pt
    assert abs(glue.shown_pt(9.0, 110.0, 770, 770) - 10.3125) < 1e-9
    # halved in width, the text is halved too
    assert abs(glue.shown_pt(9.0, 110.0, 1540, 770) - 5.15625) < 1e-9


def test_every_fault_is_reported(found):
    bad = "\n".join(found["book/bad.html"])
    for fault in ["raw TeX in the text: 'raw $x^2$", "image did not load: missing.png", "broken link: book/nowhere.html",
                  "broken link: book/good.html#nope (no such anchor)", "unresolved cross-reference: 'lost-label'",
                  "unresolved glue or output left as text", "figure 'fig-b' is not referenced from the page",
                  "1 table(s) of results outside a captioned figure", "JavaScript error: boom"]:
        assert fault in bad, f"{fault!r} not reported in:\n{bad}"
    assert "[file]" in bad and "[http]" in bad  # both ways of opening the site


def test_screenshots_of_every_page(site, tmp_path):
    check_html.check_site(site, tmp_path, file_too=False, log=lambda *a: None)
    shots = sorted(p.name for p in tmp_path.glob("*.png"))
    assert shots == ["book__07-good.png", "book__08-bad.png", "book__bad.png", "book__good.png", "book__other.png"]
    assert all((tmp_path / s).stat().st_size > 1000 for s in shots)
