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


def record(notebook="exp", params=None, kind="cpu", root=None, slug=None, **kw):
    """A results record of ``notebook`` for the folder ``slug`` (default: "cpu" for a CPU run, else
    "some-gpu"), with the provenance a measurement there writes: the device's name gives the slug."""
    slug = slug or ("cpu" if kind == "cpu" else "some-gpu")
    name = "cpu" if kind == "cpu" else slug.replace("-", " ").upper()
    rec = {"schema": results.SCHEMA, "notebook": notebook, "params": params or {"size": "smoke"},
           "code": fingerprint.fingerprint(notebook, root) if root else {"scheme": fingerprint.SCHEME, "sources": {}},
           "provenance": {"name": name, "kind": kind, "slug": slug, "date": "2026-03-04T05:06:07Z"}, "data": {"x": 1}}
    rec.update(kw)
    return rec


def body(path):
    """A written file's content without its digest (after checking that the digest is its content's)."""
    rec = json.loads(Path(path).read_text())
    assert rec["digest"] == results.digest(rec)
    return {k: v for k, v in rec.items() if k != "digest"}


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
    rec = record("nb", data={"t_us": [1.5, 2.0], "name": "ünïcode", "n": 3})
    results.write(path, rec)
    sealed = dict(rec, digest=results.digest(rec))
    assert results.read(path) == sealed and list(sealed)[-1] == "digest"
    text = path.read_text()
    assert text == results.dumps(sealed) + "\n"  # readable in a diff: one key per line, a final newline
    assert [p.name for p in path.parent.iterdir()] == ["nb.json"]  # no temporary or lock file left behind


def test_write_of_a_record_larger_than_its_chunks_is_whole(tmp_path):
    path = tmp_path / "big.json"
    rec = {"data": list(range(600_000))}  # about 4.7 MB of text: several 1 MiB chunks and a partial one
    results.write(path, rec)
    assert body(path) == rec


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
        assert body(src) == {"version": "new"}  # complete before it takes the name
        assert body(dst) == {"version": "old"}
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    results.write(path, {"version": "new"})
    assert log == ["fsync", "replace"]
    assert body(path) == {"version": "new"}


def test_a_write_that_fails_midway_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "nb.json"
    results.write(path, {"version": "old"})

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        results.write(path, {"version": "new"})
    assert body(path) == {"version": "old"}
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
    assert not (tmp_path / "sub").exists()


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
    results.write(tmp_path / "nvidia-h200" / "00-m.json", record("00-m", kind="cuda", slug="nvidia-h200",
                                                                 data={"bw": 4.2}))
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


def test_measuring_on_the_cpu_is_a_smoke_run_unless_asked(repo, monkeypatch):
    import torch

    r = Run("exp", mode="measure", device="cpu", root=repo)
    assert (r.mode, r.device, r.size, r.slug) == ("measure", "cpu", "smoke", "cpu")
    assert r.path == repo / "results" / "cpu" / "exp.json" and not r.strict
    assert repr(r) == "Run('exp', mode='measure', device='cpu', size='smoke', set='cpu')"
    full = Run("exp", mode="measure", device="cpu", size="full", root=repo, results_dir=repo / "elsewhere")
    assert full.size == "full" and full.path == repo / "elsewhere" / "cpu" / "exp.json"
    if not torch.cuda.is_available():  # the device is "auto" unless given: without a GPU, auto measures nothing
        with pytest.raises(results.NoDevice, match="without a CUDA GPU: there is nothing to measure") as e:
            Run("exp", mode="measure", root=repo)
        assert "device='cpu'" in str(e.value) and "mode='replay'" in str(e.value)
        assert not (repo / "results" / "cpu").exists()
        monkeypatch.setenv("BOOK_MODE", "measure")  # what papermill -p mode measure or BOOK_MODE=measure give
        with pytest.raises(results.NoDevice):
            Run("exp", mode="auto", root=repo)
    else:
        assert Run("exp", mode="measure", root=repo).device == "cuda"


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

    results.write(repo / "results" / results.REFERENCE / "exp.json", record(kind="cuda", root=repo,
                                                                             slug=results.REFERENCE))
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
    assert list(rec) == ["schema", "notebook", "params", "code", "provenance", "elapsed_s", "data", "digest"]
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
        params={"size": "full", "n": 1}, kind="cuda", root=repo, slug=results.REFERENCE))
    r = Run("exp", mode="replay", root=repo)
    assert r.strict and (r.slug, r.size, r.device) == (results.REFERENCE, "full", "cuda")
    assert Run("exp", mode="replay", size="full", root=repo).size == "full"
    res = r.measure_or_replay({"n": 1}, measure_n)
    assert res.device == "NVIDIA H200" and res.date == "2026-03-04"
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
    results.write(res / "b-gpu" / "exp.json", record(root=repo, kind="cuda", slug="b-gpu"))
    results.write(res / "a-gpu" / "exp.json", record(root=repo, kind="cuda", slug="a-gpu"))
    results.write(res / "cpu" / "exp.json", record(root=repo))
    results.write(res / "loose.json", record(code={"sources": {}}))  # not in a device folder: not a result
    assert results.stale_results(res, repo) == []
    (repo / "lib" / "helper.py").write_text("from lib import inner\n\nSCALE = inner.TWO + 1\n")
    results.write(res / "cpu" / "exp.json", record(root=repo))  # re-measured: fresh
    assert results.stale_results(res, repo) == [(res / "a-gpu" / "exp.json", ["lib/helper.py changed"]),
                                                (res / "b-gpu" / "exp.json", ["lib/helper.py changed"])]
    monkeypatch.setattr(results, "RESULTS", res)  # the book's own results folder by default
    assert [p.parent.name for p, _ in results.stale_results(root=repo)] == ["a-gpu", "b-gpu"]


