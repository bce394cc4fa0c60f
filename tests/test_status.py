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


def hand_rows():
    """Three chapters: one fresh with a met and a missed target, one stale with no target, one without
    results (its date unknown) with one met target."""
    return [
        {"chapter": "00-a", "results": True, "fresh": True, "date": "2026-12-01", "claims_held": 3.0,
         "claims_total": 3.0, "targets": [{"target": "fast", "value": 1.2, "goal": ">= 1", "met": True},
                                          {"target": "faster", "value": 0.8, "goal": ">= 0.9", "met": False}]},
        {"chapter": "01-b", "results": True, "fresh": False, "date": "2026-11-30", "claims_held": 1.0,
         "claims_total": 2.0, "targets": []},
        {"chapter": "02-c", "results": False, "claims_held": None, "claims_total": None,
         "targets": [{"target": "small", "value": None, "goal": "<= 5", "met": False}]},
    ]


def test_target_rows_carry_chapter_and_date_in_chapter_order():
    assert status.target_rows(hand_rows()) == [
        {"chapter": "00-a", "date": "2026-12-01", "target": "fast", "value": 1.2, "goal": ">= 1", "met": True},
        {"chapter": "00-a", "date": "2026-12-01", "target": "faster", "value": 0.8, "goal": ">= 0.9", "met": False},
        {"chapter": "02-c", "date": "", "target": "small", "value": None, "goal": "<= 5", "met": False},
    ]


def test_summary_counts_fresh_chapters_claims_and_targets():
    assert status.summary(hand_rows()) == (
        "1 of 3 chapters have fresh reference results; 4 of 5 claims hold. The chapters set 3 targets for the "
        "book's own code: 1 met, 2 missed (in 00-a, 02-c).")
    all_met = [dict(hand_rows()[0], targets=hand_rows()[0]["targets"][:1])]
    assert status.summary(all_met).endswith("The chapters set 1 targets for the book's own code: 1 met, 0 missed.")


@pytest.mark.parametrize("chapter", ["04-grouped-gemm", "05-prefix-caching"])
def test_chapters_4_and_5_record_their_targets_for_the_status_page(chapter):
    """The targets these chapters tabulate (glued as ``targets_table``, counted as ``targets_met``) are also
    recorded with ``Claims.target``, so the status page lists them with the date of their measurement."""
    row = next(r for r in status.status_rows() if r["chapter"] == chapter)
    g = status.glued(ROOT / "notebooks" / f"{chapter}.ipynb")
    assert row["targets"], f"{chapter} records no target with Claims.target"
    assert sum(t["met"] for t in row["targets"]) == g["targets_met"]
    for t in row["targets"]:  # each as its table shows it: the text, and the goal against the value
        assert t["target"] in g["targets_table"]
        op, bound = t["goal"].split()
        assert t["met"] == (t["value"] is not None and (t["value"] >= float(bound) if op == ">=" else t["value"] <= float(bound)))
    assert all(t["date"] == row["date"] and row["date"] for t in status.target_rows([row]))


def test_headline_labels_name_the_statistic_and_the_cases():
    """A headline that is a median says so; one that is the worst over a set of cases says which set (the
    devices page once showed the worst case over E >= 64 as if it were E = 64)."""
    for _, name, what, _ in status.HEADLINES:
        if name.endswith("_median"):
            assert "median" in what, (name, what)
        if "e64" in name:
            assert "worst case over E >= 64" in what, (name, what)
        assert "GPU time" in what or "call time" in what or not name.startswith(("speedup", "decode_us")), (name, what)
    assert len({h[2] for h in status.HEADLINES}) == len(status.HEADLINES), "two headlines share a label"
