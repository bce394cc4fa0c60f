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
  a visible warning, and ``stale_results`` (``make check-fresh``) lists it.

The fingerprint (``lib.bench.fingerprint``) covers the notebook's code cells tagged ``measure`` and
every lib module they use, found from the imports (the import closure), as code only: docstrings and
comments do not count. Chapters: all (DESIGN of the book; chapter 0 introduces it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lib.bench import fingerprint
from lib.bench.device import ROOT

SCHEMA = 1
REFERENCE = "nvidia-h200"  # the results set the committed book replays
RESULTS = ROOT / "results"
MODES = ("auto", "measure", "replay")
MODE_ENV = "BOOK_MODE"  # overrides what mode="auto" picks (the test suite replays, even on a GPU)
SIZES = ("auto", "full", "smoke")


class ResultsError(RuntimeError):
    """A results file cannot serve this run; the message says which file and what to run."""


class MissingResults(ResultsError):
    pass


class ParameterMismatch(ResultsError):
    pass


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


# ---------------------------------------------------------------------------- code fingerprint

def stale_reasons(record: dict, root: Path = ROOT) -> list[str]:
    """Why a record's numbers may no longer be what its code measures: which sources of its measuring code
    (``lib.bench.fingerprint``: the notebook's measure cells and their import closure) changed, appeared or
    vanished since it was measured."""
    scheme = record["code"].get("scheme", "text")
    if scheme != fingerprint.SCHEME:
        return [f"it was fingerprinted by an older scheme ({scheme!r}: measuring files listed by hand), which "
                "cannot tell what its code is now"]
    try:
        now = fingerprint.fingerprint(record["notebook"], root)
    except (OSError, ValueError, KeyError, SyntaxError, json.JSONDecodeError) as e:
        return [f"its measuring code cannot be read ({e})"]
    return fingerprint.changes(record["code"], now)


def stale_results(results_dir: str | Path | None = None, root: Path = ROOT) -> list[tuple[Path, list[str]]]:
    """Every results file under ``results_dir`` whose code changed since it was measured."""
    out = []
    for path in sorted(Path(results_dir or RESULTS).glob("*/*.json")):
        reasons = stale_reasons(read(path), root)
        if reasons:
            out.append((path, reasons))
    return out


# ---------------------------------------------------------------------------- the store

def write(path: str | Path, record: dict) -> None:
    """Write JSON atomically: a temporary file in the same folder, fsync, then rename over."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, allow_nan=False)  # fails before touching the disk
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            for i in range(0, len(text), 1 << 20):
                f.write(text[i : i + (1 << 20)])
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read(path: str | Path, notebook: str | None = None, slug: str | None = None) -> dict:
    """Load a results file; a missing or damaged file raises an error saying what re-creates it."""
    path = Path(path)
    notebook = notebook or path.stem
    slug = slug or path.parent.name
    if not path.exists():
        have = sorted(p.parent.name for p in path.parent.parent.glob(f"*/{notebook}.json"))
        raise MissingResults(
            f"{show(path)} does not exist: there are no results of notebook {notebook!r} for device "
            f"{slug!r} to replay. {remeasure_hint(notebook, slug)}, or replay another device's set "
            f"with -p reference <slug> (sets that have this notebook: {', '.join(have) or 'none'})."
        )
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{show(path)} is not valid JSON ({e}). {remeasure_hint(notebook, slug)}.") from e
    if not isinstance(record, dict):
        raise ResultsError(f"{show(path)} is not a results file: it holds a JSON {type(record).__name__}, not an "
                           f"object. {remeasure_hint(notebook, slug)}.")
    missing = {"schema", "notebook", "params", "code", "provenance", "data"} - set(record)
    if missing or record["schema"] != SCHEMA:
        raise ResultsError(
            f"{show(path)} is not a results file of schema {SCHEMA} (missing keys: "
            f"{sorted(missing) or 'none'}; schema {record.get('schema')}). {remeasure_hint(notebook, slug)}."
        )
    return record


def load(notebook: str, slug: str = REFERENCE, results_dir: str | Path | None = None) -> dict:
    """Another notebook's results (for example chapter 0's ceilings, read by later chapters)."""
    return read(path_for(notebook, slug, results_dir), notebook, slug)


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
        if mode == "measure":
            from lib.bench import device as dev

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

    def _measure(self, params, measure) -> Result:
        from lib.bench import device as dev

        code = fingerprint.fingerprint(self.notebook, self.root)
        prov = dev.provenance(self.device)
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
        write(self.path, record)
        print(f"wrote {show(self.path, self.root)}", flush=True)
        return Result(_normal(data), params, prov, self.path, measured=True)

    def _replay(self, params) -> Result:
        rec = self._stored
        diff = param_diff(params, rec["params"])
        if diff:
            raise ParameterMismatch(
                f"{show(self.path, self.root)} was measured with other parameters than this notebook asks for:\n  "
                + "\n  ".join(diff)
                + f"\n{remeasure_hint(self.notebook, self.slug)}."
            )
        stale = stale_reasons(rec, self.root)
        if stale:
            warn(
                f"{show(self.path, self.root)} is stale: its code changed since it was measured "
                f"({'; '.join(stale)}). The numbers below may differ from what this notebook measures "
                f"now. {remeasure_hint(self.notebook, self.slug)}."
            )
        prov = rec["provenance"]
        print(f"replaying {show(self.path, self.root)}: {prov['name']}, {prov['date'][:10]}", flush=True)
        return Result(rec["data"], rec["params"], rec["provenance"], self.path, measured=False, stale=stale)
