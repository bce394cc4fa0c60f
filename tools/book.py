"""Run the book's notebooks through papermill, and list stale results.

    python tools/book.py run --mode measure                 # every notebook, in chapter order, in place
    python tools/book.py run --mode replay --reference nvidia-h200
    python tools/book.py run --mode measure --device cpu --size smoke --results-dir DIR --output-dir OUT
    python tools/book.py run 03-kv-cache --mode replay -p memory_fraction=0.8 --output-dir OUT
                                                            # a notebook parameter changed (an exercise)
    python tools/book.py check-fresh                        # stale, damaged or leftover results, exit 1 if any
    python tools/book.py seal results/nvidia-h200/01-matrix-shapes.json --input 00-the-machine
                                                            # add the digest to a record written without one
    python tools/book.py devices                            # replay every other device's results for the
                                                            # book's devices page (into _build/devices/)

Chapter order matters: chapter 0 measures the ceilings the others read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.bench import results  # noqa: E402

VOLATILE = ("papermill", "execution")
DEVICES = ("auto", "cuda", "cpu")
EXERCISES = Path("_build") / "runs"  # where a run with changed parameters writes its notebooks by default


def _without_injected(path: Path):
    """The notebook with any earlier papermill-injected parameters cell removed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    return nb


def _tidy(path: Path) -> None:
    """Drop papermill's timestamps and paths from a notebook so reruns give small diffs."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for key in VOLATILE:
        nb.metadata.pop(key, None)
        for cell in nb.cells:
            cell.metadata.pop(key, None)
    nbformat.write(nb, path)


# The CPU's arithmetic kernels a replay runs on. Replaying computes every number from stored data, and a
# float whose last digits moved changes a committed output, so the book's analyses sum in a fixed order
# (lib.bench.fit) and nothing they print depends on these kernels. The test suite checks that on every run:
# `make notebooks` replays with the first environment, nbval with the second: other BLAS kernels (SSE3's
# against AVX2's), another thread count, numpy and torch without their vector paths. The kernel names are
# x86-64's; elsewhere neither is set.
NUMPY_SIMD = ("SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2 AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX "
              "AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR")
ARITHMETIC = {
    "commit": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    "check": {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
              "NPY_DISABLE_CPU_FEATURES": NUMPY_SIMD, "ATEN_CPU_CAPABILITY": "default"},
}


def arithmetic(which: str) -> dict[str, str]:
    """The environment variables of replay environment ``which`` ("commit" or "check") on this machine: none
    off x86-64, and AVX2's BLAS kernels only where the CPU has AVX2 (SSE3's are on every x86-64 CPU)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    env = dict(ARITHMETIC[which])
    if env["OPENBLAS_CORETYPE"] == "Haswell":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            flags = ""
        if " avx2" not in flags:
            env["OPENBLAS_CORETYPE"] = "Sandybridge"
    return env


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run(args) -> int:
    try:
        extra = parse_parameters(getattr(args, "parameter", None) or [])
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for key, default in (("mode", "auto"), ("device", "auto"), ("size", "auto"), ("reference", results.REFERENCE),
                         ("results_dir", None)):
        if key in extra:  # -p mode=measure is --mode measure: the same checks apply
            value, flag = extra.pop(key), "--" + key.replace("_", "-")
            if getattr(args, key) not in (default, value):
                print(f"-p {key}={value} and {flag} {getattr(args, key)} disagree: give one", file=sys.stderr)
                return 2
            setattr(args, key, value)
    for key, allowed in (("mode", results.MODES), ("device", DEVICES), ("size", results.SIZES)):
        if getattr(args, key) not in allowed:
            print(f"{key}={getattr(args, key)!r} is not one of {', '.join(allowed)}", file=sys.stderr)
            return 2
    mode = args.mode if args.mode != "auto" else os.environ.get(results.MODE_ENV) or "auto"
    if mode == "measure" and args.device != "cpu" and not _has_cuda():
        print("no CUDA GPU here, so there is nothing to measure: the book's results are measured on a GPU "
              "(run this there), and replayed everywhere else (`make notebooks`). To measure the CPU smoke "
              "sizes on purpose, say so: --device cpu --size smoke --results-dir DIR --output-dir OUT.",
              file=sys.stderr)
        return 2
    if mode == "replay":  # the committed outputs' arithmetic (see ARITHMETIC); a variable already set wins
        for key, value in arithmetic("commit").items():
            os.environ.setdefault(key, value)
    # The mode travels in the environment (it decides what mode="auto" does in every kernel), so the
    # notebooks keep their defaults and no papermill-injected cell is needed for it.
    if args.mode != "auto":
        os.environ[results.MODE_ENV] = args.mode
    params = {}
    for key in ("device", "size"):
        if getattr(args, key) != "auto":
            params[key] = getattr(args, key)
    if args.reference != results.REFERENCE:
        params["reference"] = args.reference
    if args.results_dir:
        params["results_dir"] = str(Path(args.results_dir).resolve())
    # The kernels import lib from this checkout, installed or not (a GPU node with its own python).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    from tools.site import status

    names = args.notebooks or status.chapter_notebooks(ROOT)
    notebooks = [ROOT / "notebooks" / f"{n}.ipynb" for n in names]
    out_dir = Path(args.output_dir).resolve() if args.output_dir else None
    # In place only for the book's two workflows: a measurement on this GPU at the full size (make measure) and
    # a replay of a results set (make notebooks); a run with changed parameters (an exercise, a CPU smoke run)
    # goes to EXERCISES unless --output-dir says where.
    if out_dir is None and (extra or args.device != "auto" or args.size != "auto" or args.results_dir):
        out_dir = ROOT / EXERCISES
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    for nb_path in notebooks:
        if not nb_path.exists():
            print(f"no such notebook: {results.show(nb_path)}", file=sys.stderr)
            return 2
    for nb_path in notebooks:
        unknown = sorted(set(extra) - set(parameter_names(nb_path)))
        if unknown:
            print(f"{results.show(nb_path)} has no parameter {', '.join(unknown)}: its parameters cell defines "
                  f"{', '.join(parameter_names(nb_path))}", file=sys.stderr)
            return 2
    params = {**params, **extra}
    for i, nb_path in enumerate(notebooks, 1):
        out = (out_dir / nb_path.name) if out_dir else nb_path
        print(f"[{i}/{len(notebooks)}] {results.show(nb_path)} -> {results.show(out)} {params or ''}", flush=True)
        execute(nb_path, out, params, progress=not args.no_progress)
    return 0


