"""Shared fixtures, and a report of stale results at the end of every test run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("IPYTHONDIR", str(ROOT / "tools" / "ipython"))
os.environ.pop("MPLBACKEND", None)
# nbval re-executes the committed notebooks with their defaults: make them replay the reference set even
# on a machine with a GPU, where mode="auto" would measure and overwrite it.
os.environ["BOOK_MODE"] = "replay"


def pytest_terminal_summary(terminalreporter):
    """List results whose measuring code changed since they were measured (make check-fresh)."""
    from lib import results

    stale = results.stale_results()
    if stale:
        terminalreporter.section("stale results (re-measure on the GPU: make measure)")
        for path, reasons in stale:
            terminalreporter.write_line(f"{results.show(path)}: {'; '.join(reasons)}")


def make_notebook(path: Path, measure_source: str) -> None:
    """A minimal notebook with one code cell tagged 'measure'."""
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": "m1", "metadata": {"tags": ["measure"]},
             "outputs": [], "source": measure_source},
            {"cell_type": "code", "execution_count": None, "id": "o1", "metadata": {}, "outputs": [],
             "source": "print('not measured')"},
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


@pytest.fixture
def repo(tmp_path):
    """A throwaway repository layout: notebooks/exp.ipynb, lib_fake/helper.py, results/."""
    make_notebook(tmp_path / "notebooks" / "exp.ipynb", "def measure(p):\n    return {'x': p['n'] * 2}\n")
    (tmp_path / "lib_fake").mkdir()
    (tmp_path / "lib_fake" / "helper.py").write_text("SCALE = 2\n")
    return tmp_path
