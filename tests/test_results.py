"""lib.bench.results: the store, measure-or-replay, parameter checks, stale detection, atomic writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lib.bench import fingerprint, results
from lib.bench.results import MissingResults, ParameterMismatch, ResultsError, Run
from tests.conftest import ROOT, make_notebook


def measure_n(params, device):
    return {"x": params["n"] * 2, "values": [0.5, 1.5], "device": device}


def run(repo, mode, **kw):
    kw.setdefault("device", "cpu")
    return Run("exp", mode=mode, root=repo, **kw)


def test_measure_then_replay_round_trip(repo):
    measured = run(repo, "measure").measure_or_replay({"n": 21}, measure_n)
    assert measured.measured and measured.data == {"x": 42, "values": [0.5, 1.5], "device": "cpu"}
    path = repo / "results" / "cpu" / "exp.json"
    assert path.exists() and measured.path == path
    rec = json.loads(path.read_text())
    assert rec["params"] == {"size": "smoke", "n": 21}
    assert set(rec["code"]["sources"]) == {"notebooks/exp.ipynb#measure", "lib/__init__.py", "lib/helper.py",
                                           "lib/inner.py"}
    assert rec["code"]["roots"] == {"lib.helper": ["SCALE"]}  # the module, and what the measure cell uses of it
    assert 0 <= rec["elapsed_s"] < 60
    for key in ("name", "slug", "torch", "python", "date", "commit", "numpy"):
        assert key in rec["provenance"]

    replay = run(repo, "replay", reference="cpu")
    assert replay.size == "smoke" and not replay.strict
    again = replay.measure_or_replay({"n": 21}, lambda p: pytest.fail("replay must not measure"))
    assert not again.measured and again.data == measured.data and again.stale == []
    assert again.provenance == rec["provenance"]


def test_replay_of_the_reference_set_is_strict(repo):
    results.write(repo / "results" / results.REFERENCE / "exp.json", {
        "schema": results.SCHEMA, "notebook": "exp", "params": {"size": "full", "n": 1},
        "code": fingerprint.fingerprint("exp", repo),
        "provenance": {"name": "NVIDIA H200", "kind": "cuda", "slug": "nvidia-h200", "date": "2026-01-01T00:00:00Z"},
        "data": {"x": 2},
    })
    r = Run("exp", mode="replay", root=repo)
    assert r.strict and r.size == "full" and r.device == "cuda"


def test_missing_file_names_the_file_and_the_command(repo):
    with pytest.raises(MissingResults) as e:
        run(repo, "replay", reference="some-gpu")
    msg = str(e.value)
    assert "results/some-gpu/exp.json" in msg and "does not exist" in msg
    assert "make measure" in msg and "papermill notebooks/exp.ipynb" in msg


def test_parameter_mismatch_names_both_values(repo):
    run(repo, "measure").measure_or_replay({"n": 21}, measure_n)
    with pytest.raises(ParameterMismatch) as e:
        run(repo, "replay", reference="cpu").measure_or_replay({"n": 22}, measure_n)
    msg = str(e.value)
    assert "results/cpu/exp.json" in msg and "n: asked 22, stored 21" in msg and "Re-measure" in msg
    with pytest.raises(ParameterMismatch, match="holds a 'smoke' run, and size='full'"):
        run(repo, "replay", reference="cpu", size="full")


def test_changed_experiment_is_reported_stale(repo, capsys):
    run(repo, "measure").measure_or_replay({"n": 21}, measure_n)
    path = repo / "results" / "cpu" / "exp.json"
    assert results.stale_results(repo / "results", repo) == []

    # a cell that is not tagged 'measure' may change freely, and so may a module nothing measuring imports
    nb = json.loads((repo / "notebooks" / "exp.ipynb").read_text())
    nb["cells"][2]["source"] = "print('changed, but not measuring code')"
    (repo / "notebooks" / "exp.ipynb").write_text(json.dumps(nb))
    (repo / "lib" / "unused.py").write_text("THREE = 4\n")
    assert results.stale_reasons(results.read(path), repo) == []

    # a module imported by a module the measure cell uses: found from the imports, never listed
    (repo / "lib" / "inner.py").write_text("TWO = 3\n")
    assert results.stale_reasons(results.read(path), repo) == ["lib/inner.py changed"]
    make_notebook(repo / "notebooks" / "exp.ipynb", "def measure(p, device):\n    return {'x': p['n'] * 3}\n")
    reasons = results.stale_reasons(results.read(path), repo)
    assert reasons == ["notebooks/exp.ipynb#measure changed", "lib/__init__.py is no longer part of the measuring code",
                       "lib/helper.py is no longer part of the measuring code",
                       "lib/inner.py is no longer part of the measuring code"]
    assert results.stale_results(repo / "results", repo) == [(path, reasons)]

    capsys.readouterr()
    res = run(repo, "replay", reference="cpu").measure_or_replay({"n": 21}, measure_n)
    err = capsys.readouterr().err
    assert res.stale == reasons
    assert err.startswith("WARNING:") and "is stale" in err and "notebooks/exp.ipynb#measure changed" in err


def test_a_new_dependency_makes_results_stale(repo):
    run(repo, "measure").measure_or_replay({"n": 21}, measure_n)
    rec = results.read(repo / "results" / "cpu" / "exp.json")
    (repo / "lib" / "inner.py").write_text("from lib import unused\n\nTWO = 2\n")
    assert results.stale_reasons(rec, repo) == ["lib/inner.py changed", "lib/unused.py is new to the measuring code"]


def test_documentation_edits_leave_results_fresh(repo):
    """Docstrings, comments (whole-line and trailing) and blank lines of a lib module or of a measure cell do
    not count; code does; a record of an older scheme (files listed by hand) is stale."""
    run(repo, "measure").measure_or_replay({"n": 21}, measure_n)
    rec = results.read(repo / "results" / "cpu" / "exp.json")
    assert rec["code"]["scheme"] == fingerprint.SCHEME == "closure"
    helper = repo / "lib" / "helper.py"
    code = helper.read_text()
    helper.write_text('"""A module docstring,\nover two lines."""\n\n# a comment\n'
                      + code.replace("\n", "  # why\n\n", 1))
    make_notebook(repo / "notebooks" / "exp.ipynb",
                  "def measure(p, device):\n    \"\"\"Doc.\"\"\"\n    # twice\n    return {'x': p['n'] * helper.SCALE}\n")
    assert results.stale_reasons(rec, repo) == []
    helper.write_text(code.replace("SCALE = inner.TWO", "SCALE = inner.TWO + 0"))
    assert results.stale_reasons(rec, repo) == ["lib/helper.py changed"]
    old = dict(rec, code={"fingerprint": "", "sources": {"lib/helper.py": "0" * 64}, "scheme": "code"})
    assert "older scheme" in results.stale_reasons(old, repo)[0]


def test_check_fresh_command_lists_stale_results(repo):
    run(repo, "measure").measure_or_replay({"n": 1}, measure_n)
    cmd = [sys.executable, str(ROOT / "tools" / "book.py"), "check-fresh", "--results-dir", str(repo / "results"),
           "--root", str(repo)]
    fresh = subprocess.run(cmd, capture_output=True, text=True)
    assert fresh.returncode == 0 and "all results are fresh" in fresh.stdout
    (repo / "lib" / "inner.py").write_text("TWO = 5\n")
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 1 and "stale: results/cpu/exp.json: lib/inner.py changed" in out.stdout


def test_damaged_files_give_clear_errors(repo):
    path = repo / "results" / "cpu" / "exp.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(ResultsError, match="is not valid JSON.*Re-measure"):
        run(repo, "replay", reference="cpu")
    path.write_text(json.dumps({"schema": results.SCHEMA, "data": {}}))
    with pytest.raises(ResultsError, match="missing keys"):
        run(repo, "replay", reference="cpu")


def test_bad_arguments(repo):
    with pytest.raises(ValueError, match="mode="):
        Run("exp", mode="sometimes", root=repo)
    with pytest.raises(ValueError, match="size="):
        Run("exp", mode="measure", size="huge", root=repo)
    with pytest.raises(ValueError, match="no notebooks/nope.ipynb"):
        Run("nope", mode="measure", root=repo)
    with pytest.raises(TypeError, match="JSON-serializable"):
        run(repo, "measure").measure_or_replay({"n": object()}, measure_n)


def test_measuring_on_a_missing_gpu_fails_clearly(repo):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="device='cuda' was asked for"):
        Run("exp", mode="measure", device="cuda", root=repo)


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "r.json"
    results.write(path, {"a": 1})
    with pytest.raises(ValueError, match=r"r\.json was not written: a holds nan"):
        results.write(path, {"a": float("nan")})  # not valid JSON: refused before touching the file
    assert json.loads(path.read_text()) == {"a": 1, "digest": results.digest({"a": 1})}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


WRITER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from lib.bench import fingerprint, results
    real_fsync = os.fsync
    def stuck_fsync(fd):  # the new data is in the temporary file: say so, then hang here
        open({marker!r}, "w").close()
        time.sleep(60)
    os.fsync = stuck_fsync
    results.write({path!r}, {{"version": "new", "data": list(range(200000))}})
""")


