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
    assert "copy_bw_GBps" not in page
    # math is served by the site itself (a pinned MathJax), never from the network
    assert (html / "_static" / "mathjax" / "tex-mml-chtml.js").exists()
    assert 'src="../_static/mathjax/tex-mml-chtml.js' in page and "cdn.jsdelivr" not in page
    status = (html / "book" / "status.html").read_text()
    assert "claims hold" in status and "NVIDIA H200" in status
