"""Which code produced a result, found from the imports and hashed without its documentation.

A result is produced by the notebook's cells tagged ``measure`` and by every ``lib`` module those cells
use, with everything those modules import, transitively: the import closure. Nothing is listed by hand.

- The roots are the lib modules that the measure cells name: a name bound by an import anywhere in the
  notebook (``from lib.experiments import kv_cache``) and used in a measure cell (``kv_cache.sweep``).
- The closure follows ``import`` statements (at any depth of a module, so imports inside functions count
  too) to files under ``lib/``; a package's ``__init__.py`` counts wherever one of its modules does, since
  importing the module runs it.
- The results store itself (``HARNESS``) records numbers and computes none: it is neither counted nor
  followed.

Each source is hashed as code only (``code_only``): docstrings, comments (whole-line and trailing) and
blank lines are dropped, so editing documentation leaves results fresh, and editing one line of code in
any module of the closure makes them stale.

Chapters: all (the status page and ``make check-fresh`` read it).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import tokenize
from collections.abc import Iterable
from pathlib import Path

SCHEME = "closure"
MEASURE_TAG = "measure"
PACKAGE = "lib"
# modules that store and compare results: they record numbers and compute none
HARNESS = frozenset({"lib.bench.results", "lib.bench.fingerprint"})


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------- code without documentation

def _docstring_lines(tree: ast.AST) -> set[int]:
    drop = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            drop.update(range(body[0].lineno, body[0].end_lineno + 1))
    return drop


def code_only(text: str) -> str:
    """Python source less its docstrings, its comments and its blank lines, each line stripped of trailing
    spaces: what runs, in the same order. Text that does not parse stays whole."""
    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError, IndentationError):
        return text
    lines = text.splitlines()
    for tok in reversed(tokens):  # cut comments from the end of the line leftwards
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    drop = _docstring_lines(tree)
    kept = (ln.rstrip() for i, ln in enumerate(lines, 1) if i not in drop)
    return "\n".join(ln for ln in kept if ln.strip())


# ---------------------------------------------------------------------------- modules and their imports

def module_file(name: str, root: Path) -> Path | None:
    """The file of module ``name`` (``lib.kv_pool`` -> lib/kv_pool.py, a package -> its __init__.py)."""
    base = Path(root).joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imported_modules(tree: ast.AST, name: str, path: Path, root: Path) -> set[str]:
    """The lib modules a module's code imports (``name`` and ``path`` resolve relative imports)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path).split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from lib import costs`: costs is a module
    return {m for m in found if m.split(".")[0] == PACKAGE and module_file(m, root) is not None}


def closure(modules: Iterable[str], root: Path) -> dict[str, Path]:
    """Every lib module the given ones import, transitively, themselves and their packages included:
    {module name: file}. ``HARNESS`` modules are left out and not followed."""
    root = Path(root)
    seen: dict[str, Path] = {}
    todo = [p for m in modules for p in _with_parents(m)]
    while todo:
        name = todo.pop()
        if name in seen or name in HARNESS:
            continue
        path = module_file(name, root)
        if path is None:
            raise ValueError(f"module {name!r} has no file under {root}: is it spelled as imported?")
        seen[name] = path
        tree = ast.parse(path.read_text(), filename=str(path))
        todo.extend(p for m in imported_modules(tree, name, path, root) for p in _with_parents(m))
    return seen


# ---------------------------------------------------------------------------- a notebook's measuring code

def _cells(nb_path: Path) -> list[tuple[str, list[str]]]:
    nb = json.loads(Path(nb_path).read_text())
    return [("".join(c["source"]) if isinstance(c["source"], list) else c["source"], c.get("metadata", {}).get("tags", []))
            for c in nb["cells"] if c["cell_type"] == "code"]


def _parse(source: str) -> ast.AST | None:
    try:
        return ast.parse(source)
    except SyntaxError:  # a cell with IPython syntax: it binds and uses no names we can see
        return None


def _bindings(trees: Iterable[ast.AST]) -> dict[str, str]:
    """Names bound by imports of lib in the notebook: {name: the module that provides it}."""
    out = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PACKAGE:
                        out[a.asname or PACKAGE] = a.name
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == PACKAGE:
                for a in node.names:
                    out[a.asname or a.name] = f"{node.module}.{a.name}"  # a module, or an attribute of one
    return out


def measure_source(nb_path: Path) -> str:
    """The notebook's cells tagged ``measure``, joined, as code only."""
    cells = [code_only(src) for src, tags in _cells(nb_path) if MEASURE_TAG in tags]
    if not cells:
        raise ValueError(f"{nb_path} has no code cell tagged {MEASURE_TAG!r}: tag the cells that define and run the "
                         "experiment, so that a change to them marks its results stale")
    return "\n# ---- next measure cell ----\n".join(cells)


def notebook_roots(nb_path: Path, root: Path) -> list[str]:
    """The lib modules the notebook's measure cells use, by the names the notebook's imports bind."""
    cells = [(tree, tags) for src, tags in _cells(nb_path) if (tree := _parse(src)) is not None]
    bound = _bindings(tree for tree, _ in cells)
    used = {n.id for tree, tags in cells if MEASURE_TAG in tags for n in ast.walk(tree) if isinstance(n, ast.Name)}
    roots = set()
    for name in used & set(bound):
        mod = bound[name]
        roots.add(mod if module_file(mod, root) is not None else mod.rpartition(".")[0])
    return sorted(roots - HARNESS)


def fingerprint(notebook: str, root: Path) -> dict:
    """The code fingerprint of a notebook's results: each source's hash (the measure cells, and every file of
    the closure of the modules they use, as code only), and one hash of all together."""
    root = Path(root)
    nb_path = root / "notebooks" / f"{notebook}.ipynb"
    roots = notebook_roots(nb_path, root)
    sources = {f"notebooks/{notebook}.ipynb#{MEASURE_TAG}": sha(measure_source(nb_path))}
    for path in sorted(closure(roots, root).values()):
        sources[path.relative_to(root).as_posix()] = sha(code_only(path.read_text()))
    return {"scheme": SCHEME, "roots": roots, "sources": sources, "fingerprint": sha(json.dumps(sources, sort_keys=True))}


def changes(recorded: dict, now: dict) -> list[str]:
    """What differs between a recorded fingerprint's sources and the current ones, one line per source."""
    old, new = recorded.get("sources", {}), now["sources"]
    out = [f"{s} changed" for s in old if s in new and old[s] != new[s]]
    out += [f"{s} is no longer part of the measuring code" for s in old if s not in new]
    out += [f"{s} is new to the measuring code" for s in new if s not in old]
    return out
