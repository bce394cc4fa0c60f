"""The library's layers, checked from its imports (every import statement, at any depth of a module).

- The book side of the machinery (claims, glue, plots) is imported only by notebooks and by the
  diagrams (lib/diagrams: figures drawn from the library's own objects, for the pages), never from the
  rest of lib; and nothing in lib but the diagrams imports the diagrams.
- Nothing in lib imports tools/ (the site and the tuning sweeps use lib, not the other way round).
- The kernels import nothing of lib but each other: they run anywhere torch and Triton do.
- The ideas (costs, the pool, the prefix cache, the model, serving, workloads) never import the
  experiments, which sit on top of them.
"""

from __future__ import annotations

import ast

import pytest

from lib.bench import fingerprint
from tests.conftest import ROOT

BOOK_SIDE = {"lib.bench.claims", "lib.bench.glue", "lib.bench.plots"}
DIAGRAMS = "lib.diagrams"


def modules():
    for path in sorted((ROOT / "lib").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path


def imports_of(name, path):
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found | fingerprint.imported_modules(tree, name, path, ROOT)


ALL = list(modules())


@pytest.mark.parametrize("name, path", ALL, ids=[n for n, _ in ALL])
def test_layers(name, path):
    imported = imports_of(name, path)
    book_side = name in BOOK_SIDE or name == DIAGRAMS or name.startswith(DIAGRAMS + ".")
    assert not imported & BOOK_SIDE or book_side, f"{name} imports the book side: {imported & BOOK_SIDE}"
    assert book_side or not any(m == DIAGRAMS or m.startswith(DIAGRAMS + ".") for m in imported), \
        f"{name} imports the diagrams"
    assert not any(m == "tools" or m.startswith("tools.") for m in imported), f"{name} imports tools"
    lib_imports = {m for m in fingerprint.imported_modules(ast.parse(path.read_text()), name, path, ROOT)}
    if name.startswith("lib.kernels"):
        assert all(m == "lib" or m.startswith("lib.kernels") for m in lib_imports), f"{name}: {lib_imports}"
    if not name.startswith(("lib.experiments", "lib.bench")) and name != "lib":
        assert not any(m.startswith("lib.experiments") for m in lib_imports), f"{name} imports an experiment"


def test_every_module_names_its_chapters():
    """A module's docstring says which chapters explain it (d2l's back-link)."""
    for name, path in ALL:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if name.endswith("__init__") or path.name == "__init__.py":
            continue
        assert "Chapter" in doc or "chapter" in doc, f"{name}'s docstring names no chapter"