def parse_parameters(items: list[str]) -> dict:
    """``["memory_fraction=0.8", "model='llama-3-70b'"]`` -> {name: value}; a value is read as a Python
    literal (a number, a list, a quoted string) and otherwise kept as the string it is."""
    import ast

    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"-p {item!r}: write a parameter as NAME=VALUE, for example -p memory_fraction=0.8")
        try:
            out[name] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            out[name] = raw.strip()
    return out


def parameter_names(nb_path: Path) -> list[str]:
    """The names the notebook's cell tagged ``parameters`` assigns (the ones -p may change)."""
    import ast

    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            for node in ast.parse(cell.source).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def execute(nb_path: Path, out: Path, params: dict, progress: bool = False,
            failed_dir: Path = ROOT / "_build" / "failed") -> None:
    """Run notebook ``nb_path`` with ``params`` (in its own folder) and write it, outputs and all, to ``out``.
    It runs in a hidden copy beside ``out``, which replaces ``out`` only when every cell ran: a cell that
    raises leaves ``out`` as it was, and the failed run, error and all, goes to ``failed_dir``."""
    import nbformat
    import papermill

    running = out.with_name(f".{out.stem}.running.ipynb")
    nbformat.write(_without_injected(nb_path), running)
    try:
        papermill.execute_notebook(str(running), str(running), parameters=params, kernel_name="python3",
                                   cwd=str(nb_path.parent), progress_bar=progress)
    except BaseException:
        failed_dir.mkdir(parents=True, exist_ok=True)
        failed = failed_dir / nb_path.name
        running.replace(failed)
        print(f"{results.show(nb_path)} did not run to the end; {results.show(out)} is left as it was, and the "
              f"failed run, with its error, is in {results.show(failed)}", file=sys.stderr, flush=True)
        raise
    _tidy(running)
    running.replace(out)


