"""The book builds with warnings as errors (a missing glue key or a broken reference fails)."""

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_book_builds_without_warnings(tmp_path):
    jb = Path(sys.executable).parent / "jupyter-book"
    proc = subprocess.run(
        [str(jb), "build", str(ROOT), "--path-output", str(tmp_path), "-W", "-n", "--keep-going"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    html = tmp_path / "_build" / "html"
    page = (html / "book" / "00-the-machine.html").read_text()
    assert (html / "index.html").exists() and (html / "notebooks" / "00-the-machine.html").exists()
    assert "IPython.core.display" not in page  # every glued value rendered as text
    assert "::copy_bw_GBps" not in page and "{glue" not in page  # no glue role left unresolved
    # math is served by the site itself (a pinned MathJax), never from the network
    assert (html / "_static" / "mathjax" / "tex-mml-chtml.js").exists()
    assert 'src="../_static/mathjax/tex-mml-chtml.js' in page and "cdn.jsdelivr" not in page
    status = (html / "book" / "status.html").read_text()
    assert "claims hold" in status and "NVIDIA H200" in status
    # tables are numbered apart from figures, and a chapter's exercises and references are on its page
    ch3 = (html / "book" / "03-kv-cache.html").read_text()
    assert "Table 1" in ch3 and 'class="exercise' in ch3 and "footnote" in ch3


def test_every_chapter_page_is_within_the_word_limit():
    from tools.site import wordcount

    pages = sorted((ROOT / "book").glob("[0-9][0-9]-*.md"))
    assert len(pages) >= 7
    counts = {p.name: wordcount.count(p.read_text()) for p in pages}
    assert max(counts.values()) <= wordcount.LIMIT, {k: v for k, v in counts.items() if v > wordcount.LIMIT}


def test_the_word_count_reads_prose_only():
    from tools.site import wordcount

    page = """---
jupytext: x
---
# The title

Two words {glue:text}`../notebooks/x.ipynb::a:.0f` and $x^2 + y$ and `code here`.

```{glue:figure} fig_a
:doc: ../notebooks/x.ipynb
:name: fig-a

A caption of five words.
```

```python
not counted at all
```

| a | b |
|---|---|
| 1 | 2 |

:::{exercise}
:label: ex-1

Ask one thing.
:::
<!-- a comment is not prose -->
"""
    # "The title" 2; "Two words X and X and X." 7 (a glued value, math, inline code: one word each);
    # the caption 5; the exercise 3; the options, code, table, front matter and comment none
    assert wordcount.count(page) == 17
