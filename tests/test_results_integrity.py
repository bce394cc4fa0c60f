"""The results store verifies what it replays, on copies of the book's own reference set.

Each case is one way a results file was found to be trusted though it should not have been: a hand-edited
median, chapter 0's medians doubled under the ceilings the later chapters use, another device's or another
chapter's file under the reference, a CPU smoke run there, NaN, a file that is not an object, two writers
at once, what a killed writer leaves. Each must stop with an error that names the file (and `check-fresh`
must list it), never replay silently. tests/test_results_store.py holds the unit tests of each check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lib.bench import ceilings, results
from lib.bench.results import DigestMismatch, Misplaced, ResultsError, Run
from tests.conftest import ROOT

REF = results.REFERENCE
CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


@pytest.fixture
def ref(tmp_path):
    """A copy of the reference set under tmp_path/results/<reference>/ (tuning records left out)."""
    folder = tmp_path / "results" / REF
    folder.mkdir(parents=True)
    for nb in CHAPTERS:
        shutil.copy(results.path_for(nb, REF), folder)
    return folder


def book(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "book.py"), *args], capture_output=True, text=True,
                          timeout=300)


def test_every_committed_record_is_verified_and_records_the_results_it_derives_from():
    """Every reference record reads with a matching digest; a chapter whose notebook reads another chapter's
    results (chapter 0's through ``ceilings.load``, any through ``results.load``) records the digest of
    each such file, and where that digest is no longer the file's (the other chapter was re-measured since),
    the record is stale by exactly that input: check-fresh names it, and the page shows the warning."""
    for nb in CHAPTERS:
        path = results.path_for(nb, REF)
        rec = results.read(path, nb, REF)
        assert rec["digest"] == results.digest(rec) and rec["provenance"]["slug"] == REF
        cells = json.loads((ROOT / "notebooks" / f"{nb}.ipynb").read_text())["cells"]
        source = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        read = set(re.findall(r'results\.load\("([^"]+)"', source)) | ({ceilings.NOTEBOOK} if "ceilings.load(" in source
                                                                      else set())
        read.discard(nb)
        assert sorted(rec.get("inputs", {})) == sorted(read)
        now = {other: results.read(results.path_for(other, REF))["digest"] for other in read}
        changed = sorted(other for other in read if rec["inputs"][other] != now[other])
        reasons = results.input_reasons(rec, path)
        assert len(reasons) == len(changed) and all(f"{other}.json changed since it was measured" in r
                                                    for other, r in zip(changed, reasons))
        if changed:
            assert any(p == path and r[-len(reasons):] == reasons for p, r in results.stale_results())
        if "sealed" in rec:
            assert "not by the measurement" in rec["sealed"]["note"]


def test_a_hand_edited_median_stops_the_replay(ref):
    path = ref / "03-kv-cache.json"
    text = path.read_text()
    median = re.search(r'"median": (\d+\.\d+)', text)
    path.write_text(text[:median.start(1)] + str(float(median.group(1)) * 0.995) + text[median.end(1):])
    with pytest.raises(DigestMismatch) as e:
        Run("03-kv-cache", mode="replay", results_dir=ref.parent, root=ROOT)
    assert str(e.value).startswith(f"{path.as_posix()} no longer matches the digest written with it")
    assert "make measure" in str(e.value) and "git checkout -- " in str(e.value)
    assert [(k, p.name) for k, p, _ in results.audit(ref.parent, ROOT) if k == "damaged"] == [("damaged", path.name)]


def test_chapter_0s_doubled_medians_do_not_reach_the_ceilings(ref):
    path = ref / "00-the-machine.json"
    rec = json.loads(path.read_text())
    for row in rec["data"]["copy"]:
        row["timing"]["gpu_us"]["median"] *= 2
    path.write_text(json.dumps(rec, indent=1))  # the digest left as it was
    with pytest.raises(DigestMismatch, match="00-the-machine.json no longer matches"):
        ceilings.load(REF, ref.parent)
    # written through the store (as a new measurement would be), it is valid, and what was derived from
    # the old one is stale: check-fresh says so, chapter by chapter
    results.write(path, rec)
    assert ceilings.load(REF, ref.parent)["copy_bw_GBps"] > 0
    stale = {p.stem: r for k, p, r in results.audit(ref.parent, ROOT) if k == "stale"}
    derived = [nb for nb in CHAPTERS if "inputs" in results.read(ref / f"{nb}.json")]
    assert derived and sorted(nb for nb in stale if any("its input" in r for r in stale[nb])) == derived
    assert all(any(f"its input {(ref / '00-the-machine.json').as_posix()} changed since it was measured" in r
                   for r in stale[nb]) for nb in derived)


def test_another_devices_or_chapters_file_under_the_reference_is_refused(ref):
    from lib.bench import device

    path = ref / "02-roofline.json"
    rec = results.read(path)
    a100 = dict(rec, provenance=dict(rec["provenance"], name="NVIDIA A100-SXM4-80GB", slug="nvidia-a100-sxm4-80gb"))
    results.write(path, a100)  # a valid record of another device, copied into the reference's folder
    with pytest.raises(Misplaced, match="was measured on NVIDIA A100-SXM4-80GB .* but lies under the results of "
                                        f"device '{REF}'"):
        Run("02-roofline", mode="replay", results_dir=ref.parent, root=ROOT)
    results.write(path, dict(rec, notebook="01-matrix-shapes"))
    with pytest.raises(Misplaced, match="holds the results of notebook '01-matrix-shapes', not of '02-roofline'"):
        Run("02-roofline", mode="replay", results_dir=ref.parent, root=ROOT)
    smoke = dict(rec, params=dict(rec["params"], size="smoke"), provenance=device.provenance("cpu"))
    results.write(path, smoke)  # a CPU smoke run under the GPU's slug
    with pytest.raises(Misplaced, match=f"holds a CPU run \\('smoke' size\\), but lies under the results of device "
                                        f"'{REF}'"):
        Run("02-roofline", mode="replay", results_dir=ref.parent, root=ROOT)


def test_nan_and_non_objects_are_clear_errors(ref):
    path = ref / "01-matrix-shapes.json"
    text = path.read_text()
    median = re.search(r'"median": (\d+\.\d+)', text)
    path.write_text(text[:median.start(1)] + "NaN" + text[median.end(1):])
    with pytest.raises(ResultsError, match=r"holds nan at data\[.*\]\['median'\], which no measurement writes"):
        Run("01-matrix-shapes", mode="replay", results_dir=ref.parent, root=ROOT)
    path.write_text("[1, 2, 3]")
    with pytest.raises(ResultsError, match="is not a results file: it holds a JSON list, not an object"):
        Run("01-matrix-shapes", mode="replay", results_dir=ref.parent, root=ROOT)


HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from lib.bench import results
    with results.lock({path!r}):
        open({marker!r}, "w").close()
        time.sleep(60)
""")


