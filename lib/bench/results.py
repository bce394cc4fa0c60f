"""Measure or replay: the results store every chapter's numbers go through.

A notebook creates a ``Run`` from its papermill parameters and calls ``run.measure_or_replay``:

- measure: the experiment runs on this machine and its data is written to
  ``results/<device-slug>/<notebook>.json`` atomically (temporary file, then rename: an
  interrupted run never damages earlier results), with provenance, the parameters, and a
  fingerprint of the code that produced it.
- replay: the reference set's file is loaded instead. Requested parameters must equal the stored
  ones; a missing file, a corrupt file or a parameter mismatch stops with an error that names the
  file and the command that re-measures it.
- A result whose code fingerprint no longer matches the current code is stale: the notebook prints
  a visible warning, and ``audit`` (``make check-fresh``) lists it.

The fingerprint (``lib.bench.fingerprint``) covers the notebook's code cells tagged ``measure`` and
every lib module they use, found from the imports (the import closure), as code only: docstrings and
comments do not count. Chapters: all (DESIGN of the book; chapter 0 introduces it).

The store verifies what it replays:

- Every record carries a ``digest``: the SHA-256 of its canonical JSON (keys sorted, no spaces, the
  digest itself left out), computed by ``write`` and checked by ``read``. A hand edit or a damaged copy
  no longer matches and is refused, with the command that re-measures it. A record written before
  records carried digests is refused too, until ``seal`` adds the digest of its data as it stands (and
  says in the record that it was sealed, not written by the measurement).
- A record must lie where its provenance says: its ``notebook`` is the file's name, its device slug is
  the folder's, the slug is what the device's name gives, and a CPU run is never under a GPU's slug.
  NaN and infinities are refused on read as on write; every malformed file is a clear error.
- A result derived from another notebook's (chapters 1-5 read chapter 0's ceilings through
  ``ceilings.load``, chapter 2 reads chapter 1's measurements) records that file's digest under
  ``inputs``: the latest ``Run`` of the same set is told of every ``load`` of another notebook's
  results. A replay whose input changed since it was measured warns, and ``audit`` (``make
  check-fresh``) lists it as stale.
- Writes take a lock file (``.<name>.lock``, an ``flock``): a second writer of the same file is refused
  at once, and a measurement takes the lock before it starts. Under the lock, temporary files that a
  killed writer left are deleted; ``audit`` lists any it finds. Files are written with mode 0644.
- A measurement whose write fails (a NaN, a numpy scalar, a full disk, a read-only folder) is kept in a
  rescue file beside the target (or in the system's temporary folder), named in the error, and a value
  JSON cannot hold is named by its key.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lib.bench import fingerprint
from lib.bench.device import ROOT
from lib.bench.device import slug as device_slug

SCHEMA = 1
REFERENCE = "nvidia-h200"  # the results set the committed book replays
RESULTS = ROOT / "results"
MODES = ("auto", "measure", "replay")
MODE_ENV = "BOOK_MODE"  # overrides what mode="auto" picks (the test suite replays, even on a GPU)
SIZES = ("auto", "full", "smoke")
KEYS = ("schema", "notebook", "params", "code", "provenance", "data")  # what every results record holds
PROVENANCE_KEYS = ("name", "kind", "slug", "date")  # what a replay and the checks of a record's place read
FILE_MODE = 0o644  # results are data others read: readable by all, writable by the owner


class ResultsError(RuntimeError):
    """A results file cannot serve this run; the message says which file and what to run.

    ``problem`` is the middle of the message, without the file's name and the command (what
    ``audit`` lists)."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or message


class MissingResults(ResultsError):
    pass


class ParameterMismatch(ResultsError):
    pass


class DigestMismatch(ResultsError):
    """The record's content no longer matches the digest written with it: edited or damaged."""


class Unsealed(ResultsError):
    """The record carries no digest (written before records had one): re-measure it, or ``seal`` it."""


class Misplaced(ResultsError):
    """The record names another notebook or device than the path it lies at."""


class UnwritableValue(ResultsError, ValueError):
    """A value JSON cannot hold (NaN, infinity, a numpy scalar, an object): its key is named."""


