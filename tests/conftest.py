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
    """List results whose measuring code changed since they were measured (make check-fresh). A copy of the
    tests without the results (mutation testing's) has nothing to list."""
    from lib.bench import results

    if not results.RESULTS.is_dir():
        return
    stale = results.stale_results()
    if stale:
        terminalreporter.section("stale results (re-measure on the GPU: make measure)")
        for path, reasons in stale:
            terminalreporter.write_line(f"{results.show(path)}: {'; '.join(reasons)}")


def make_notebook(path: Path, measure_source: str, imports: str = "from lib import helper\n") -> None:
    """A minimal notebook: an import cell, one code cell tagged 'measure', one that is not."""
    def cell(i, source, tags=()):
        return {"cell_type": "code", "execution_count": None, "id": i, "metadata": {"tags": list(tags)},
                "outputs": [], "source": source}
    nb = {
        "cells": [cell("i1", imports), cell("m1", measure_source, ["measure"]), cell("o1", "print('not measured')")],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


@pytest.fixture
def repo(tmp_path):
    """A throwaway repository: notebooks/exp.ipynb, whose measure cell uses lib/helper.py, which imports
    lib/inner.py; lib/unused.py, which nothing measuring imports; results/."""
    make_notebook(tmp_path / "notebooks" / "exp.ipynb", "def measure(p, device):\n    return {'x': p['n'] * helper.SCALE}\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text('"""A fake lib."""\n')
    (tmp_path / "lib" / "helper.py").write_text("from lib import inner\n\nSCALE = inner.TWO\n")
    (tmp_path / "lib" / "inner.py").write_text("TWO = 2\n")
    (tmp_path / "lib" / "unused.py").write_text("THREE = 3\n")
    return tmp_path


@pytest.fixture
def forgetful_scheduler(monkeypatch):
    """A planted scheduler bug for the simulator's no-progress check: ``finish_step`` forgets a prefill
    chunk's progress unless the chunk completes the prompt, so a chunked prompt is recomputed forever."""
    from lib.engine.scheduler import Scheduler

    real = Scheduler.finish_step

    def forgetful(self, plan, tokens, now, duration):
        out = real(self, plan, tokens, now, duration)
        for x, start, end in plan.prefills:
            if end < x.target:
                x.prefilled = start
        return out

    monkeypatch.setattr(Scheduler, "finish_step", forgetful)
