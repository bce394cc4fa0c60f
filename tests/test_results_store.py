"""lib.bench.results, the fast half: files, messages, parameters, modes (no subprocess, no kernel).

tests/test_results.py holds the end-to-end checks (a writer killed mid-write, the check-fresh command).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from lib.bench import fingerprint, results
from lib.bench.results import MissingResults, ParameterMismatch, ResultsError, Run
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def no_git(monkeypatch):
    """Provenance names this commit instead of asking git (a subprocess)."""
    monkeypatch.setenv("BOOK_COMMIT", "c0ffee")
    monkeypatch.delenv("BOOK_MODE", raising=False)


def record(notebook="exp", params=None, kind="cpu", root=None, **kw):
    rec = {"schema": results.SCHEMA, "notebook": notebook, "params": params or {"size": "smoke"},
           "code": fingerprint.fingerprint(notebook, root) if root else {"scheme": fingerprint.SCHEME, "sources": {}},
           "provenance": {"name": "Some GPU", "kind": kind, "date": "2026-03-04T05:06:07Z"}, "data": {"x": 1}}
    rec.update(kw)
    return rec


def measure_n(params, device):
    return {"x": params["n"] * 2, "shape": (2, 3), "device": device}


# ---------------------------------------------------------------------------- paths and messages


def test_show_is_relative_to_the_repository_or_whole():
    assert results.show(ROOT / "results" / "cpu" / "a.json") == "results/cpu/a.json"
    assert results.show(Path("/r/x/y.json"), root=Path("/r")) == "x/y.json"
    assert results.show("/r/x/y.json", root="/r") == "x/y.json"  # strings too
    assert results.show(Path("/elsewhere/y.json"), root=Path("/r")) == "/elsewhere/y.json"


def test_remeasure_hint_gives_the_command_for_the_device():
    cmd = "papermill notebooks/nb.ipynb notebooks/nb.ipynb -p mode measure"
    assert results.remeasure_hint("nb", "cpu") == f"Re-measure with `{cmd} -p device cpu`"
    assert results.remeasure_hint("nb", "nvidia-h200") == (
        f"Re-measure on a nvidia-h200 GPU with `make measure` (or this notebook alone: `{cmd}`)")
    assert results.remeasure_hint("nb", "cpu", " -p size full") == f"Re-measure with `{cmd} -p size full -p device cpu`"


def test_results_live_in_one_folder_per_device(tmp_path):
    assert results.path_for("nb", "nvidia-h200") == ROOT / "results" / "nvidia-h200" / "nb.json"
    assert results.path_for("nb", "cpu", tmp_path) == tmp_path / "cpu" / "nb.json"
    assert results.path_for("nb", "cpu", str(tmp_path)) == tmp_path / "cpu" / "nb.json"


def test_warn_writes_a_visible_line_to_stderr(capsys):
    results.warn("look")
    assert capsys.readouterr() == ("", "WARNING: look\n")


# ---------------------------------------------------------------------------- writing


def test_write_then_read_round_trips_and_creates_folders(tmp_path):
    path = tmp_path / "deep" / "cpu" / "nb.json"
    rec = record(data={"t_us": [1.5, 2.0], "name": "ünïcode", "n": 3})
    results.write(path, rec)
    assert results.read(path) == rec
    text = path.read_text()
    assert text == json.dumps(rec, indent=1) + "\n"  # readable in a diff: one key per line, a final newline
    assert [p.name for p in path.parent.iterdir()] == ["nb.json"]  # no temporary file left behind


def test_write_of_a_record_larger_than_its_chunks_is_whole(tmp_path):
    path = tmp_path / "big.json"
    rec = {"data": list(range(600_000))}  # about 4.7 MB of text: several 1 MiB chunks and a partial one
    results.write(path, rec)
    assert json.loads(path.read_text()) == rec


def test_write_goes_through_a_hidden_temporary_file_in_the_same_folder_synced_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "cpu" / "nb.json"
    results.write(path, {"version": "old"})
    log = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        log.append("fsync")
        real_fsync(fd)

    def replace(src, dst):
        src, dst = Path(src), Path(dst)
        log.append("replace")
        assert src.parent == dst.parent == path.parent  # a rename within one folder is atomic
        assert src.name.startswith(".nb.json.") and src.name.endswith(".tmp")  # hidden, and not *.json
        assert json.loads(src.read_text()) == {"version": "new"}  # complete before it takes the name
        assert json.loads(dst.read_text()) == {"version": "old"}
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    results.write(path, {"version": "new"})
    assert log == ["fsync", "replace"]
    assert json.loads(path.read_text()) == {"version": "new"}


def test_a_write_that_fails_midway_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "nb.json"
    results.write(path, {"version": "old"})

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        results.write(path, {"version": "new"})
    assert json.loads(path.read_text()) == {"version": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["nb.json"]


def test_a_write_interrupted_by_the_user_cleans_up_too(tmp_path, monkeypatch):
    path = tmp_path / "nb.json"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        results.write(path, {"version": "new"})
    assert list(tmp_path.iterdir()) == []


def test_values_json_cannot_hold_are_refused_before_the_disk_is_touched(tmp_path):
    for bad in ({"x": float("inf")}, {"x": float("nan")}, {"x": object()}):
        with pytest.raises((ValueError, TypeError)):
            results.write(tmp_path / "sub" / "nb.json", bad)
    assert not (tmp_path / "sub" / "nb.json").exists()
    assert not any((tmp_path / "sub").iterdir())  # the folder may exist; it holds nothing


# ---------------------------------------------------------------------------- reading


def test_a_missing_file_says_which_sets_have_the_notebook(tmp_path):
    for slug in ("b-gpu", "a-gpu"):
        results.write(tmp_path / slug / "nb.json", record("nb"))
    results.write(tmp_path / "c-gpu" / "other.json", record("other"))
    path = tmp_path / "cpu" / "nb.json"
    with pytest.raises(MissingResults) as e:
        results.read(path)
    assert str(e.value) == (
        f"{path.as_posix()} does not exist: there are no results of notebook 'nb' for device 'cpu' to replay. "
        f"{results.remeasure_hint('nb', 'cpu')}, or replay another device's set with -p reference <slug> "
        "(sets that have this notebook: a-gpu, b-gpu).")
    with pytest.raises(MissingResults, match=r"notebook 'other' for device 'x'.*this notebook: c-gpu\)\.$"):
        results.read(path, "other", "x")
    with pytest.raises(MissingResults, match=r"\(sets that have this notebook: none\)\.$"):
        results.read(tmp_path / "nowhere" / "cpu" / "nb.json")
    assert issubclass(MissingResults, ResultsError) and issubclass(ResultsError, RuntimeError)


def test_load_reads_another_notebooks_results(tmp_path):
    results.write(tmp_path / "nvidia-h200" / "00-m.json", record("00-m", data={"bw": 4.2}))
    results.write(tmp_path / "cpu" / "00-m.json", record("00-m", data={"bw": 0.1}))
    assert results.load("00-m", results_dir=tmp_path)["data"] == {"bw": 4.2}  # the reference set by default
    assert results.load("00-m", "cpu", tmp_path)["data"] == {"bw": 0.1}
    with pytest.raises(MissingResults, match="notebook '01-x' for device 'cpu'"):
        results.load("01-x", "cpu", tmp_path)


def test_damaged_files_name_what_is_wrong(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    path.parent.mkdir()
    path.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ResultsError) as e:
        results.read(path)
    assert str(e.value).startswith(f"{path.as_posix()} is not valid JSON (")
    assert str(e.value).endswith(f"). {results.remeasure_hint('nb', 'cpu')}.")
    path.write_text("{")
    with pytest.raises(ResultsError, match="is not valid JSON"):
        results.read(path)
    path.write_text(json.dumps({"schema": results.SCHEMA, "data": {}, "params": {}}))
    with pytest.raises(ResultsError) as e:
        results.read(path)
    assert str(e.value) == (f"{path.as_posix()} is not a results file of schema 1 (missing keys: ['code', 'notebook', "
                            f"'provenance']; schema 1). {results.remeasure_hint('nb', 'cpu')}.")
    results.write(path, record(schema=results.SCHEMA + 1))
    with pytest.raises(ResultsError, match=r"of schema 1 \(missing keys: none; schema 2\)"):
        results.read(path)


def test_a_file_that_is_json_but_not_an_object_is_refused_clearly(tmp_path):
    cmd = "papermill notebooks/nb.ipynb notebooks/nb.ipynb -p mode measure"
    hints = {"cpu": f"Re-measure with `{cmd} -p device cpu`",
             "some-gpu": f"Re-measure on a some-gpu GPU with `make measure` (or this notebook alone: `{cmd}`)"}
    for slug, hint in hints.items():
        path = tmp_path / slug / "nb.json"
        path.parent.mkdir()
        for text, kind in (("[]", "list"), ("5", "int"), ('"x"', "str")):
            path.write_text(text)
            with pytest.raises(ResultsError) as e:
                results.read(path)
            # what the file holds, and the command that re-creates this notebook's file for this device
            assert str(e.value) == f"{path.as_posix()} is not a results file: it holds a JSON {kind}, not an object. {hint}."


# ---------------------------------------------------------------------------- parameters


def test_param_diff_lists_every_difference_sorted():
    assert results.param_diff({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}) == []
    assert results.param_diff({"z": 1, "a": "x", "new": 2}, {"z": 2, "a": "x", "old": 3}) == [
        "new: asked 2, stored '<absent>'", "old: asked '<absent>', stored 3", "z: asked 1, stored 2"]
    # None is a value, not an absence
    assert results.param_diff({"k": None}, {}) == ["k: asked None, stored '<absent>'"]
    assert results.param_diff({}, {"k": None}) == ["k: asked '<absent>', stored None"]
    assert results.param_diff({"k": None}, {"k": None}) == []


def test_params_must_be_json(repo):
    with pytest.raises(TypeError, match="^params must be JSON-serializable numbers, strings, lists and dicts: "):
        Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": float("nan")}, measure_n)


# ---------------------------------------------------------------------------- a run: mode, device, size


def test_a_run_checks_its_arguments(repo):
    with pytest.raises(ValueError, match=r"^mode='x' is not one of \('auto', 'measure', 'replay'\)$"):
        Run("exp", mode="x", root=repo)
    with pytest.raises(ValueError, match=r"^size='huge' is not one of \('auto', 'full', 'smoke'\)$"):
        Run("exp", mode="measure", size="huge", root=repo)
    with pytest.raises(ValueError, match=r"^there is no notebooks/exp\.ipynb\.ipynb; pass the notebook's name without"):
        Run("exp.ipynb", mode="measure", root=repo)
    with pytest.raises(ValueError, match="device='tpu' is not one of"):
        Run("exp", mode="measure", device="tpu", root=repo)


def test_measuring_on_the_cpu_is_a_smoke_run_unless_asked(repo):
    r = Run("exp", mode="measure", device="cpu", root=repo)
    assert (r.mode, r.device, r.size, r.slug) == ("measure", "cpu", "smoke", "cpu")
    assert r.path == repo / "results" / "cpu" / "exp.json" and not r.strict
    assert repr(r) == "Run('exp', mode='measure', device='cpu', size='smoke', set='cpu')"
    full = Run("exp", mode="measure", device="cpu", size="full", root=repo, results_dir=repo / "elsewhere")
    assert full.size == "full" and full.path == repo / "elsewhere" / "cpu" / "exp.json"
    assert Run("exp", mode="measure", device="auto", root=repo).device in ("cpu", "cuda")
    assert Run("exp", mode="measure", root=repo).device in ("cpu", "cuda")  # the device is "auto" unless given


def test_measuring_on_a_gpu_is_full_size_unless_asked(repo, monkeypatch):
    from lib.bench import device as dev

    monkeypatch.setattr(dev, "resolve", lambda device: "cuda")
    monkeypatch.setattr(dev, "properties", lambda device: {"kind": device, "name": "Some GPU", "slug": "some-gpu"})
    r = Run("exp", mode="measure", device="cuda", root=repo)
    assert (r.device, r.slug, r.size) == ("cuda", "some-gpu", "full")
    assert r.path == repo / "results" / "some-gpu" / "exp.json"
    assert Run("exp", mode="measure", device="cuda", size="smoke", root=repo).size == "smoke"


def test_auto_mode_measures_exactly_when_torch_sees_a_gpu(repo, monkeypatch):
    import torch

    results.write(repo / "results" / results.REFERENCE / "exp.json", record(kind="cuda", root=repo))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Run("exp", root=repo).mode == "replay"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert Run("exp", device="cpu", root=repo).mode == "measure"
    monkeypatch.setenv(results.MODE_ENV, "")  # set but empty: torch decides
    assert Run("exp", device="cpu", root=repo).mode == "measure"
    monkeypatch.setenv(results.MODE_ENV, "replay")  # set: it decides
    assert Run("exp", root=repo).mode == "replay"
    monkeypatch.setenv(results.MODE_ENV, "auto")
    with pytest.raises(ValueError, match="^the environment variable BOOK_MODE='auto' must be 'measure' or 'replay'$"):
        Run("exp", root=repo)


def test_measure_writes_a_record_with_provenance_and_prints_where(repo, capsys):
    r = Run("exp", mode="measure", device="cpu", root=repo)
    res = r.measure_or_replay({"n": 21, "shape": (4, 5)}, measure_n)
    out = capsys.readouterr().out
    assert out == "measuring exp on cpu (smoke) ...\nwrote results/cpu/exp.json\n"
    assert res.measured is True and res.stale == [] and res.path == r.path
    assert res.data == {"x": 42, "shape": [2, 3], "device": "cpu"}  # as a replay will see it: tuples are lists
    assert res.params == {"size": "smoke", "n": 21, "shape": [4, 5]}
    assert res.device == "cpu" and res.provenance["commit"] == "c0ffee"
    rec = results.read(r.path)
    assert list(rec) == ["schema", "notebook", "params", "code", "provenance", "elapsed_s", "data"]
    assert rec["schema"] == 1 and rec["notebook"] == "exp" and rec["params"] == res.params
    assert rec["code"] == fingerprint.fingerprint("exp", repo) and rec["provenance"] == res.provenance
    assert rec["data"] == res.data and rec["elapsed_s"] >= 0
    assert len(res.date) == 10 and res.date == rec["provenance"]["date"][:10]


class BufferedPipe:
    """stdout as a pipe to a log (``make measure > log``): what is written waits in a buffer until flushed."""

    def __init__(self):
        self.buffer, self.shown = "", ""

    def write(self, text):
        self.buffer += text
        return len(text)

    def flush(self):
        self.shown, self.buffer = self.shown + self.buffer, ""


def test_progress_lines_reach_a_buffered_stdout_at_once(repo, monkeypatch):
    """Someone watching the log of a measurement that runs for an hour sees that it started, and each
    status line is out by the time the call returns, whatever stdout buffers."""
    pipe = BufferedPipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    seen = []

    def watched(params, device):
        seen.append(pipe.shown)  # the log while the measurement runs
        return {"x": 1}

    Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": 1}, watched)
    assert seen == ["measuring exp on cpu (smoke) ...\n"]
    assert (pipe.shown, pipe.buffer) == ("measuring exp on cpu (smoke) ...\nwrote results/cpu/exp.json\n", "")
    pipe.shown = ""
    r = Run("exp", mode="replay", reference="cpu", root=repo)
    r.measure_or_replay({"n": 1}, lambda p, d: pytest.fail("a replay does not measure"))
    date = results.read(r.path)["provenance"]["date"][:10]
    assert (pipe.shown, pipe.buffer) == (f"replaying results/cpu/exp.json: cpu, {date}\n", "")


def test_the_size_a_notebook_passes_is_overridden_by_the_runs(repo):
    res = Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": 1, "size": "full"}, measure_n)
    assert res.params["size"] == "full"  # a notebook's own size wins over the run's


def test_replay_returns_the_stored_record_and_says_so(repo, capsys):
    Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": 21, "shape": (4, 5)}, measure_n)
    capsys.readouterr()
    r = Run("exp", mode="replay", reference="cpu", root=repo)
    assert (r.mode, r.device, r.size, r.slug) == ("replay", "cpu", "smoke", "cpu")
    res = r.measure_or_replay({"n": 21, "shape": (4, 5)}, lambda p, d: pytest.fail("a replay does not measure"))
    stored = results.read(r.path)
    date = stored["provenance"]["date"][:10]
    assert capsys.readouterr() == (f"replaying results/cpu/exp.json: cpu, {date}\n", "")
    assert res.measured is False and res.stale == [] and res.path == r.path
    assert (res.data, res.params, res.provenance) == (stored["data"], stored["params"], stored["provenance"])


def test_replay_of_the_reference_set_takes_its_size_and_device(repo):
    results.write(repo / "results" / results.REFERENCE / "exp.json", record(
        params={"size": "full", "n": 1}, kind="cuda", root=repo))
    r = Run("exp", mode="replay", root=repo)
    assert r.strict and (r.slug, r.size, r.device) == (results.REFERENCE, "full", "cuda")
    assert Run("exp", mode="replay", size="full", root=repo).size == "full"
    res = r.measure_or_replay({"n": 1}, measure_n)
    assert res.device == "Some GPU" and res.date == "2026-03-04"
    with pytest.raises(ParameterMismatch) as e:
        Run("exp", mode="replay", size="smoke", root=repo)
    assert str(e.value) == (
        "results/nvidia-h200/exp.json holds a 'full' run, and size='smoke' was asked for. Replay with size='auto' "
        f"(or 'full'). {results.remeasure_hint('exp', 'nvidia-h200', ' -p size smoke')}.")


def test_replay_mismatch_lists_each_parameter(repo):
    results.write(repo / "results" / "cpu" / "exp.json", record(params={"size": "smoke", "n": 1, "k": [1, 2]},
                                                                root=repo))
    r = Run("exp", mode="replay", reference="cpu", root=repo)
    assert r.measure_or_replay({"n": 1, "k": (1, 2)}, measure_n).data == {"x": 1}  # a tuple asks for the stored list
    with pytest.raises(ParameterMismatch) as e:
        r.measure_or_replay({"n": 2, "m": 3}, measure_n)
    assert str(e.value) == (
        "results/cpu/exp.json was measured with other parameters than this notebook asks for:\n"
        "  k: asked '<absent>', stored [1, 2]\n  m: asked 3, stored '<absent>'\n  n: asked 2, stored 1\n"
        f"{results.remeasure_hint('exp', 'cpu')}.")


def test_a_stale_replay_warns_and_still_replays(repo, capsys):
    Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": 1}, measure_n)
    (repo / "lib" / "inner.py").write_text("from lib import unused\n\nTWO = 3\n")
    capsys.readouterr()
    res = Run("exp", mode="replay", reference="cpu", root=repo).measure_or_replay({"n": 1}, measure_n)
    assert res.stale == ["lib/inner.py changed", "lib/unused.py is new to the measuring code"] and res.data["x"] == 2
    err = capsys.readouterr().err
    assert err == (
        "WARNING: results/cpu/exp.json is stale: its code changed since it was measured (lib/inner.py changed; "
        "lib/unused.py is new to the measuring code). "
        "The numbers below may differ from what this notebook measures now. "
        f"{results.remeasure_hint('exp', 'cpu')}.\n")


# ---------------------------------------------------------------------------- staleness


def test_stale_reasons_for_old_schemes_and_unreadable_code(repo):
    assert results.stale_reasons(record(root=repo), repo) == []
    old = record(code={"sources": {}})  # the first records had no scheme: text listed by hand
    assert results.stale_reasons(old, repo) == [
        "it was fingerprinted by an older scheme ('text': measuring files listed by hand), which cannot tell what "
        "its code is now"]
    assert "('code': " in results.stale_reasons(record(code={"scheme": "code"}), repo)[0]
    gone = record("gone", code={"scheme": fingerprint.SCHEME, "sources": {}})
    [reason] = results.stale_reasons(gone, repo)
    assert reason.startswith("its measuring code cannot be read (") and "gone.ipynb" in reason
    (repo / "notebooks" / "bad.ipynb").write_text("{")
    assert results.stale_reasons(record("bad", code={"scheme": fingerprint.SCHEME}), repo)[0].startswith(
        "its measuring code cannot be read")


def test_stale_results_lists_only_stale_files_of_every_device_in_order(repo, monkeypatch):
    res = repo / "results"
    results.write(res / "b-gpu" / "exp.json", record(root=repo))
    results.write(res / "a-gpu" / "exp.json", record(root=repo))
    results.write(res / "cpu" / "exp.json", record(root=repo))
    results.write(res / "loose.json", record(code={"sources": {}}))  # not in a device folder: not a result
    assert results.stale_results(res, repo) == []
    (repo / "lib" / "helper.py").write_text("from lib import inner\n\nSCALE = inner.TWO + 1\n")
    results.write(res / "cpu" / "exp.json", record(root=repo))  # re-measured: fresh
    assert results.stale_results(res, repo) == [(res / "a-gpu" / "exp.json", ["lib/helper.py changed"]),
                                                (res / "b-gpu" / "exp.json", ["lib/helper.py changed"])]
    monkeypatch.setattr(results, "RESULTS", res)  # the book's own results folder by default
    assert [p.parent.name for p, _ in results.stale_results(root=repo)] == ["a-gpu", "b-gpu"]