class NoDevice(RuntimeError):
    """Measuring was asked for where there is no GPU, and no device was named: nothing is measured or written."""


class WriteInProgress(ResultsError):
    """Another process holds the file's write lock."""


class WriteFailed(ResultsError):
    """A measurement finished but could not be written; ``rescue`` is where its record was kept."""

    def __init__(self, message: str, rescue: Path | None):
        super().__init__(message)
        self.rescue = rescue


def show(path: Path, root: Path = ROOT) -> str:
    """A path as the book prints it: relative to the repository when it lies inside it."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return Path(path).as_posix()


def remeasure_hint(notebook: str, slug: str, extra: str = "") -> str:
    """The sentence that tells how to produce a notebook's results for a device."""
    cmd = f"papermill notebooks/{notebook}.ipynb notebooks/{notebook}.ipynb -p mode measure{extra}"
    if slug == "cpu":
        return f"Re-measure with `{cmd} -p device cpu`"
    return f"Re-measure on a {slug} GPU with `make measure` (or this notebook alone: `{cmd}`)"


def path_for(notebook: str, slug: str, results_dir: str | Path | None = None) -> Path:
    return Path(results_dir or RESULTS) / slug / f"{notebook}.json"


# ---------------------------------------------------------------------------- values JSON can hold

def _where(parent: str, key) -> str:
    return str(key) if not parent else f"{parent}[{key!r}]"


def unwritable(obj, where: str = "") -> str | None:
    """The first value under ``obj`` that a results file cannot hold, with its key, as a sentence; None if
    every value is JSON: dicts with string (or int) keys, lists, tuples, strings, finite numbers, bools, None.

    NaN and infinities are refused (JSON has no such numbers, and a replay must see what was measured); so
    is anything else, such as numpy's int64, float32 or bool_, which are not Python numbers (numpy's
    float64 is a float, and is written as one)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                return (f"{where or 'the record'} has a key {key!r} of type {type(key).__name__}: keys of a "
                        "results file are strings")
            found = unwritable(value, _where(where, key))
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            found = unwritable(value, _where(where, i))
            if found:
                return found
        return None
    if obj is None or isinstance(obj, (str, bool)):
        return None
    if isinstance(obj, (int, float)):  # numpy.float64 is a float: written as one
        if isinstance(obj, float) and not math.isfinite(obj):
            return (f"{where or 'the record'} holds {obj!r}: JSON has no NaN or infinity (store None, or leave "
                    "the value out, and say why in the data)")
        return None
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    return (f"{where or 'the record'} holds a {kind} ({obj!r}), which a results file cannot hold: convert it "
            "with float(), int() or str() (.tolist() for an array)")


def _nonfinite(obj, where: str = "") -> tuple[str, float] | None:
    """The key and value of the first NaN or infinity in parsed JSON (``json`` reads NaN, Infinity, 1e999)."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list):
        items = enumerate(obj)
    else:
        return (where, obj) if isinstance(obj, float) and not math.isfinite(obj) else None
    for key, value in items:
        found = _nonfinite(value, _where(where, key))
        if found:
            return found
    return None


# ---------------------------------------------------------------------------- digests