# ---------------------------------------------------------------------------- digests: what is replayed is what was written


def test_the_digest_is_the_sha256_of_the_canonical_json_without_itself():
    import hashlib

    def sha(text):
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    assert results.digest({"a": 1}) == sha('{"a":1}')
    # keys sorted, no spaces, non-ASCII escaped, nested alike; the digest key itself is left out
    assert results.digest({"b": [1.5, None], "a": {"z": "é", "y": True}, "digest": "sha256:old"}) == sha(
        '{"a":{"y":true,"z":"\\u00e9"},"b":[1.5,null]}')
    assert results.digest({"x": 1.0}) != results.digest({"x": 1})  # 1.0 and 1 are written differently


def test_an_edited_value_is_refused_with_the_file_and_the_command(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    results.write(path, record("nb", data={"median": 37.3296, "rows": [1, 2]}))
    reindented = json.loads(path.read_text())
    path.write_text(json.dumps(reindented, indent=4))  # the same values laid out otherwise: still the record
    assert results.read(path)["data"]["median"] == 37.3296
    path.write_text(path.read_text().replace("37.3296", "37.123456"))
    with pytest.raises(results.DigestMismatch) as e:
        results.read(path)
    assert str(e.value) == (
        f"{path.as_posix()} no longer matches the digest written with it: its numbers were edited or the file was "
        f"damaged since it was measured, so they cannot be replayed as measured. {results.remeasure_hint('nb', 'cpu')} "
        f"(or restore the file as committed: `git checkout -- {path.as_posix()}`).")
    assert e.value.problem.startswith("no longer matches the digest written with it")
    for edit in (lambda r: r["data"]["rows"].append(3), lambda r: r["provenance"].update(date="2027-01-01"),
                 lambda r: r.update(digest="sha256:" + "0" * 64)):
        rec = dict(reindented, data={"median": 37.3296, "rows": [1, 2]}, provenance=dict(reindented["provenance"]))
        edit(rec)
        path.write_text(json.dumps(rec))
        with pytest.raises(results.DigestMismatch):
            results.read(path)


def test_a_record_without_a_digest_is_refused_until_sealed(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    path.parent.mkdir()
    old = record("nb", data={"t_us": [3.25]})
    path.write_text(json.dumps(old, indent=1) + "\n")
    with pytest.raises(results.Unsealed) as e:
        results.read(path)
    assert str(e.value) == (
        f"{path.as_posix()} carries no digest of its data, so an edited or damaged copy could not be told from a "
        f"measurement. {results.remeasure_hint('nb', 'cpu')}, or, if it is known to hold the numbers as they were "
        "measured (a record written before records carried digests), seal it: "
        f"`python tools/book.py seal {path.as_posix()}`.")
    sealed = results.seal(path)
    assert {k: v for k, v in sealed.items() if k not in ("sealed", "digest")} == old  # the same values
    assert sealed["digest"] == results.digest(sealed) and sealed == results.read(path)
    assert "not by the measurement" in sealed["sealed"]["note"] and sealed["sealed"]["date"][:2] == "20"
    with pytest.raises(ResultsError, match="already carries a digest that matches its content: there is nothing"):
        results.seal(path)
    path.write_text(path.read_text().replace("3.25", "3.5"))
    with pytest.raises(results.DigestMismatch):  # an edited record is re-measured, never sealed
        results.seal(path)


def test_sealing_records_the_inputs_it_is_told_of(tmp_path):
    base = tmp_path / "cpu"
    results.write(base / "00-m.json", record("00-m", data={"bw": 4.2}))
    base.joinpath("01-x.json").write_text(json.dumps(record("01-x")))
    sealed = results.seal(base / "01-x.json", ["00-m"])
    assert sealed["inputs"] == {"00-m": results.read(base / "00-m.json")["digest"]}
    assert results.stale_reasons(sealed, ROOT, base / "01-x.json")[-1:] != ["its input"]  # inputs as they stand
    assert results.input_reasons(sealed, base / "01-x.json") == []
    base.joinpath("02-y.json").write_text(json.dumps(record("02-y")))
    with pytest.raises(MissingResults, match="notebook '00-z'"):
        results.seal(base / "02-y.json", ["00-z"])
    assert "digest" not in json.loads(base.joinpath("02-y.json").read_text())  # left as it was
    base.joinpath("03-z.json").write_text(json.dumps(record("other")))
    with pytest.raises(results.Misplaced):  # every other check holds before a file is sealed
        results.seal(base / "03-z.json")


def test_a_record_must_lie_where_its_provenance_says(tmp_path):
    def refused(rec, folder, name="nb"):
        path = tmp_path / folder / f"{name}.json"
        results.write(path, rec)
        with pytest.raises(results.Misplaced) as e:
            results.read(path)
        # the command that re-creates this notebook's file for the folder it lies in
        assert str(e.value) == f"{path.as_posix()} {e.value.problem}. {results.remeasure_hint(name, folder)}."
        return e.value.problem

    assert refused(record("other"), "cpu") == (
        "holds the results of notebook 'other', not of 'nb': it was copied or renamed into the wrong file")
    a100 = record("nb", kind="cuda", slug="nvidia-a100")
    a100["provenance"]["name"] = "NVIDIA A100-SXM4-80GB"
    assert refused(a100, "nvidia-h200") == (
        "was measured on NVIDIA A100-SXM4-80GB (device 'nvidia-a100'), but lies under the results of device "
        "'nvidia-h200': each device's results go in their own folder")
    assert refused(record("nb", params={"size": "smoke"}), "nvidia-h200") == (
        "holds a CPU run ('smoke' size), but lies under the results of device 'nvidia-h200': CPU runs go under "
        "results/cpu")
    claimed = record("nb")
    claimed["provenance"]["slug"] = "nvidia-h200"  # a CPU run whose slug was edited to a GPU's
    assert refused(claimed, "nvidia-h200").startswith("holds a CPU run")
    renamed = record("nb", kind="cuda", slug="nvidia-h200")
    renamed["provenance"]["name"] = "NVIDIA A100"  # the slug left, the name edited
    assert refused(renamed, "nvidia-h200") == (
        "names its device 'NVIDIA A100' (slug 'nvidia-a100'), but its provenance and folder say 'nvidia-h200'")
    renamed["provenance"]["name"] = "--"
    assert "names its device '--' (slug None)" in refused(renamed, "nvidia-h200")
    gpu_in_cpu = record("nb", kind="cuda", slug="cpu")
    assert refused(gpu_in_cpu, "cpu") == "holds a cuda run on CPU, but lies under results/cpu, where only CPU runs go"
    epyc = record("nb")
    epyc["provenance"]["name"] = "AMD EPYC 9654"  # a CPU run's folder is cpu, whatever its processor is called
    results.write(tmp_path / "cpu" / "nb.json", epyc)
    assert results.read(tmp_path / "cpu" / "nb.json")["provenance"]["name"] == "AMD EPYC 9654"
    ok = record("nb", kind="cuda", slug="nvidia-h200")
    ok["provenance"]["name"] = "NVIDIA H200"
    results.write(tmp_path / "nvidia-h200" / "nb.json", ok)
    assert results.read(tmp_path / "nvidia-h200" / "nb.json")["provenance"]["name"] == "NVIDIA H200"
    # the notebook and device a caller names count, not only the path's
    with pytest.raises(results.Misplaced, match="not of 'other'"):
        results.read(tmp_path / "nvidia-h200" / "nb.json", "other")
    with pytest.raises(results.Misplaced, match="under the results of device 'b-gpu'"):
        results.read(tmp_path / "nvidia-h200" / "nb.json", "nb", "b-gpu")


@pytest.mark.parametrize("text, where, value", [
    ('{"rows": [{"t": 1.0}, {"t": NaN}]}', "data['rows'][1]['t']", "nan"),
    ('{"x": Infinity}', "data['x']", "inf"),
    ('{"x": -Infinity}', "data['x']", "-inf"),
    ('{"x": 1e999}', "data['x']", "inf"),
])
def test_nan_and_infinity_are_refused_on_read_naming_the_key(tmp_path, text, where, value):
    path = tmp_path / "cpu" / "nb.json"
    path.parent.mkdir()
    rec = json.dumps(record("nb", data={"placeholder": 0}))
    path.write_text(rec.replace('{"placeholder": 0}', text))
    with pytest.raises(ResultsError) as e:
        results.read(path)
    assert e.value.problem == (f"holds {value} at {where}, which no measurement writes (JSON has no NaN or infinity): "
                               "it was edited or damaged")
    assert str(e.value) == (f"{path.as_posix()} {e.value.problem}. Re-measure with `papermill notebooks/nb.ipynb "
                            "notebooks/nb.ipynb -p mode measure -p device cpu`.")
    params_nan = json.dumps(record("nb", params={"size": "smoke", "k": 0})).replace('"k": 0', '"k": NaN')
    path.write_text(params_nan)
    with pytest.raises(ResultsError, match=r"holds nan at params\['k'\]"):
        results.read(path)


@pytest.mark.parametrize("edit, problem", [
    (lambda r: r.update(params=[1]), "is not a results file: params should be JSON objects"),
    (lambda r: r.update(data=[1, 2, 3], code="x"), "is not a results file: code, data should be JSON objects"),
    (lambda r: r.update(notebook=3), "is not a results file: notebook should be a string and JSON objects"),
    (lambda r: r.update(params=[1], notebook=3),  # the string first, as the sentence says
     "is not a results file: notebook, params should be a string and JSON objects"),
    (lambda r: r["provenance"].pop("slug"), "has no provenance slug (the device and date it was measured on)"),
    (lambda r: r["provenance"].update(kind=None, date=5),
     "has no provenance kind, date (the device and date it was measured on)"),
    (lambda r: r.update(inputs=["00-m"]), "has inputs that are not a JSON object of notebook names and digests"),
    (lambda r: r.update(inputs={"00-m": 1}), "has inputs that are not a JSON object of notebook names and digests"),
])
def test_a_malformed_record_is_a_clear_error(tmp_path, edit, problem):
    path = tmp_path / "cpu" / "nb.json"
    rec = record("nb")
    edit(rec)
    results.write(path, rec)  # with a valid digest: the shape itself is wrong
    with pytest.raises(ResultsError) as e:
        results.read(path)
    assert str(e.value) == f"{path.as_posix()} {problem}. {results.remeasure_hint('nb', 'cpu')}."


def test_an_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    path.mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(ResultsError) as e:
        results.read(path)
    assert str(e.value) == (f"{path.as_posix()} cannot be read (Is a directory). Re-measure with `papermill "
                            "notebooks/nb.ipynb notebooks/nb.ipynb -p mode measure -p device cpu`.")
    deep = tmp_path / "cpu" / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ResultsError, match="is not valid JSON"):
        results.read(deep)


# ---------------------------------------------------------------------------- writing what JSON can hold


def test_a_value_json_cannot_hold_is_named_by_its_key():
    import numpy as np

    assert results.unwritable({"a": [1, 2.5, "s", None, True, {"b": (1, 2)}], 3: "int key"}) is None
    assert results.unwritable({"x": np.float64(1.5)}) is None  # a float subclass: written as a float
    assert results.unwritable({"data": {"rows": [{"t": 1.0}, {"t": float("nan")}]}}) == (
        "data['rows'][1]['t'] holds nan: JSON has no NaN or infinity (store None, or leave the value out, and say "
        "why in the data)")
    assert results.unwritable({"x": [float("-inf")]}).startswith("x[0] holds -inf: ")
    assert results.unwritable({"x": np.float32(1.5)}) == (
        "x holds a numpy.float32 (np.float32(1.5)), which a results file cannot hold: convert it with float(), "
        "int() or str() (.tolist() for an array)")
    assert results.unwritable({"d": {"n": np.int64(3)}}).startswith("d['n'] holds a numpy.int64 (")
    assert results.unwritable({"d": np.bool_(True)}).startswith("d holds a numpy.bool")
    assert results.unwritable({"d": {(1, 2): 3}}) == "d has a key (1, 2) of type tuple: keys of a results file are strings"
    assert results.unwritable({True: 1}) == "the record has a key True of type bool: keys of a results file are strings"
    assert results.unwritable(float("nan")).startswith("the record holds nan")
    assert results.unwritable(object()).startswith("the record holds a builtins.object")


def test_write_names_the_key_refuses_non_objects_and_writes_readable_files(tmp_path):
    import numpy as np

    with pytest.raises(results.UnwritableValue) as e:
        results.write(tmp_path / "cpu" / "nb.json", {"data": {"t_us": [1.0, np.float32(2.0)]}})
    assert str(e.value).startswith(f"{(tmp_path / 'cpu' / 'nb.json').as_posix()} was not written: data['t_us'][1] "
                                   "holds a numpy.float32")
    assert isinstance(e.value, ValueError) and isinstance(e.value, ResultsError)
    with pytest.raises(TypeError, match="a results file holds a JSON object: write\\(\\) was given a list"):
        results.write(tmp_path / "l.json", [1, 2, 3])
    old = os.umask(0o077)  # even under a private umask: results are read by others
    try:
        results.write(tmp_path / "cpu" / "nb.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "cpu" / "nb.json").stat().st_mode & 0o777 == 0o644
    rec = {"digest": "sha256:stale", "a": (1, 2), 3: "x"}  # as a reader sees it: lists, string keys, a new digest
    results.write(tmp_path / "t.json", rec)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written == {"a": [1, 2], "3": "x", "digest": results.digest({"a": [1, 2], "3": "x"})}
    assert list(written) == ["a", "3", "digest"]  # the digest last, whatever the record held


# ---------------------------------------------------------------------------- one writer at a time


def hold(path):
    """Hold ``path``'s write lock from another open file, as another process would."""
    import fcntl

    lock_file = path.with_name(f".{path.name}.lock")
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    f = open(lock_file, "w")  # noqa: SIM115
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write("pid 4242, since 2026-01-01T00:00:00Z\n")
    f.flush()
    return f


def test_a_second_writer_is_refused_and_the_lock_goes_with_the_first(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    results.write(path, {"v": 1})
    holder = hold(path)
    try:
        with pytest.raises(results.WriteInProgress) as e:
            results.write(path, {"v": 2})
        assert str(e.value) == (
            f"{path.as_posix()} is being written by another process (pid 4242, since 2026-01-01T00:00:00Z): two "
            "measurements of one notebook at once would disturb each other's timings, and the last to finish would "
            "replace the other's file. Wait for it to finish (or stop it), then run this again.")
        assert json.loads(path.read_text())["v"] == 1
        assert [k for k, _, _ in results.audit(tmp_path) if k == "leftover"] == []  # a held lock is no leftover
    finally:
        holder.close()
    assert [(k, p.name) for k, p, _ in results.audit(tmp_path) if k == "leftover"] == [("leftover", ".nb.json.lock")]
    results.write(path, {"v": 2})  # the holder is gone: the write goes through and removes the lock file
    assert json.loads(path.read_text())["v"] == 2 and [p.name for p in path.parent.iterdir()] == ["nb.json"]


def test_the_lock_nests_within_a_process_and_is_released_on_error(tmp_path):
    path = tmp_path / "cpu" / "nb.json"
    with results.lock(path):
        assert path.with_name(".nb.json.lock").exists()
        with results.lock(path):
            results.write(path, {"v": 1})
        results.write(path, {"v": 2})
        assert path.with_name(".nb.json.lock").exists()  # still held by the outer hold
    assert not path.with_name(".nb.json.lock").exists()
    with pytest.raises(KeyError), results.lock(path):
        raise KeyError("boom")
    holder = hold(path)  # released: another holder can take it
    holder.close()


def test_a_lock_file_deleted_by_the_holder_it_was_waiting_for_is_taken_afresh(tmp_path, monkeypatch):
    path = tmp_path / "nb.json"
    lock_file = path.with_name(".nb.json.lock")
    real_flock, calls = results.fcntl.flock, []

    def flock(fd, op):  # the first lock is taken on a file that its old holder has just deleted
        real_flock(fd, op)
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:
            os.unlink(lock_file)

    monkeypatch.setattr(results.fcntl, "flock", flock)
    with results.lock(path):
        assert lock_file.exists() and os.stat(lock_file).st_ino == calls[-1]
    assert len(calls) == 2


def test_a_folder_that_takes_no_lock_stops_before_measuring(repo, monkeypatch):
    real_open = os.open

    def no_lock(file, *a, **k):
        if str(file).endswith(".lock"):
            raise PermissionError(13, "Permission denied")
        return real_open(file, *a, **k)

    monkeypatch.setattr(os, "open", no_lock)
    run = Run("exp", mode="measure", device="cpu", root=repo)
    with pytest.raises(ResultsError) as e:
        run.measure_or_replay({"n": 1}, lambda p, d: pytest.fail("nothing is measured that cannot be written"))
    assert str(e.value) == (
        f"{run.path.as_posix()} cannot be written: its folder does not take the write lock ([Errno 13] Permission "
        f"denied). Make {run.path.parent.as_posix()} writable, or write the results elsewhere (--results-dir), then "
        "run this again.")


def test_a_read_only_lock_file_a_killed_writer_left_is_named_not_the_folder(tmp_path, monkeypatch):
    """A lock file that exists but cannot be opened for writing, in a writable folder: the message names the
    lock file and says to delete it (no process holds it), not to make the folder writable. (As root a mode
    0444 file still opens for writing, so the refusal is simulated.)"""
    path = tmp_path / "cpu" / "exp.json"
    path.parent.mkdir()
    lock_file = path.with_name(".exp.json.lock")
    lock_file.write_text("pid 1, since then\n")
    lock_file.chmod(0o444)
    real_open = os.open

    def read_only(file, flags, *a, **k):
        if Path(file) == lock_file and flags & (os.O_RDWR | os.O_WRONLY):
            raise PermissionError(13, "Permission denied")
        return real_open(file, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ResultsError) as e:
        results.write(path, {"x": 1})
    assert str(e.value) == (
        f"{path.as_posix()} cannot be written: its lock file {lock_file.as_posix()} cannot be opened for writing "
        f"(Permission denied), though its folder is writable; no process holds it, so a writer that was killed left "
        f"it: delete {lock_file.as_posix()}, then run this again.")
    assert not path.exists()


def test_a_measurement_is_refused_at_once_while_another_writes_its_file(repo):
    holder = hold(repo / "results" / "cpu" / "exp.json")
    try:
        with pytest.raises(results.WriteInProgress, match="pid 4242"):
            Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay(
                {"n": 1}, lambda p, d: pytest.fail("refused before measuring"))
    finally:
        holder.close()


def test_a_write_deletes_what_killed_writers_of_that_file_left(tmp_path):
    folder = tmp_path / "cpu"
    folder.mkdir()
    mine = [folder / ".nb.json.a1b2c3d_.tmp", folder / ".nb.json.zzzzzzzz.tmp"]
    others = [folder / ".nb.json.x.tmp", folder / ".nb.json2.abcdefgh.tmp", folder / ".other.json.abcdefgh.tmp"]
    for p in mine + others:
        p.write_text("partial")
    assert [k for k, _, _ in results.audit(tmp_path)] == ["leftover"] * 5
    results.write(folder / "nb.json", {"v": 1})
    assert sorted(p.name for p in folder.iterdir()) == sorted(["nb.json"] + [p.name for p in others])


# ---------------------------------------------------------------------------- a failed write keeps the measurement


def test_a_measurement_that_cannot_be_written_is_kept_and_its_key_named(repo, capsys):
    import numpy as np

    run = Run("exp", mode="measure", device="cpu", root=repo)
    with pytest.raises(results.WriteFailed) as e:
        run.measure_or_replay({"n": 1}, lambda p, d: {"rows": [{"t_us": 1.5}, {"t_us": float("nan")}]})
    kept = e.value.rescue
    assert kept.parent == repo / "results" / "cpu" and kept.name.startswith("exp.json.rescued-20")
    assert str(e.value) == (
        "the measurement of exp on cpu finished, but results/cpu/exp.json could not be written: "
        f"{results.unwritable({'data': {'rows': [{}, {'t_us': float('nan')}]}})}. The measured record is kept in "
        f"results/cpu/{kept.name}, to look at (it is not replayed). Fix what stopped the write, then re-measure "
        "with `papermill notebooks/exp.ipynb notebooks/exp.ipynb -p mode measure -p device cpu`.")
    assert "data['rows'][1]['t_us'] holds nan" in str(e.value)
    rescued = json.loads(kept.read_text())  # NaN and all: kept to be looked at
    assert rescued["data"]["rows"][0] == {"t_us": 1.5} and rescued["notebook"] == "exp"
    assert kept.stat().st_mode & 0o777 == 0o644
    assert not run.path.exists()
    assert [(k, p.name) for k, p, _ in results.audit(repo / "results", repo)] == [("rescued", kept.name)]

    with pytest.raises(results.WriteFailed, match=r"data\['x'\] holds a numpy\.int64") as e:
        run.measure_or_replay({"n": 1}, lambda p, d: {"x": np.int64(3), "a": np.arange(2)})
    assert json.loads(e.value.rescue.read_text())["data"] == {"x": 3, "a": [0, 1]}
    with pytest.raises(results.WriteFailed, match="the measurement returned a list, not a dict of data"):
        run.measure_or_replay({"n": 1}, lambda p, d: [1, 2])
    with pytest.raises(results.WriteFailed, match=r"data has a key \(1, 2\) of type tuple"):  # lenient: repr
        run.measure_or_replay({"n": 1}, lambda p, d: {(1, 2): 3})


def test_a_write_the_disk_refuses_keeps_the_measurement_beside_or_elsewhere(repo, monkeypatch, tmp_path_factory):
    run = Run("exp", mode="measure", device="cpu", root=repo)
    real_replace, real_mkstemp = os.replace, results.tempfile.mkstemp

    def full(src, dst):  # the results file's rename fails as on a full disk; other renames go through
        if Path(dst) == run.path:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(results.WriteFailed, match=r"could not be written: OSError: \[Errno 28\] No space") as e:
        run.measure_or_replay({"n": 1}, lambda p, d: {"x": 7})
    assert e.value.rescue.parent == run.path.parent and json.loads(e.value.rescue.read_text())["data"] == {"x": 7}
    assert not run.path.exists() and [p.name for p in run.path.parent.iterdir()] == [e.value.rescue.name]
    e.value.rescue.unlink()

    elsewhere = tmp_path_factory.mktemp("system-tmp")
    monkeypatch.setattr(results.tempfile, "gettempdir", lambda: str(elsewhere))

    def read_only_folder(*a, dir=None, **k):  # no new file can be made in the results folder
        if Path(dir) == run.path.parent:
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(results.tempfile, "mkstemp", read_only_folder)
    with pytest.raises(results.WriteFailed) as e:
        run.measure_or_replay({"n": 1}, lambda p, d: {"x": 8})
    assert e.value.rescue.parent == elsewhere and json.loads(e.value.rescue.read_text())["data"] == {"x": 8}
    assert f"kept in {e.value.rescue.as_posix()}," in str(e.value)
    monkeypatch.setattr(results.tempfile, "gettempdir", lambda: str(run.path.parent))  # nowhere to go
    with pytest.raises(results.WriteFailed) as e:
        run.measure_or_replay({"n": 1}, lambda p, d: {"x": 9})
    assert e.value.rescue is None
    assert f"No rescue file could be written either (no rescue file could be written beside {run.path.as_posix()} or " \
        f"in {run.path.parent.as_posix()}). Fix what stopped the write" in str(e.value)
    assert [p.name for p in run.path.parent.iterdir()] == [], "a failed write or rescue left a file behind"


def test_a_write_cut_by_a_file_size_limit_leaves_no_partial_file_anywhere(repo, monkeypatch, tmp_path_factory):
    """Past the process's file size limit every write fails part-way (EFBIG): the results file, the rescue
    beside it and the one in the temporary folder. None may stay behind truncated, and check-fresh, which
    lists rescue files as measurements kept, must find nothing."""
    import resource

    elsewhere = tmp_path_factory.mktemp("system-tmp")
    monkeypatch.setattr(results.tempfile, "gettempdir", lambda: str(elsewhere))
    run = Run("exp", mode="measure", device="cpu", root=repo)
    results.write(run.path, record("exp", data={"x": "old"}))
    old = run.path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))  # 64 KiB; the record is about 1 MB
    try:
        with pytest.raises(results.WriteFailed, match="File too large") as e:
            run.measure_or_replay({"n": 1}, lambda p, d: {"x": list(range(150_000))})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert e.value.rescue is None and "No rescue file could be written either" in str(e.value)
    assert run.path.read_bytes() == old
    assert [p.name for p in run.path.parent.iterdir()] == [run.path.name]
    assert list(elsewhere.iterdir()) == []
    assert [kind for kind, _, _ in results.audit(repo / "results", repo)] == ["stale"]  # the fake record only


# ---------------------------------------------------------------------------- derived results record their inputs


def test_a_measurement_records_the_digests_of_the_results_it_loads(repo):
    res = repo / "results"
    results.write(res / "cpu" / "00-m.json", record("00-m", data={"bw": 4.2}))
    results.write(res / "other-gpu" / "00-m.json", record("00-m", kind="cuda", slug="other-gpu"))
    ch0 = results.read(res / "cpu" / "00-m.json")["digest"]
    run = Run("exp", mode="measure", device="cpu", root=repo)
    run.measure_or_replay({"n": 1}, measure_n)
    assert "inputs" not in results.read(run.path)
    assert results.load("00-m", "cpu", res)["data"] == {"bw": 4.2}  # after the measurement: written again
    rec = results.read(run.path)
    assert rec["inputs"] == {"00-m": ch0} and rec["data"]["x"] == 2
    inode = run.path.stat().st_ino  # a write replaces the file: a new inode
    results.load("00-m", "cpu", res)  # the same again: nothing to write
    results.load("00-m", "other-gpu", res)  # another set's file is not this run's input
    results.load("exp", "cpu", res)  # nor is its own
    assert results.read(run.path) == rec and run.path.stat().st_ino == inode

    before = Run("exp", mode="measure", device="cpu", root=repo)
    results.load("00-m", "cpu", res)  # before measuring: recorded with the first write
    before.measure_or_replay({"n": 2}, measure_n)
    assert results.read(before.path)["inputs"] == {"00-m": ch0}
    elsewhere = Run("exp", mode="measure", device="cpu", root=repo, results_dir=repo / "elsewhere")
    results.write(repo / "elsewhere" / "cpu" / "00-m.json", record("00-m"))
    results.load("00-m", "cpu", res)  # the same slug in another results folder: not its input
    elsewhere.measure_or_replay({"n": 2}, measure_n)
    assert "inputs" not in results.read(elsewhere.path)


def test_a_changed_input_makes_a_replay_warn_and_check_fresh_list_it(repo, capsys):
    res = repo / "results"
    results.write(res / "cpu" / "00-m.json", record("00-m", data={"bw": 4.2}))
    Run("exp", mode="measure", device="cpu", root=repo).measure_or_replay({"n": 1}, measure_n)
    results.load("00-m", "cpu", res)
    path = res / "cpu" / "exp.json"
    assert [found for found in results.audit(res, repo) if found[1] == path] == []
    capsys.readouterr()
    replay = Run("exp", mode="replay", reference="cpu", root=repo)
    replay.measure_or_replay({"n": 1}, measure_n)
    results.load("00-m", "cpu", res)
    assert replay.stale_inputs == [] and capsys.readouterr().err == ""

    results.write(res / "cpu" / "00-m.json", record("00-m", data={"bw": 8.4}))  # re-measured (or doubled)
    new = results.read(res / "cpu" / "00-m.json")["digest"]
    old = results.read(path)["inputs"]["00-m"]
    reason = f"its input results/cpu/00-m.json changed since it was measured (digest {old[7:19]} then, {new[7:19]} now)"
    assert results.stale_reasons(results.read(path), repo, path) == [reason]
    assert results.stale_reasons(results.read(path), repo) == []  # without the path, the code alone
    assert [found for found in results.audit(res, repo) if found[1] == path] == [("stale", path, [reason])]
    assert (path, [reason]) in results.stale_results(res, repo)
    replay = Run("exp", mode="replay", reference="cpu", root=repo)
    replay.measure_or_replay({"n": 1}, measure_n)
    results.load("00-m", "cpu", res)
    assert replay.stale_inputs == ["results/cpu/00-m.json changed since it was measured beside it"]
    assert capsys.readouterr().err == (
        "WARNING: results/cpu/exp.json is stale: results/cpu/00-m.json changed since it was measured beside it. What "
        f"this notebook derives from both may not hold. {results.remeasure_hint('exp', 'cpu')}.\n")

    (res / "cpu" / "00-m.json").unlink()
    [reason] = results.stale_reasons(results.read(path), repo, path)
    assert reason == ("its input results/cpu/00-m.json cannot be read (does not exist: there are no results of "
                      "notebook '00-m' for device 'cpu' to replay)")


def test_a_replay_that_records_no_inputs_says_it_cannot_tell(repo, capsys):
    res = repo / "results"
    results.write(res / "cpu" / "00-m.json", record("00-m"))
    results.write(res / "cpu" / "exp.json", record(root=repo, params={"size": "smoke", "n": 1}))
    capsys.readouterr()
    replay = Run("exp", mode="replay", reference="cpu", root=repo)
    results.load("00-m", "cpu", res)
    assert replay.stale_inputs == ["it records no digest of results/cpu/00-m.json, so it cannot tell whether that "
                                   "file is the one it was measured beside"]
    assert capsys.readouterr().err.startswith("WARNING: results/cpu/exp.json is stale: it records no digest of ")


def test_audit_lists_damaged_stale_leftover_and_rescued_files_in_order(repo):
    res = repo / "results"
    results.write(res / "a-gpu" / "exp.json", record(root=repo, kind="cuda", slug="a-gpu"))
    results.write(res / "b-gpu" / "exp.json", record(root=repo, kind="cpu"))  # a CPU run in a GPU's folder
    (res / "cpu").mkdir()
    (res / "cpu" / "exp.json").write_text(json.dumps(record(root=repo)))  # no digest
    (res / "cpu" / ".exp.json.abcdefgh.tmp").write_text("{")
    (res / "cpu" / "exp.json.rescued-20260101T000000Z").write_text("{}")
    found = [(k, p.relative_to(res).as_posix(), r[0][:30]) for k, p, r in results.audit(res, repo)]
    assert found == [
        ("damaged", "b-gpu/exp.json", "holds a CPU run ('smoke' size)"),
        ("damaged", "cpu/exp.json", "carries no digest of its data,"),
        ("leftover", "cpu/.exp.json.abcdefgh.tmp", "a temporary file of a write th"),
        ("rescued", "cpu/exp.json.rescued-20260101T000000Z", "a measurement whose write fail"),
    ]
    assert [p.parent.name for p, _ in results.stale_results(res, repo)] == ["b-gpu", "cpu"]


def test_a_rescue_file_keeps_what_json_cannot_hold_under_a_plain_name(tmp_path, monkeypatch):
    """A rescue file is named by a compact UTC stamp (no ':' for make, scp or Windows to trip on); an object
    JSON cannot hold is kept by its repr, and a record json cannot write at all (a tuple key) as a whole repr."""
    import numpy as np

    class Thing:
        def __repr__(self):
            return "Thing(3)"

    monkeypatch.setattr(results, "_now", lambda: "2026-05-06T07:08:09Z")
    path = tmp_path / "cpu" / "exp.json"
    path.parent.mkdir()
    kept = results.rescue(path, {"data": {"obj": Thing(), "x": np.float32(1.5), "v": np.arange(2)}})
    assert kept == tmp_path / "cpu" / "exp.json.rescued-20260506T070809Z"
    assert json.loads(kept.read_text()) == {"data": {"obj": "Thing(3)", "x": 1.5, "v": [0, 1]}}
    kept = results.rescue(tmp_path / "cpu" / "tup.json", {"data": {(1, 2): 3.5}})
    assert kept.name == "tup.json.rescued-20260506T070809Z"
    assert kept.read_text() == "{'data': {(1, 2): 3.5}}\n"


def test_stamps_are_utc_whatever_the_local_time_zone():
    """_now (lock files, seals, rescue names) ends in Z: it is UTC even where local time is 5:30 ahead."""
    import calendar
    import time

    was = os.environ.get("TZ")
    os.environ["TZ"] = "IST-05:30"
    time.tzset()
    try:
        before = time.time()
        stamp = results._now()
        after = time.time()
    finally:
        if was is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = was
        time.tzset()
    at = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) - 1 <= at <= after + 1, (stamp, before)


