"""Every chapter notebook: its structure, and a smoke run of its experiment on the CPU.

The smoke run is what a reader's `make measure` does, at a tiny size: papermill executes each notebook
in chapter order in measure mode on the CPU, writing results into a temporary folder (chapter 0 first:
the others read its ceilings). Each notebook is a test of its own with its own generous timeout, so a
slow, busy machine fails none of them and a stuck one names itself. (The committed notebooks themselves
are checked by nbval, which replays the reference set.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from lib.bench import results
from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
PARAMETERS = ("mode", "device", "size", "reference", "results_dir")
MAX_CELL_LINES = 40  # code lines a reader follows in one cell (glue and claims cells: data, exempt)
SMOKE_TIMEOUT_S = 900  # per notebook; the smoke sizes take seconds on an idle 2-core machine


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_structure(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = [c for c in code if "parameters" in tags(c)]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    for name in PARAMETERS:
        assert f"\n{name} = " in "\n" + params[0].source, f"the parameters cell sets {name}"
    assert not any("injected-parameters" in tags(c) for c in code), "commit notebooks without papermill's injected cell"
    # a cell that times this machine's own host (tagged 'host-timing') cannot give the same output twice; it
    # asserts nothing about the time (a busy machine is slow, not wrong), and its number appears nowhere else
    timing_cells = [c for c in code if "host-timing" in tags(c)]
    for c in timing_cells:
        assert "nbval-ignore-output" in tags(c) and "claims." not in c.source, "a host-timing cell claims no duration"
    ignored = [c for c in code if "nbval-ignore-output" in tags(c) and c not in timing_cells]
    assert len(ignored) == 1 and "measure" in tags(ignored[0]), "only the measuring cell escapes nbval"
    assert "measure_or_replay" in ignored[0].source
    # the experiment's code in the notebook is tagged 'measure' (so that its fingerprint covers it); a notebook
    # whose run cell hands the experiment module's own measure to the run defines none of it
    own = re.search(r"measure_or_replay\([^()]*\([^()]*\),\s*\w+\.measure\)", ignored[0].source)
    assert own or any("measure" in tags(c) for c in code if c is not ignored[0]), "the experiment's code is tagged 'measure'"
    assert "claims.report()" in code[-1].source, "a notebook ends with its claims"
    assert all(c.execution_count is not None for c in code), "committed with outputs: run `make notebooks`"
    text = json.dumps(nb)
    for machine_path in {str(ROOT), tempfile.gettempdir(), str(Path.home())}:
        assert machine_path.rstrip("/") + "/" not in text, f"a path of this machine ({machine_path}) in {path.name}"


def code_lines(source: str) -> int:
    return sum(1 for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_reads_as_an_experiment(path):
    """Short code cells, each after a sentence that says what it does; long cells only as data (glue, claims)."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "parameters" in tags(cell):
            continue
        if code_lines(cell.source) > MAX_CELL_LINES:  # only a table of name -> value may run longer
            data = "glue." in cell.source or "claims.check" in cell.source
            loops = [ln for ln in cell.source.splitlines() if ln.lstrip().startswith(("for ", "while ", "def "))]
            assert data and not loops, (
                f"cell {i} has {code_lines(cell.source)} lines of code: move the loop to lib/experiments, or keep "
                "a long glue or claims cell a table of name -> value")
        before = nb.cells[i - 1] if i else None
        first_code = not any(c.cell_type == "code" and "parameters" not in tags(c) for c in nb.cells[:i])
        assert first_code or (before is not None and before.cell_type == "markdown" and before.source.strip()), (
            f"cell {i} follows no sentence that says what it does")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            assert not re.search(r"\bissues?\b", cell.source, re.I), "the book speaks of its own targets"


def test_reference_results_exist_for_every_notebook():
    for path in NOTEBOOKS:
        rec = results.load(path.stem, results.REFERENCE)
        assert rec["provenance"]["slug"] == results.REFERENCE and rec["params"]["size"] == "full"


@pytest.fixture(scope="module")
def smoke_dirs(tmp_path_factory):
    """One results folder for the whole smoke run (chapter 0's ceilings serve the later chapters)."""
    base = tmp_path_factory.mktemp("smoke")
    return base / "results", base / "out"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_smoke_run_on_the_cpu(path, smoke_dirs):
    """papermill, measure mode, CPU, smoke size, temporary results: the notebook must run."""
    res_dir, out_dir = smoke_dirs
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "book.py"), "run", path.stem, "--mode", "measure", "--device", "cpu",
         "--size", "smoke", "--results-dir", str(res_dir), "--output-dir", str(out_dir), "--no-progress"],
        capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = results.load(path.stem, "cpu", res_dir)
    assert rec["provenance"]["kind"] == "cpu" and rec["params"]["size"] == "smoke"
    assert results.stale_reasons(rec) == []
    executed = nbformat.read(out_dir / path.name, as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors == []
    # the committed reference results were not touched
    assert not (ROOT / "results" / "cpu").exists()