def digest(record: dict) -> str:
    """``sha256:<hex>`` of the record's canonical JSON: keys sorted, no spaces, ASCII, its own ``digest``
    left out. The same values give the same digest however the file is indented."""
    body = {k: v for k, v in record.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- code fingerprint and inputs

def stale_reasons(record: dict, root: Path = ROOT, path: str | Path | None = None) -> list[str]:
    """Why a record's numbers may no longer be what its code measures: which sources of its measuring code
    (``lib.bench.fingerprint``: the notebook's measure cells and their import closure) changed, appeared or
    vanished since it was measured; and, given the record's ``path``, which of its ``inputs`` (other
    notebooks' results of the same folder that it was derived from) changed since."""
    scheme = record["code"].get("scheme", "text")
    if scheme != fingerprint.SCHEME:
        reasons = [f"it was fingerprinted by an older scheme ({scheme!r}: measuring files listed by hand), which "
                   "cannot tell what its code is now"]
    else:
        try:
            now = fingerprint.fingerprint(record["notebook"], root)
        except (OSError, ValueError, KeyError, SyntaxError, json.JSONDecodeError) as e:
            reasons = [f"its measuring code cannot be read ({e})"]
        else:
            reasons = fingerprint.changes(record["code"], now)
    if path is not None:
        reasons += input_reasons(record, Path(path), root)
    return reasons


def input_reasons(record: dict, path: Path, root: Path = ROOT) -> list[str]:
    """Which of the results a record was derived from (its ``inputs``: notebook -> digest, read from the
    record's own folder) are not what they were when it was measured."""
    reasons = []
    for notebook, was in sorted(record.get("inputs", {}).items()):
        other = path.parent / f"{notebook}.json"
        try:
            now = read(other, notebook, path.parent.name)["digest"]
        except ResultsError as e:
            reasons.append(f"its input {show(other, root)} cannot be read ({e.problem})")
            continue
        if now != was:
            reasons.append(f"its input {show(other, root)} changed since it was measured (digest {was[7:19]} then, "
                           f"{now[7:19]} now)")
    return reasons


def audit(results_dir: str | Path | None = None, root: Path = ROOT) -> list[tuple[str, Path, list[str]]]:
    """Everything under ``results_dir`` that ``make check-fresh`` reports, as (kind, path, reasons):

    - "damaged": a results file that ``read`` refuses (a digest that no longer matches, no digest, the
      wrong place, NaN, not a results file);
    - "stale": a results file whose code or inputs changed since it was measured (``stale_reasons``);
    - "leftover": a temporary file or an unheld lock file that a killed writer left;
    - "rescued": a measurement kept after its write failed (``Run.measure_or_replay``)."""
    base = Path(results_dir or RESULTS)
    if not base.is_dir():
        what = "does not exist" if not base.exists() else "is not a folder"
        raise ResultsError(f"{show(base)} {what}: there are no results there to check. Name the folder that holds "
                           "one folder of results per device (the repository's results/ by default).")
    out = []
    for path in sorted(base.glob("*/*.json")):
        try:
            record = read(path)
        except ResultsError as e:
            out.append(("damaged", path, [e.problem]))
            continue
        reasons = stale_reasons(record, root, path)
        if reasons:
            out.append(("stale", path, reasons))
    for path in sorted(base.rglob(".*.tmp")):
        out.append(("leftover", path, ["a temporary file of a write that did not finish (its writer was killed): "
                                       "the next write of its results deletes it, or delete it by hand"]))
    for path in sorted(base.rglob(".*.lock")):
        if not _held_elsewhere(path):
            out.append(("leftover", path, ["the lock file of a writer that was killed: delete it"]))
    for path in sorted(base.rglob("*.rescued-*")):
        out.append(("rescued", path, ["a measurement whose write failed, kept so that its numbers are not lost "
                                      "(not a results file): re-measure once the cause is fixed, then delete it"]))
    return out


def stale_results(results_dir: str | Path | None = None, root: Path = ROOT) -> list[tuple[Path, list[str]]]:
    """Every results file under ``results_dir`` that cannot be replayed as fresh: its code or inputs changed
    since it was measured, or it is damaged (``audit``'s "stale" and "damaged")."""
    return [(path, reasons) for kind, path, reasons in audit(results_dir, root) if kind in ("stale", "damaged")]


# ---------------------------------------------------------------------------- the write lock

_held: dict[str, int] = {}  # lock files this process holds, with how many nested holds


def _lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _held_elsewhere(lock_file: Path) -> bool:
    """Whether another process holds this lock file now."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def lock(path: str | Path) -> Iterator[None]:
    """Hold the write lock of results file ``path`` (``.<name>.lock`` beside it, an ``flock``, which the
    system releases when its holder dies). A second holder, in another process, is refused at once with
    ``WriteInProgress``; within one process the lock nests (a measurement holds it while it writes)."""
    path = Path(path)
    lock_file = _lock_path(path)
    key = str(lock_file.resolve() if lock_file.parent.exists() else lock_file.absolute())
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise WriteInProgress(
                    f"{show(path)} is being written by another process ({holder}): two measurements of one "
                    "notebook at once would disturb each other's timings, and the last to finish would replace "
                    "the other's file. Wait for it to finish (or stop it), then run this again.") from None
            try:  # the holder that just let go may have deleted the file: then lock the new one
                same = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
    except OSError as e:
        if lock_file.exists() and os.access(path.parent, os.W_OK | os.X_OK):
            why = ("another process holds it: wait for that writer to finish (or stop it)" if _held_elsewhere(lock_file)
                   else f"no process holds it, so a writer that was killed left it: delete {show(lock_file)}")
            raise ResultsError(f"{show(path)} cannot be written: its lock file {show(lock_file)} cannot be opened for "
                               f"writing ({e.strerror or e}), though its folder is writable; {why}, then run this "
                               "again.") from e
        raise ResultsError(f"{show(path)} cannot be written: its folder does not take the write lock ({e}). Make "
                           f"{show(path.parent)} writable, or write the results elsewhere (--results-dir), then "
                           "run this again.") from e
    key = str(lock_file.resolve())
    _held[key] = 1
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, since {_now()}\n".encode())
        yield
    finally:
        del _held[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_file)  # while still held: the next writer locks a fresh file
        os.close(fd)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _leftovers(path: Path) -> list[Path]:
    """Temporary files of earlier writes of ``path`` (``mkstemp``'s eight characters between the name and
    ``.tmp``). Under the lock, any there is a killed writer's."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[A-Za-z0-9_]{{8}}\.tmp")
    return sorted(p for p in path.parent.glob(f".{path.name}.*.tmp") if pattern.fullmatch(p.name))


# ---------------------------------------------------------------------------- the store

def _scalar(v) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def dumps(value, level: int = 0) -> str:
    """JSON text as ``json.dumps(value, indent=1)`` writes it, except that a list of scalars stands on one
    line (a step record, a series of times): a tenth of the lines and half the bytes of a results file whose
    data are long series. The same values in, the same values out (``json.loads`` of it equals ``value``)."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(value, dict) and value:
        items = (f"{inner}{json.dumps(str(k))}: {dumps(v, level + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and not all(_scalar(v) for v in value):
        return "[\n" + ",\n".join(inner + dumps(v, level + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value)


def write(path: str | Path, record: dict) -> None:
    """Write a record atomically, with its ``digest``: a temporary file in the same folder, fsync, then
    rename over, under the file's lock (``lock``). A value JSON cannot hold is refused before the disk is
    touched, naming its key (``UnwritableValue``); a temporary file a killed writer left is deleted."""
    path = Path(path)
    if not isinstance(record, dict):
        raise TypeError(f"a results file holds a JSON object: write() was given a {type(record).__name__}")
    bad = unwritable(record)
    if bad:
        raise UnwritableValue(f"{show(path)} was not written: {bad}.", bad)
    plain = json.loads(json.dumps(record))  # what a reader will see: tuples as lists, keys as strings
    plain.pop("digest", None)
    plain["digest"] = digest(plain)
    text = dumps(plain)
    with lock(path):
        for old in _leftovers(path):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
        _write_whole(path, text + "\n")


def _refuse(path: Path, problem: str, notebook: str, slug: str, cls: type = ResultsError, also: str = ""):
    return cls(f"{show(path)} {problem}. {remeasure_hint(notebook, slug)}{also}.", problem)


def read(path: str | Path, notebook: str | None = None, slug: str | None = None) -> dict:
    """Load a results file and verify it; a missing, damaged, misplaced or edited file raises an error saying
    what is wrong and what re-creates it. ``notebook`` and ``slug`` default to the file's name and folder."""
    path = Path(path)
    notebook = notebook or path.stem
    slug = slug or path.parent.name
    if not path.exists():
        have = sorted(p.parent.name for p in path.parent.parent.glob(f"*/{notebook}.json"))
        problem = f"does not exist: there are no results of notebook {notebook!r} for device {slug!r} to replay"
        raise MissingResults(
            f"{show(path)} {problem}. {remeasure_hint(notebook, slug)}, or replay another device's set "
            f"with -p reference <slug> (sets that have this notebook: {', '.join(have) or 'none'}).", problem)
    try:
        record = json.loads(path.read_bytes().decode())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise _refuse(path, f"is not valid JSON ({e})", notebook, slug) from e
    except OSError as e:
        raise _refuse(path, f"cannot be read ({e.strerror or e})", notebook, slug) from e
    if not isinstance(record, dict):
        raise _refuse(path, f"is not a results file: it holds a JSON {type(record).__name__}, not an object",
                      notebook, slug)
    missing = set(KEYS) - set(record)
    if missing or record["schema"] != SCHEMA:
        raise _refuse(path, f"is not a results file of schema {SCHEMA} (missing keys: {sorted(missing) or 'none'}; "
                      f"schema {record.get('schema')})", notebook, slug)
    _check_shape(path, record, notebook, slug)
    nan = _nonfinite(record)
    if nan:
        raise _refuse(path, f"holds {nan[1]!r} at {nan[0]}, which no measurement writes (JSON has no NaN or "
                      "infinity): it was edited or damaged", notebook, slug)
    _check_place(path, record, notebook, slug)
    if "digest" not in record:
        raise _refuse(path, "carries no digest of its data, so an edited or damaged copy could not be told from "
                      "a measurement", notebook, slug, Unsealed,
                      f", or, if it is known to hold the numbers as they were measured (a record written before "
                      f"records carried digests), seal it: `python tools/book.py seal {show(path)}`")
    if record["digest"] != digest(record):
        raise _refuse(path, "no longer matches the digest written with it: its numbers were edited or the file "
                      "was damaged since it was measured, so they cannot be replayed as measured", notebook, slug,
                      DigestMismatch, " (or restore the file as committed: `git checkout -- "
                      f"{show(path)}`)")
    return record


def _check_shape(path: Path, record: dict, notebook: str, slug: str) -> None:
    """The types every reader of a record relies on."""
    wrong = [k for k in ("params", "code", "provenance", "data") if not isinstance(record[k], dict)]
    if not isinstance(record["notebook"], str):
        wrong.insert(0, "notebook")
    if wrong:
        raise _refuse(path, f"is not a results file: {', '.join(wrong)} should be "
                      f"{'a string and ' if 'notebook' in wrong else ''}JSON objects", notebook, slug)
    prov = record["provenance"]
    absent = [k for k in PROVENANCE_KEYS if not isinstance(prov.get(k), str)]
    if absent:
        raise _refuse(path, f"has no provenance {', '.join(absent)} (the device and date it was measured on)",
                      notebook, slug)
    inputs = record.get("inputs", {})
    if not isinstance(inputs, dict) or not all(isinstance(v, str) for v in inputs.values()):
        raise _refuse(path, "has inputs that are not a JSON object of notebook names and digests", notebook, slug)


def _check_place(path: Path, record: dict, notebook: str, slug: str) -> None:
    """A record lies where it says it was measured: its notebook, and its device's slug."""
    prov = record["provenance"]
    if record["notebook"] != notebook:
        raise _refuse(path, f"holds the results of notebook {record['notebook']!r}, not of {notebook!r}: it was "
                      "copied or renamed into the wrong file", notebook, slug, Misplaced)
    if prov["kind"] == "cpu" and slug != "cpu":
        raise _refuse(path, f"holds a CPU run ({record['params'].get('size')!r} size), but lies under the results "
                      f"of device {slug!r}: CPU runs go under results/cpu", notebook, slug, Misplaced)
    if prov["kind"] != "cpu" and slug == "cpu":
        raise _refuse(path, f"holds a {prov['kind']} run on {prov['name']}, but lies under results/cpu, where "
                      "only CPU runs go", notebook, slug, Misplaced)
    if prov["slug"] != slug:
        raise _refuse(path, f"was measured on {prov['name']} (device {prov['slug']!r}), but lies under the "
                      f"results of device {slug!r}: each device's results go in their own folder", notebook, slug,
                      Misplaced)
    try:
        named = "cpu" if prov["kind"] == "cpu" else device_slug(prov["name"])
    except ValueError:
        named = None
    if named != slug:
        raise _refuse(path, f"names its device {prov['name']!r} (slug {named!r}), but its provenance and folder "
                      f"say {slug!r}", notebook, slug, Misplaced)


def seal(path: str | Path, inputs: Iterable[str] = ()) -> dict:
    """Add a digest to a record written before records carried one, over its content as it stands, and say
    in the record that it was sealed (``sealed``: when, and that the digest is not the measurement's). Each
    notebook in ``inputs`` is one whose results (in the same folder) this one was derived from: their
    digests go under ``inputs``, as a measurement records them. Every other check of ``read`` must pass;
    a record that has a digest is refused, matching or not (an edited record is re-measured, not sealed)."""
    path = Path(path)
    try:
        read(path)
    except Unsealed:
        pass
    else:
        raise ResultsError(f"{show(path)} already carries a digest that matches its content: there is nothing to "
                           "seal.")
    record = json.loads(path.read_text())
    for notebook in inputs:
        other = read(path.parent / f"{notebook}.json", notebook, path.parent.name)
        record.setdefault("inputs", {})[notebook] = other["digest"]
    record["sealed"] = {
        "date": _now(),
        "note": "written without a digest; the digest of its content as it stood was added later by "
                "`python tools/book.py seal`, not by the measurement",
    }
    write(path, record)
    return read(path)


_latest_run = None  # the latest Run (Run.__init__ sets it), told of the other results it loads


def load(notebook: str, slug: str = REFERENCE, results_dir: str | Path | None = None) -> dict:
    """Another notebook's results (for example chapter 0's ceilings, read by later chapters). The latest
    ``Run`` of the same results set, when it is another notebook's, is told: a measurement records the
    file's digest under its ``inputs``, and a replay warns when the file changed since."""
    path = path_for(notebook, slug, results_dir)
    record = read(path, notebook, slug)
    run = _latest_run
    if run is not None and run.slug == slug and run.notebook != notebook \
            and run.results_dir.resolve() == path.parent.parent.resolve():
        run.uses(notebook, record["digest"])
    return record


def rescue(path: Path, record: dict) -> Path:
    """Keep a record that could not be written: ``<name>.rescued-<date>`` beside ``path``, or in the system's
    temporary folder when that fails. Written leniently (numpy values as numbers, NaN as NaN, anything else
    by its repr), since it is kept to be looked at, not replayed."""

    def lenient(o):
        for attr in ("tolist", "item"):
            if hasattr(o, attr):
                return getattr(o, attr)()
        return repr(o)

    try:
        text = json.dumps(record, indent=1, default=lenient)
    except (TypeError, ValueError):
        text = repr(record)
    stamp = _now().replace("-", "").replace(":", "")
    for folder in (path.parent, Path(tempfile.gettempdir())):
        target = folder / f"{path.name}.rescued-{stamp}"
        try:
            _write_whole(target, text + "\n")
            return target
        except OSError:
            continue
    raise OSError(f"no rescue file could be written beside {show(path)} or in {tempfile.gettempdir()}")


def _write_whole(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` whole or not at all: a hidden temporary file in the same folder, synced,
    then renamed; a write that fails part-way (a full disk, a file size limit) deletes its temporary file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            for i in range(0, len(text), 1 << 20):
                f.write(text[i : i + (1 << 20)])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _normal(params: dict) -> dict:
    try:
        return json.loads(json.dumps(params, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TypeError(f"params must be JSON-serializable numbers, strings, lists and dicts: {e}") from e


def param_diff(asked: dict, stored: dict) -> list[str]:
    keys = sorted(set(asked) | set(stored))
    return [
        f"{k}: asked {asked.get(k, '<absent>')!r}, stored {stored.get(k, '<absent>')!r}"
        for k in keys
        if asked.get(k, "<absent>") != stored.get(k, "<absent>")
    ]


def warn(message: str) -> None:
    """A warning the reader sees in the notebook (stderr), without a machine path in it."""
    print(f"WARNING: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------- one notebook's run

def _auto_mode() -> str:
    import torch

    return "measure" if torch.cuda.is_available() else "replay"


@dataclass
class Result:
    """What a notebook works with after measuring or replaying."""

    data: dict
    params: dict
    provenance: dict
    path: Path
    measured: bool
    stale: list[str] = field(default_factory=list)

    @property
    def device(self) -> str:
        return self.provenance["name"]

    @property
    def date(self) -> str:
        return self.provenance["date"][:10]


class Run:
    """One notebook's run: resolves mode, device and size, then measures or replays.

    ``mode``: "measure", "replay" or "auto" (measure when torch sees a CUDA GPU, else replay; the
    environment variable BOOK_MODE, when set, decides for "auto" instead).
    ``device``: "cuda", "cpu" or "auto" (measuring only). ``size``: "full", "smoke" or "auto"
    (measuring: full on a GPU, smoke on the CPU; replaying: whatever the stored set holds).
    """

    def __init__(
        self,
        notebook: str,
        *,
        mode: str = "auto",
        device: str = "auto",
        size: str = "auto",
        reference: str = REFERENCE,
        results_dir: str | Path | None = None,
        root: str | Path = ROOT,
    ):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not one of {MODES}")
        if size not in SIZES:
            raise ValueError(f"size={size!r} is not one of {SIZES}")
        self.root = Path(root)
        if not (self.root / "notebooks" / f"{notebook}.ipynb").exists():
            raise ValueError(f"there is no notebooks/{notebook}.ipynb; pass the notebook's name without .ipynb")
        self.notebook = notebook
        self.results_dir = Path(results_dir) if results_dir else self.root / "results"
        if mode == "auto":
            mode = os.environ.get(MODE_ENV) or _auto_mode()
            if mode not in ("measure", "replay"):
                raise ValueError(f"the environment variable {MODE_ENV}={mode!r} must be 'measure' or 'replay'")
        self.mode = mode
        self._stored = None
        self._record = None  # what this run wrote, once it has measured
        self._inputs: dict[str, str] = {}  # other notebooks' results it loaded: notebook -> digest
        self.stale_inputs: list[str] = []  # replaying: inputs that changed since the measurement
        if mode == "measure":
            from lib.bench import device as dev

            if device == "auto" and dev.resolve("auto") != "cuda":
                raise NoDevice(
                    f"{notebook}: mode='measure' on a machine without a CUDA GPU: there is nothing to measure, since the "
                    "book's results come from a GPU. Replay the stored results with mode='replay' (or 'auto'), or, to "
                    "smoke-run the measuring code on the CPU, pass device='cpu' and a results_dir outside the book's "
                    "results/ folder.")
            self.device = dev.resolve(device)
            self.slug = dev.properties(self.device)["slug"]
            self.size = size if size != "auto" else ("full" if self.device == "cuda" else "smoke")
        else:
            self.slug = reference
            self._stored = read(self.path, notebook, reference)
            self.device = self._stored["provenance"]["kind"]
            stored_size = self._stored["params"].get("size")
            if size not in ("auto", stored_size):
                raise ParameterMismatch(
                    f"{show(self.path, self.root)} holds a {stored_size!r} run, and size={size!r} was asked for. "
                    f"Replay with size='auto' (or {stored_size!r}). "
                    f"{remeasure_hint(notebook, reference, f' -p size {size}')}."
                )
            self.size = stored_size
        global _latest_run
        _latest_run = self

    @property
    def path(self) -> Path:
        return path_for(self.notebook, self.slug, self.results_dir)

    @property
    def strict(self) -> bool:
        """Claims fail hard only when replaying the reference set."""
        return self.mode == "replay" and self.slug == REFERENCE

    def __repr__(self) -> str:
        return f"Run({self.notebook!r}, mode={self.mode!r}, device={self.device!r}, size={self.size!r}, set={self.slug!r})"

    def measure_or_replay(self, params: dict, measure: Callable[[dict, str], dict]) -> Result:
        """Measure (``measure(params, device)`` returns the data) and store, or replay the stored data."""
        params = _normal({"size": self.size, **params})
        if self.mode == "measure":
            return self._measure(params, measure)
        return self._replay(params)

    def uses(self, notebook: str, digest: str) -> None:
        """This notebook derives numbers from another notebook's results of the same set, whose digest is
        ``digest`` (``load`` calls this). Measuring: the record keeps the digest under ``inputs`` (written
        again if it was already written). Replaying: a digest other than the recorded one is a visible
        warning, kept in ``stale_inputs``."""
        if self.mode == "measure":
            self._inputs[notebook] = digest
            if self._record is not None and self._record.get("inputs") != self._inputs:
                self._record["inputs"] = dict(self._inputs)
                write(self.path, self._record)
            return
        other = show(path_for(notebook, self.slug, self.results_dir), self.root)
        recorded = self._stored.get("inputs")
        if recorded is None:
            reason = f"it records no digest of {other}, so it cannot tell whether that file is the one it was " \
                     "measured beside"
        elif recorded.get(notebook) != digest:
            reason = f"{other} changed since it was measured beside it"
        else:
            return
        self.stale_inputs.append(reason)
        warn(f"{show(self.path, self.root)} is stale: {reason}. What this notebook derives from both may not "
             f"hold. {remeasure_hint(self.notebook, self.slug)}.")

    def _measure(self, params, measure) -> Result:
        from lib.bench import device as dev

        code = fingerprint.fingerprint(self.notebook, self.root)
        prov = dev.provenance(self.device)
        with lock(self.path):  # taken before measuring: a second measurement of this file is refused at once
            print(f"measuring {self.notebook} on {prov['name']} ({self.size}) ...", flush=True)
            start = time.perf_counter()
            data = measure(params, self.device)
            record = {
                "schema": SCHEMA,
                "notebook": self.notebook,
                "params": params,
                "code": code,
                "provenance": prov,
                "elapsed_s": time.perf_counter() - start,  # how long the measurement took, wall clock
                "data": data,
            }
            if self._inputs:
                record["inputs"] = dict(self._inputs)
            try:
                if not isinstance(data, dict):
                    raise UnwritableValue(f"the measurement returned a {type(data).__name__}, not a dict of data")
                write(self.path, record)
            except Exception as e:
                raise self._failed(record, e) from e
        self._record = json.loads(self.path.read_text())
        print(f"wrote {show(self.path, self.root)}", flush=True)
        return Result(_normal(data), params, prov, self.path, measured=True)

    def _failed(self, record: dict, error: Exception) -> WriteFailed:
        """The error of a measurement that finished but could not be written, its record kept in a rescue file."""
        why = error.problem if isinstance(error, ResultsError) else f"{type(error).__name__}: {error}"
        try:
            kept = rescue(self.path, record)
            where = f"The measured record is kept in {show(kept, self.root)}, to look at (it is not replayed)"
        except OSError as e:
            kept, where = None, f"No rescue file could be written either ({e})"
        return WriteFailed(f"the measurement of {self.notebook} on {record['provenance']['name']} finished, but "
                           f"{show(self.path, self.root)} could not be written: {why}. {where}. Fix what stopped "
                           f"the write, then {remeasure_hint(self.notebook, self.slug)[0].lower()}"
                           f"{remeasure_hint(self.notebook, self.slug)[1:]}.", kept)

    def _replay(self, params) -> Result:
        rec = self._stored
        diff = param_diff(params, rec["params"])
        if diff:
            raise ParameterMismatch(
                f"{show(self.path, self.root)} was measured with other parameters than this notebook asks for:\n  "
                + "\n  ".join(diff)
                + f"\n{remeasure_hint(self.notebook, self.slug)}."
            )
        stale = stale_reasons(rec, self.root)  # its inputs are checked as the notebook loads them (uses)
        if stale:
            warn(
                f"{show(self.path, self.root)} is stale: its code changed since it was measured "
                f"({'; '.join(stale)}). The numbers below may differ from what this notebook measures "
                f"now. {remeasure_hint(self.notebook, self.slug)}."
            )
        prov = rec["provenance"]
        print(f"replaying {show(self.path, self.root)}: {prov['name']}, {prov['date'][:10]}", flush=True)
        return Result(rec["data"], rec["params"], rec["provenance"], self.path, measured=False, stale=stale)