def test_a_second_process_writing_the_same_file_is_refused(tmp_path):
    path, marker = tmp_path / "cpu" / "nb.json", tmp_path / "holding"
    results.write(path, {"v": 1})
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT), path=str(path), marker=str(marker))])
    try:
        deadline = time.time() + 60
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, "the other writer never took the lock"
            time.sleep(0.01)
        with pytest.raises(results.WriteInProgress, match=f"is being written by another process \\(pid {proc.pid}, "):
            results.write(path, {"v": 2})
        os.kill(proc.pid, signal.SIGKILL)  # killed while holding it: the system releases the lock
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads(path.read_text())["v"] == 1
    results.write(path, {"v": 2})
    assert json.loads(path.read_text())["v"] == 2 and sorted(p.name for p in path.parent.iterdir()) == ["nb.json"]


def test_check_fresh_lists_damaged_files_and_leftovers(ref):
    path = ref / "06-batching.json"
    path.write_text(path.read_text().replace('"size": "full"', '"size": "fulll"', 1))
    (ref / ".06-batching.json.abcdefgh.tmp").write_text("{")
    out = book("check-fresh", "--results-dir", str(ref.parent))
    assert out.returncode == 1
    assert f"damaged: {path.as_posix()}: no longer matches the digest written with it" in out.stdout
    assert f"leftover: {(ref / '.06-batching.json.abcdefgh.tmp').as_posix()}: a temporary file" in out.stdout


def test_seal_adds_a_digest_to_an_old_record_and_keeps_its_values(ref):
    path = ref / "01-matrix-shapes.json"
    rec = results.read(path)
    old = {k: v for k, v in rec.items() if k not in ("digest", "inputs", "sealed")}
    path.write_text(json.dumps(old, indent=1) + "\n")  # as the records were before digests
    with pytest.raises(results.Unsealed, match=f"seal it: `python tools/book.py seal {path.as_posix()}`"):
        results.read(path)
    out = book("seal", str(path), "--input", "00-the-machine")
    assert out.returncode == 0, out.stderr
    sealed = results.read(path)
    assert sealed["data"] == old["data"] and json.dumps(sealed["data"]) == json.dumps(old["data"])
    assert {k: v for k, v in sealed.items() if k not in ("digest", "inputs", "sealed")} == old
    assert sealed["inputs"] == rec["inputs"] and out.stdout.startswith(f"sealed {path.as_posix()}: sha256:")
    again = book("seal", str(path))
    assert again.returncode == 1 and "already carries a digest that matches its content" in again.stderr
