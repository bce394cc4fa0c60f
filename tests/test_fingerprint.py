"""lib.bench.fingerprint on the book itself: each chapter's measuring code is its import closure, computed.

A copy of the book's lib/ and notebooks/ gets a fresh results record for every chapter (the fingerprint of
the code as it is, no measurement); then one module is edited and `check-fresh` must name exactly the
chapters whose measure cells reach that module through their imports.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from lib.bench import fingerprint, results
from tests.conftest import ROOT

CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A copy of lib/ and notebooks/ with a fresh (unmeasured) record per chapter under results/cpu/."""
    root = tmp_path_factory.mktemp("book")
    shutil.copytree(ROOT / "lib", root / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".*"))
    for nb in CHAPTERS:
        results.write(results.path_for(nb, "cpu", root / "results"), {
            "schema": results.SCHEMA, "notebook": nb, "params": {"size": "smoke"},
            "code": fingerprint.fingerprint(nb, root), "data": {},
            "provenance": {"name": "cpu", "kind": "cpu", "slug": "cpu", "date": "2026-01-01T00:00:00Z"}})
    return root


def stale_chapters(root):
    return sorted(p.stem for p, _ in results.stale_results(root / "results", root))


def edited(path, old, new):
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test"
    path.write_text(text.replace(old, new, 1))
    return text


def test_the_closure_is_found_from_the_imports(book):
    fp = fingerprint.fingerprint("05-prefix-caching", book)
    assert "lib/kv_pool.py" in fp["sources"]  # reached through lib.models, never named by the notebook
    assert "lib/bench/results.py" not in fp["sources"] and "lib/bench/glue.py" not in fp["sources"]
    assert "lib/kv_pool.py" not in fingerprint.fingerprint("03-kv-cache", book)["sources"]


def test_a_code_edit_in_kv_pool_makes_chapters_5_to_10_stale(book):
    assert stale_chapters(book) == []
    pool = book / "lib" / "kv_pool.py"
    original = edited(pool, "        return -(-tokens // self.block_size)\n",
                      "        return (tokens + self.block_size - 1) // self.block_size\n")
    try:
        # chapters 9 and 10 time chapter 7's step (quantized, or one rank's share): the pool is in their closure too
        assert stale_chapters(book) == ["05-prefix-caching", "06-batching", "07-decode-step", "08-serving-engine",
                                        "09-quantization", "10-parallelism"]
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "book.py"), "check-fresh", "--root", str(book)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stdout.count("stale:") == 6 and "lib/kv_pool.py changed" in out.stdout
    finally:
        pool.write_text(original)
    assert stale_chapters(book) == []


def test_a_docstring_or_comment_edit_makes_nothing_stale(book):
    pool = book / "lib" / "kv_pool.py"
    original = edited(pool, '"""A paged KV pool', '"""A paged key-value pool (docstrings never count)')
    pool.write_text(pool.read_text().replace("    def allocate(", "    # a comment line\n    def allocate(", 1))
    try:
        assert stale_chapters(book) == []
    finally:
        pool.write_text(original)


def test_a_new_import_joins_the_closure(book):
    pool = book / "lib" / "kv_pool.py"
    original = edited(pool, "import torch\n", "import torch\n\nfrom lib import workloads  # noqa: F401\n")
    try:
        reasons = dict(results.stale_results(book / "results", book))
        stale = {p.stem: r for p, r in reasons.items()}
        assert sorted(stale) == ["05-prefix-caching", "06-batching", "07-decode-step", "08-serving-engine",
                                 "09-quantization", "10-parallelism"]
        assert "lib/workloads.py is new to the measuring code" in stale["06-batching"]
    finally:
        pool.write_text(original)


def test_an_experiment_counts_only_what_its_measure_reaches(tmp_path):
    """The measure cell uses exp.measure: an analysis function of the same module may change freely, the
    helper measure calls may not, and an import only the analysis uses is not followed."""
    from tests.conftest import make_notebook

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "timer.py").write_text("def now():\n    return 0\n")
    (tmp_path / "lib" / "tables.py").write_text("def table(d):\n    return d\n")
    exp = tmp_path / "lib" / "exp.py"
    exp.write_text("from lib import tables, timer\n\nN = 3\n\n\ndef _one(i):\n    return timer.now() + i\n\n\n"
                   "def measure(p, device):\n    return [_one(i) for i in range(N)]\n\n\n"
                   "def analysis(data):\n    return tables.table(data)\n")
    make_notebook(tmp_path / "notebooks" / "x.ipynb", "res = exp.measure({}, 'cpu')\n", imports="from lib import exp\n")
    fp = fingerprint.fingerprint("x", tmp_path)
    assert fp["roots"] == {"lib.exp": ["measure"]}
    assert set(fp["sources"]) == {"notebooks/x.ipynb#measure", "lib/__init__.py", "lib/exp.py", "lib/timer.py"}
    text = exp.read_text()
    exp.write_text(text.replace("return tables.table(data)", "return tables.table(data) * 2"))
    assert fingerprint.changes(fp, fingerprint.fingerprint("x", tmp_path)) == []
    exp.write_text(text.replace("return timer.now() + i", "return timer.now() + 2 * i"))
    assert fingerprint.changes(fp, fingerprint.fingerprint("x", tmp_path)) == ["lib/exp.py changed"]
    exp.write_text(text.replace("N = 3", "N = 4"))
    assert fingerprint.changes(fp, fingerprint.fingerprint("x", tmp_path)) == ["lib/exp.py changed"]
    exp.write_text(text)
    make_notebook(tmp_path / "notebooks" / "x.ipynb", "res = exp\n", imports="from lib import exp\n")
    assert "lib/tables.py" in fingerprint.fingerprint("x", tmp_path)["sources"]  # the module itself: all of it


def test_code_only_drops_documentation_and_keeps_code():
    src = '"""Module doc."""\n\nX = 1  # trailing\n# whole line\n\ndef f():\n    """Doc."""\n    return "# not a comment"\n'
    assert fingerprint.code_only(src) == 'X = 1\ndef f():\n    return "# not a comment"'
    assert fingerprint.code_only("def broken(:\n") == "def broken(:\n"  # text that does not parse stays whole


def test_a_misspelled_module_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="has no file"):
        fingerprint.closure(["lib.nope"], tmp_path)
