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

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==")
GOOD = """<!doctype html><html><body>
<h1 id="top">Good</h1><p>See <a href="#fig-a">the figure</a> and <a href="other.html#sec">the other page</a>.</p>
<figure id="fig-a"><img src="../img/dot.png"><figcaption>A dot measured on nothing at all, for the test.</figcaption></figure>
<pre>$not math, in code$ \\frac{a}{b}</pre>
</body></html>"""
OTHER = """<!doctype html><html><body><h2 id="sec">Other</h2><p>Plain text, 5 $ and 7 $ apart is fine.</p></body></html>"""
BAD = """<!doctype html><html><body>
<p>raw $x^2$ and \\(y\\) left as text</p>
<img src="missing.png">
<a href="nowhere.html">gone</a> <a href="good.html#nope">no anchor</a>
<span class="xref std std-ref">lost-label</span>
<p>{glue:text}`../notebooks/x.ipynb::copy_bw_GBps:.0f`</p>
<figure id="fig-b"><img src="../img/dot.png"><figcaption>A caption long enough but never referenced.</figcaption></figure>
<table class="dataframe"><tr><td>1</td></tr></table>
<script>throw new Error("boom");</script>
</body></html>"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "img").mkdir()
    (root / "img" / "dot.png").write_bytes(PNG)
    (root / "book").mkdir()
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
    assert shots == ["book__bad.png", "book__good.png", "book__other.png"]
    assert all((tmp_path / s).stat().st_size > 1000 for s in shots)
