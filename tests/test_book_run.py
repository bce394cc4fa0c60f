"""tools/book.py runs a notebook into a copy: only a run that reaches the end replaces the notebook."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import book  # noqa: E402


def notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def outputs(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in nb.cells]


def test_a_run_that_ends_writes_its_outputs(tmp_path):
    nb = notebook(tmp_path / "ok.ipynb", "print(6 * 7)")
    book.execute(nb, nb, {}, failed_dir=tmp_path / "failed")
    assert outputs(nb) == ["42\n"]
    assert not list(tmp_path.glob(".*")), "the hidden running copy is left behind"
    assert not (tmp_path / "failed").exists()


def test_a_failed_run_leaves_the_notebook_as_it_was(tmp_path):
    nb = notebook(tmp_path / "bad.ipynb", "print('first')", "x = 1")
    book.execute(nb, nb, {}, failed_dir=tmp_path / "failed")  # a run that ends: its outputs are kept
    edited = nbformat.read(nb, as_version=4)
    edited.cells[1].source = "raise RuntimeError('cell two fails')"
    nbformat.write(edited, nb)
    before = nb.read_text()
    with pytest.raises(Exception, match="cell two fails"):
        book.execute(nb, nb, {}, failed_dir=tmp_path / "failed")
    assert nb.read_text() == before
    assert outputs(nb) == ["first\n", ""]
    failed = nbformat.read(tmp_path / "failed" / "bad.ipynb", as_version=4)
    assert any("cell two fails" in str(c.get("outputs", "")) for c in failed.cells)
    assert not list(tmp_path.glob(".*")), "the hidden running copy is left behind"


def test_measuring_without_a_gpu_is_refused_unless_the_cpu_is_asked_for(monkeypatch, capsys, tmp_path):
    ran = []
    for var in (book.results.MODE_ENV, "PYTHONPATH"):  # run() sets them: restored after the test
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(book, "_has_cuda", lambda: False)
    monkeypatch.setattr(book, "execute", lambda *a, **k: ran.append(a))
    assert book.main(["run", "00-the-machine", "--mode", "measure"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err and ran == []
    assert book.main(["run", "00-the-machine", "--mode", "measure", "--device", "cpu", "--output-dir",
                      str(tmp_path)]) == 0
    assert len(ran) == 1  # asked for the CPU explicitly: it runs


def test_a_notebook_parameter_is_passed_only_if_the_notebook_has_it(monkeypatch, capsys, tmp_path):
    ran = []
    for var in (book.results.MODE_ENV, "PYTHONPATH"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(book, "execute", lambda nb, out, params, **k: ran.append(params))
    assert book.main(["run", "00-the-machine", "--mode", "replay", "-p", "size='smoke'", "--output-dir",
                      str(tmp_path)]) == 0
    assert ran == [{"size": "smoke"}]
    assert book.main(["run", "00-the-machine", "--mode", "replay", "-p", "no_such_knob=3"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter no_such_knob" in err and "mode, device, size" in err and len(ran) == 1
    assert book.main(["run", "00-the-machine", "-p", "novalue"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_parameters_are_read_as_python_literals():
    assert book.parse_parameters(["a=0.8", "b=[1, 2]", "c='x'", "d=llama-3"]) == \
        {"a": 0.8, "b": [1, 2], "c": "x", "d": "llama-3"}
    cell = nbformat.v4.new_code_cell("mode = 'auto'  # a comment\nfraction: float = 0.9\nx, y = 1, 2")
    cell.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("hidden = 1"), cell]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"params-{os.getpid()}.ipynb"
    nbformat.write(nb, path)
    try:
        assert book.parameter_names(path) == ["mode", "fraction"]
    finally:
        path.unlink()


def test_check_fresh_of_a_folder_that_is_not_there_is_an_error(capsys, tmp_path):
    assert book.main(["check-fresh", "--results-dir", str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert "nonexistent does not exist: there are no results there to check" in err
    (tmp_path / "file").write_text("x")
    assert book.main(["check-fresh", "--results-dir", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_measuring_asked_through_a_parameter_or_the_environment_is_refused_without_a_gpu(monkeypatch, capsys):
    ran = []
    for var in (book.results.MODE_ENV, "PYTHONPATH"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(book, "_has_cuda", lambda: False)
    monkeypatch.setattr(book, "execute", lambda *a, **k: ran.append(a))
    assert book.main(["run", "03-kv-cache", "-p", "mode=measure"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert book.main(["run", "03-kv-cache", "-p", "mode=measure", "--device", "cuda"]) == 2
    assert book.main(["run", "03-kv-cache", "-p", "mode=replay", "--mode", "measure"]) == 2
    assert "disagree" in capsys.readouterr().err
    assert book.main(["run", "03-kv-cache", "-p", "mode=bogus"]) == 2
    assert "mode='bogus' is not one of auto, measure, replay" in capsys.readouterr().err
    monkeypatch.setenv(book.results.MODE_ENV, "measure")
    assert book.main(["run", "03-kv-cache"]) == 2
    assert ran == []


def test_a_run_with_changed_parameters_never_rewrites_the_committed_notebook(monkeypatch, capsys):
    ran = []
    for var in (book.results.MODE_ENV, "PYTHONPATH"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(book, "_has_cuda", lambda: False)
    monkeypatch.setattr(book, "execute", lambda nb, out, params, **k: ran.append((nb, out, params)))
    exercises = book.ROOT / book.EXERCISES
    committed = book.ROOT / "notebooks" / "03-kv-cache.ipynb"
    for argv in (["-p", "gpu_memory_utilization=0.8"], ["-p", "device='cuda'"], ["--device", "cpu", "--mode", "measure"],
                 ["--size", "smoke"]):
        ran.clear()
        assert book.main(["run", "03-kv-cache", "--mode", "replay", *argv] if "--mode" not in argv
                         else ["run", "03-kv-cache", *argv]) == 0, argv
        (nb, out, params), = ran
        assert nb == committed and out == exercises / "03-kv-cache.ipynb", argv
    ran.clear()
    assert book.main(["run", "03-kv-cache", "--mode", "replay"]) == 0  # make notebooks: in place, as documented
    assert ran == [(committed, committed, {})]