def check_fresh(args) -> int:
    """List every results file that is stale (its code or its inputs changed), damaged (its content no longer
    matches its digest, or it is misplaced or malformed), and any leftover temporary, lock or rescue file."""
    root = Path(args.root).resolve() if args.root else ROOT
    base = Path(args.results_dir) if args.results_dir else root / "results"
    try:
        found = results.audit(base, root)
    except results.ResultsError as e:
        print(e, file=sys.stderr)
        return 2
    for kind, path, reasons in found:
        print(f"{kind}: {results.show(path, root)}: {'; '.join(reasons)}")
    if not found:
        print("all results are fresh: every results file matches its digest, the code that produced it and the "
              "results it was derived from")
    return 1 if found else 0


def seal(args) -> int:
    """Add the digest of its content to each record written before records carried one (``results.seal``)."""
    for name in args.files:
        try:
            rec = results.seal(name, args.input)
        except results.ResultsError as e:
            print(e, file=sys.stderr)
            return 1
        inputs = "".join(f", input {nb} {d[:19]}" for nb, d in sorted(rec.get("inputs", {}).items()))
        print(f"sealed {results.show(Path(name).resolve())}: {rec['digest'][:19]}{inputs}")
    return 0


def devices(args) -> int:
    """Replay each device's results (other than the reference) into _build/devices/<slug>/, where the
    book's devices page finds the numbers the notebooks glue."""
    from tools.site import status

    others = [s for s in status.devices(args.results_dir) if s != results.REFERENCE]
    if not others:
        print(f"results/ holds only {results.REFERENCE}: nothing to replay")
        return 0
    base = Path(args.results_dir) if args.results_dir else results.RESULTS
    for slug in others:
        names = [n for n in status.chapter_notebooks(ROOT) if (base / slug / f"{n}.json").exists()]
        out = Path(args.output_dir) if args.output_dir else ROOT / status.DEVICES_DIR
        rc = run(argparse.Namespace(notebooks=names, mode="replay", device="auto", size="auto", reference=slug,
                                    results_dir=args.results_dir, output_dir=str(out / slug), no_progress=True,
                                    parameter=[]))
        if rc:
            return rc
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute notebooks with papermill")
    r.add_argument("notebooks", nargs="*", help="names such as 00-the-machine (default: all, in chapter order)")
    r.add_argument("--mode", choices=results.MODES, default="auto")
    r.add_argument("--device", choices=DEVICES, default="auto")
    r.add_argument("--size", choices=results.SIZES, default="auto")
    r.add_argument("--reference", default=results.REFERENCE)
    r.add_argument("--results-dir", default=None)
    r.add_argument("--output-dir", default=None, help="write executed notebooks here instead of in place")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                   help="set a parameter of the notebooks' parameters cell, e.g. -p memory_fraction=0.8")
    c = sub.add_parser("check-fresh", help="list stale, damaged or leftover results")
    c.add_argument("--results-dir", default=None)
    c.add_argument("--root", default=None, help="the repository whose code is checked (default: this one)")
    s = sub.add_parser("seal", help="add a digest to results written before records carried one")
    s.add_argument("files", nargs="+", help="results files, such as results/nvidia-h200/00-the-machine.json")
    s.add_argument("--input", action="append", default=[], metavar="NOTEBOOK",
                   help="a notebook of the same folder whose results this one was derived from (repeatable)")
    d = sub.add_parser("devices", help="replay every other device's results for the devices page")
    d.add_argument("--results-dir", default=None)
    d.add_argument("--output-dir", default=None, help="where the replayed notebooks go (default: _build/devices)")
    args = ap.parse_args(argv)
    return {"run": run, "check-fresh": check_fresh, "seal": seal, "devices": devices}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
