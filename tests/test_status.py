"""tools.site.status: the status page's rows and the devices page's headline numbers."""

import json
import shutil

import pytest

from lib.bench import results
from tests.conftest import ROOT
from tools.site import status


def notebook_with(path, values: dict):
    """A minimal executed notebook whose outputs glue ``values`` the way myst-nb does."""
    prefix = "application/papermill.record/"
    outputs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": prefix}},
                "data": {prefix + "text/plain": repr(v)}} for k, v in values.items()]
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": outputs, "execution_count": 1}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


def test_glued_reads_numbers_and_texts(tmp_path):
    notebook_with(tmp_path / "x.ipynb", {"a_GBps": 4243.5, "device_name": "NVIDIA H200"})
    assert status.glued(tmp_path / "x.ipynb") == {"a_GBps": 4243.5, "device_name": "NVIDIA H200"}


def test_every_chapter_has_a_status_row_with_its_claims():
    rows = status.status_rows()
    assert [r["chapter"] for r in rows] == status.chapter_notebooks()
    stale = {p.stem for p, _ in results.stale_results() if p.parent.name == results.REFERENCE}
    for r in rows:
        assert r["results"] and r["device"] and r["date"] and r["commit"] and r["torch"]
        assert r["fresh"] == (r["chapter"] not in stale)
        # the committed notebooks glue their claims, and on the reference set every claim holds
        assert r["claims_total"] >= 1 and r["claims_held"] == r["claims_total"]


def test_every_headline_is_glued_by_its_chapter():
    values = status.headline_values(ROOT / "notebooks")
    missing = [(nb, name) for nb, name, _, _ in status.HEADLINES if (nb, name) not in values]
    assert not missing, f"HEADLINES names that the notebooks do not glue: {missing}"


def test_devices_side_by_side_with_ratios(tmp_path):
    res = tmp_path / "results"
    shutil.copytree(results.RESULTS / results.REFERENCE, res / results.REFERENCE)
    rec = results.read(results.path_for("00-the-machine", results.REFERENCE))  # the same record, relabelled
    rec["provenance"] = dict(rec["provenance"], name="Other GPU", slug="other-gpu")
    results.write(res / "other-gpu" / "00-the-machine.json", rec)
    (res / "third-gpu").mkdir()
    shutil.copy(results.RESULTS / results.REFERENCE / "00-the-machine.json", res / "third-gpu")
    ref = status.headline_values(ROOT / "notebooks")
    halved = {name: ref[(nb, name)] / 2 for nb, name, _, _ in status.HEADLINES if nb == "00-the-machine"}
    notebook_with(tmp_path / "replayed" / "other-gpu" / "00-the-machine.ipynb", halved)
    assert status.devices(res) == [results.REFERENCE, "other-gpu", "third-gpu"]
    shown, rows, missing = status.device_rows(res, ROOT, tmp_path / "replayed")
    assert shown == [results.REFERENCE, "other-gpu"] and missing == ["third-gpu"]
    ratio = f"other-gpu / {results.REFERENCE}"
    for r in rows:
        if r["chapter"] == "00-the-machine":
            assert r[ratio] == pytest.approx(0.5)
        else:  # measured on the reference only
            assert r["other-gpu"] is None and r[ratio] is None and r[results.REFERENCE] is not None


def test_devices_command_replays_another_device_for_the_page(tmp_path):
    """`tools/book.py devices` replays a second device's results; the page then shows its ratios (here
    the same measurements under another name, so every ratio of chapter 0 is 1)."""
    import subprocess
    import sys

    res = tmp_path / "results"
    shutil.copytree(results.RESULTS / results.REFERENCE, res / results.REFERENCE)
    rec = results.read(results.path_for("00-the-machine", results.REFERENCE))  # the same record, relabelled
    rec["provenance"] = dict(rec["provenance"], name="Other GPU", slug="other-gpu")
    results.write(res / "other-gpu" / "00-the-machine.json", rec)
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "book.py"), "devices", "--results-dir", str(res),
                           "--output-dir", str(tmp_path / "replayed")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    shown, rows, missing = status.device_rows(res, ROOT, tmp_path / "replayed")
    assert shown == [results.REFERENCE, "other-gpu"] and missing == []
    ch0 = [r for r in rows if r["chapter"] == "00-the-machine"]
    assert ch0 and all(r[f"other-gpu / {results.REFERENCE}"] == pytest.approx(1.0) for r in ch0)
