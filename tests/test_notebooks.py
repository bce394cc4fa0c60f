"""Every chapter notebook: its structure, and a smoke run of its experiment on the CPU.

The smoke run is what a reader's `make measure` does, at a tiny size: papermill executes every
notebook in chapter order in measure mode on the CPU, writing results into a temporary folder.
(The committed notebooks themselves are checked by nbval, which replays the reference set.)
"""

from __future__ import annotations

import json
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
    assert any("measure" in tags(c) for c in code if c is not ignored[0]), "the experiment's code is tagged 'measure'"
    assert "claims.report()" in code[-1].source, "a notebook ends with its claims"
    assert all(c.execution_count is not None for c in code), "committed with outputs: run `make notebooks`"
    text = json.dumps(nb)
    for machine_path in {str(ROOT), tempfile.gettempdir(), str(Path.home())}:
        assert machine_path.rstrip("/") + "/" not in text, f"a path of this machine ({machine_path}) in {path.name}"


def test_reference_results_exist_for_every_notebook():
    for path in NOTEBOOKS:
        rec = results.load(path.stem, results.REFERENCE)
        assert rec["provenance"]["slug"] == results.REFERENCE and rec["params"]["size"] == "full"


def test_smoke_run_every_notebook_on_the_cpu(tmp_path):
    """papermill, measure mode, CPU, smoke size, temporary results: every notebook must run."""
    out_dir, res_dir = tmp_path / "out", tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "book.py"), "run", "--mode", "measure", "--device", "cpu",
         "--size", "smoke", "--results-dir", str(res_dir), "--output-dir", str(out_dir), "--no-progress"],
        capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for path in NOTEBOOKS:
        rec = results.load(path.stem, "cpu", res_dir)
        assert rec["provenance"]["kind"] == "cpu" and rec["params"]["size"] == "smoke"
        assert results.stale_reasons(rec) == []
        executed = nbformat.read(out_dir / path.name, as_version=4)
        errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert errors == []
    # the committed reference results were not touched
    assert not (ROOT / "results" / "cpu").exists()