def test_killed_writer_leaves_the_old_file_intact(tmp_path):
    """A writer killed mid-write leaves the old file whole; its temporary and lock files are reported by
    ``audit`` (check-fresh) until the next write of the file deletes them."""
    folder, marker = tmp_path / "cpu", tmp_path / "writing"
    path = folder / "r.json"
    results.write(path, {"version": "old"})
    script = WRITER.format(root=str(ROOT), marker=str(marker), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 60
        while not marker.exists():
            assert proc.poll() is None, "the writer exited before it was killed"
            assert time.time() < deadline, "the writer never reached its write"
            time.sleep(0.01)
        temps = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
        assert len(temps) == 1 and temps[0].stat().st_size > 1_000_000  # mid-write: new data on disk
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads(path.read_text())["version"] == "old"
    left = [(kind, p.name) for kind, p, _ in results.audit(tmp_path, ROOT)]
    assert left == [("damaged", "r.json"), ("leftover", temps[0].name), ("leftover", ".r.json.lock")]  # not a record
    # the next write succeeds, replaces the file whole, and deletes what the killed writer left
    results.write(path, {"version": "newer"})
    assert json.loads(path.read_text())["version"] == "newer"
    assert [p.name for p in folder.iterdir()] == ["r.json"]


def test_show_paths_relative_to_the_repository():
    assert results.show(ROOT / "results" / "x" / "y.json") == "results/x/y.json"
    assert results.show(Path("/elsewhere/y.json")) == "/elsewhere/y.json"


def test_book_mode_decides_what_auto_does(repo, monkeypatch):
    monkeypatch.setenv("BOOK_MODE", "measure")
    r = Run("exp", mode="auto", device="cpu", root=repo)
    assert r.mode == "measure" and r.size == "smoke"
    r.measure_or_replay({"n": 1}, measure_n)
    monkeypatch.setenv("BOOK_MODE", "replay")
    assert Run("exp", mode="auto", reference="cpu", root=repo).mode == "replay"
    assert Run("exp", mode="measure", device="cpu", root=repo).mode == "measure"  # an explicit mode wins
    monkeypatch.setenv("BOOK_MODE", "sometimes")
    with pytest.raises(ValueError, match="BOOK_MODE='sometimes'"):
        Run("exp", mode="auto", root=repo)