def test_every_input_is_checked_past_one_that_cannot_be_read(tmp_path):
    """Inputs are checked in name order; a missing 00-a does not hide that 00-b changed, nor that 00-c did not."""
    base = tmp_path / "cpu"
    results.write(base / "00-b.json", record("00-b"))
    results.write(base / "00-c.json", record("00-c"))
    now_b, now_c = (results.read(base / f"{n}.json")["digest"] for n in ("00-b", "00-c"))
    was_b = "sha256:" + "0" * 64
    reasons = results.input_reasons({"inputs": {"00-c": now_c, "00-b": was_b, "00-a": was_b}}, base / "exp.json")
    assert [r.split(" (")[0] for r in reasons] == [
        f"its input {(base / '00-a.json').as_posix()} cannot be read",
        f"its input {(base / '00-b.json').as_posix()} changed since it was measured"]
    assert reasons[1].endswith(f"(digest 000000000000 then, {now_b[7:19]} now)")


def test_dumps_keeps_a_list_of_scalars_on_one_line_and_the_values_unchanged():
    from lib.bench import results as store

    value = {"steps": [[0.5, 1, None, True, "x"], [2.0, 3, None, False, "y"]], "empty": {}, "none": [],
             "nested": {"series": [1, 2, 3], "mixed": [1, [2, 3]]}}
    text = store.dumps(value)
    assert json.loads(text) == value
    assert '  [0.5, 1, null, true, "x"],\n' in text and '"series": [1, 2, 3]' in text
    assert json.loads(store.dumps([])) == [] and store.dumps(7) == "7"
