"""The two arithmetic environments of a replay (tools/book.py's ARITHMETIC): `make notebooks` replays with one,
nbval with the other, so every test run compares the committed outputs with a replay through other BLAS
kernels, thread counts and vector paths."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))
from tools import book  # noqa: E402

X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_the_two_environments_differ_in_every_variable_they_share():
    commit, check = book.ARITHMETIC["commit"], book.ARITHMETIC["check"]
    assert set(commit) <= set(check)
    assert all(commit[k] != check[k] for k in commit)
    if X86:
        assert book.arithmetic("check") == check and book.arithmetic("commit")["OMP_NUM_THREADS"] == "1"
    else:
        assert book.arithmetic("check") == book.arithmetic("commit") == {}


def test_a_replay_run_sets_the_commit_environment_unless_the_caller_set_it(monkeypatch):
    seen = []
    for var in (book.results.MODE_ENV, "PYTHONPATH", *book.ARITHMETIC["check"]):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(book, "execute", lambda *a, **k: seen.append({k: os.environ.get(k) for k in book.ARITHMETIC["commit"]}))
    assert book.main(["run", "00-the-machine", "--mode", "replay"]) == 0
    assert seen[-1] == {k: book.arithmetic("commit").get(k) for k in book.ARITHMETIC["commit"]}
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert book.main(["run", "00-the-machine", "--mode", "replay"]) == 0
    assert seen[-1]["OPENBLAS_CORETYPE"] == "Zen"


@pytest.mark.skipif(not X86, reason="the environments set nothing off x86-64")
def test_nbvals_kernel_replays_in_the_check_environment(tmp_path):
    """A notebook whose committed output is the check environment passes nbval only if its kernel has it."""
    shown = ["OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY"]
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f"import os; print(*[os.environ.get(k) for k in {shown!r}])")
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text=" ".join(book.ARITHMETIC["check"][k] for k in shown) + "\n")]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "env.ipynb"
    nbformat.write(nb, path)
    env = {k: v for k, v in os.environ.items() if k not in book.ARITHMETIC["check"]}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", os.devnull, "--rootdir", str(tmp_path),
                          "-p", "tests.nbval_env", "--nbval", "--nbval-current-env", str(path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout
