"""Which code produced a result, found from the imports and hashed without its documentation.

A result is produced by the notebook's cells tagged ``measure`` and by every ``lib`` module those cells
use, with everything those modules import, transitively: the import closure. Nothing is listed by hand.

- The roots are the lib modules that the measure cells name: a name bound by an import anywhere in the
  notebook (``from lib.experiments import kv_cache``) and used in a measure cell (``kv_cache.sweep``).
- A root that the measure cells use only through its attributes (``kv_cache.sweep``, ``kv_cache.measure``)
  counts with just the top-level definitions those attributes reach, through the names their code uses
  (``slice_of``): an experiment module's analysis functions, which turn stored data into tables, can
  change without making the data stale. Statements that bind no name (they may act on import) always
  count. A name looked up by a string (``getattr``) is not seen: measuring code calls what it uses.
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


def _bound_names(node: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds (definitions, assignments, imports)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AnnAssign, ast.AugAssign)) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def slice_of(text: str, names: Iterable[str]) -> tuple[str, set[str]]:
    """The top-level statements of a module's source that ``names`` reach: their definitions, then the
    definitions of every name those use, transitively, and every statement that binds no name; in the
    module's order, as source text (docstrings and comments are dropped later, by ``code_only``); and the
    module-level names reached (an import statement is followed only for the names it binds that are)."""
    tree = ast.parse(text)
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    binds = [_bound_names(n) for n in body]
    keep = {i for i, b in enumerate(binds) if not b}
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for i, b in enumerate(binds):
            if name in b and i not in keep:
                keep.add(i)
                todo.extend(n.id for n in ast.walk(body[i]) if isinstance(n, ast.Name))
    missing = set(names) - set().union(*binds) if binds else set(names)
    if missing:
        raise ValueError(f"the measure cells use {sorted(missing)}, which the module does not define")
    lines = text.splitlines()
    spans = []
    for i in sorted(keep):
        node = body[i]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        spans.append("\n".join(lines[first - 1: node.end_lineno]))
    return "\n".join(spans) + "\n", seen


def closure(modules: Iterable[str] | dict[str, set[str] | None], root: Path) -> dict[str, tuple[Path, str]]:
    """Every lib module the given ones import, transitively, themselves and their packages included:
    {module name: (file, the source that counts)}. ``modules`` may map a module to the attributes that are
    used of it: such a module counts as its ``slice_of`` those names, and only the imports of that slice are
    followed; a module reached otherwise counts whole. ``HARNESS`` modules are left out and not followed."""
    root = Path(root)
    wanted = dict(modules) if isinstance(modules, dict) else dict.fromkeys(modules)
    seen: dict[str, tuple[Path, str]] = {}
    todo = [(p, wanted[m] if p == m else None) for m in wanted for p in _with_parents(m)]
    while todo:
        name, attrs = todo.pop()
        if name in HARNESS or (name in seen and (attrs is not None or seen[name][1] is None)):
            continue
        path = module_file(name, root)
        if path is None:
            raise ValueError(f"module {name!r} has no file under {root}: is it spelled as imported?")
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
        if attrs is not None:
            text, reached = slice_of(text, attrs)
            tree = ast.parse(text, filename=str(path))
            for node in ast.walk(tree):  # follow only the imported names the slice uses
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    node.names = [a for a in node.names if (a.asname or a.name).split(".")[0] in reached]
        seen[name] = (path, text if attrs is not None else None)
        todo.extend((p, None) for m in imported_modules(tree, name, path, root) for p in _with_parents(m))
    return {name: (path, path.read_text() if sliced is None else sliced) for name, (path, sliced) in seen.items()}


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


def notebook_roots(nb_path: Path, root: Path) -> dict[str, set[str] | None]:
    """The lib modules the notebook's measure cells use, by the names the notebook's imports bind:
    {module: the attributes used of it, or None where the module itself is used (then all of it counts)}."""
    cells = [(tree, tags) for src, tags in _cells(nb_path) if (tree := _parse(src)) is not None]
    bound = _bindings(tree for tree, _ in cells)
    roots: dict[str, set[str] | None] = {}
    for tree, tags in cells:
        if MEASURE_TAG not in tags:
            continue
        bases = {id(n.value): n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Name) and n.id in bound):
                continue
            mod, attr = bound[n.id], bases.get(id(n))
            if module_file(mod, root) is None:  # a name imported from a module: that name of it is used
                mod, attr = mod.rpartition(".")[0], mod.rpartition(".")[2]
            if mod in HARNESS:
                continue
            if attr is None or roots.get(mod, set()) is None:
                roots[mod] = None
            else:
                roots.setdefault(mod, set()).add(attr)
    return dict(sorted(roots.items()))


def fingerprint(notebook: str, root: Path) -> dict:
    """The code fingerprint of a notebook's results: each source's hash (the measure cells, and every file of
    the closure of the modules they use, as code only), and one hash of all together."""
    root = Path(root)
    nb_path = root / "notebooks" / f"{notebook}.ipynb"
    roots = notebook_roots(nb_path, root)
    sources = {f"notebooks/{notebook}.ipynb#{MEASURE_TAG}": sha(measure_source(nb_path))}
    for path, text in sorted(closure(roots, root).values()):
        sources[path.relative_to(root).as_posix()] = sha(code_only(text))
    shown = {m: sorted(a) if a is not None else None for m, a in roots.items()}
    return {"scheme": SCHEME, "roots": shown, "sources": sources, "fingerprint": sha(json.dumps(sources, sort_keys=True))}


def changes(recorded: dict, now: dict) -> list[str]:
    """What differs between a recorded fingerprint's sources and the current ones, one line per source."""
    old, new = recorded.get("sources", {}), now["sources"]
    out = [f"{s} changed" for s in old if s in new and old[s] != new[s]]
    out += [f"{s} is no longer part of the measuring code" for s in old if s not in new]
    out += [f"{s} is new to the measuring code" for s in new if s not in old]
    return out
