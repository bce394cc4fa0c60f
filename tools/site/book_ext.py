"""Sphinx extension of the book: math that renders without network, the status page, the devices page.

- MathJax is served from the built site: a pinned release (``MATHJAX_VERSION``) is fetched once from
  the npm registry, checked against its published sha512, and unpacked into ``.cache/`` (kept between
  builds); its files are copied into ``_static/mathjax/`` of every build. A site so built renders its
  math opened over file:// or from a local HTTP server, with no network.
- ``{book-status}``: for each chapter, the device, date, commit and library versions of its reference
  measurement, whether it is fresh, its claims held and its targets met; then every target with its
  value, its goal, met or missed, and the date it was measured (``tools.site.status``; ``status_tables``).
- ``{book-devices}``: every chapter's headline numbers on every device in results/, side by side.
- ``{glue:figure}`` with ``:doc:``: a chapter page pastes its notebook's figure or table inside a
  numbered, captioned figure that the prose can reference (myst-nb's own directive reads only the
  glue of the page it is on). One named ``tab-...`` is a table (``ResultsTable``): numbered "Table N",
  on its own counter, and referenced as such.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

from docutils import nodes as _nodes

ROOT = Path(__file__).resolve().parents[2]
MATHJAX_VERSION = "3.2.2"
MATHJAX_URL = f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz"
MATHJAX_SHA512 = "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
# what the site loads: the TeX-to-HTML component, the TeX extensions it loads on demand, its fonts, and
# the accessibility parts its menu can switch on
MATHJAX_PARTS = ("tex-mml-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "a11y", "sre", "ui")


class MathJaxError(RuntimeError):
    pass


class ResultsTable(_nodes.figure):
    """A glued results table with its caption: numbered "Table N" (Sphinx's table counter)."""


TABLE_PREFIX = "tab-"


def _visit_results_table(self, node):
    self.visit_figure(node)


def _depart_results_table(self, node):
    self.depart_figure(node)


def _cache_dir() -> Path:
    return Path(os.environ.get("BOOK_CACHE", ROOT / ".cache"))


def mathjax_static(cache: Path | None = None, fetch=None) -> Path:
    """A folder holding ``mathjax/tex-mml-chtml.js`` and what it loads, unpacked from the pinned release;
    fetched and checked on first use. ``fetch(url) -> bytes`` replaces the download (tests)."""
    cache = Path(cache or _cache_dir())
    out = cache / f"mathjax-{MATHJAX_VERSION}"
    if (out / "mathjax" / "tex-mml-chtml.js").exists():
        return out
    tgz = cache / f"mathjax-{MATHJAX_VERSION}.tgz"
    if tgz.exists():
        data = tgz.read_bytes()
    else:
        try:
            data = (fetch or _download)(MATHJAX_URL)
        except OSError as e:
            raise MathJaxError(
                f"could not download MathJax {MATHJAX_VERSION} from {MATHJAX_URL} ({e}). The book serves its own "
                f"copy so that math renders offline; download that file on a machine with network and put it at "
                f"{tgz}, then build again") from e
    digest = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != MATHJAX_SHA512:
        raise MathJaxError(f"{MATHJAX_URL}: sha512 {digest} is not the pinned {MATHJAX_SHA512}; the file is "
                           f"damaged or not MathJax {MATHJAX_VERSION} (delete {tgz} if it is there and build again)")
    cache.mkdir(parents=True, exist_ok=True)
    if not tgz.exists():
        tmp = tgz.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(tgz)
    staging = cache / f".mathjax-{MATHJAX_VERSION}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.removeprefix("package/es5/")
            if member.isfile() and rel != member.name and any(rel == p or rel.startswith(p + "/") for p in MATHJAX_PARTS):
                dest = staging / "mathjax" / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(tar.extractfile(member).read())
    shutil.rmtree(out, ignore_errors=True)
    staging.replace(out)  # whole or not at all: a build that stops halfway leaves no partial copy
    return out


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def _config_inited(app, config):
    static = mathjax_static()
    config.html_static_path = [*config.html_static_path, str(static), str(Path(__file__).parent / "static")]
    config.mathjax_path = "mathjax/tex-mml-chtml.js"


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated <script> entries: sphinx-thebe's inline configuration comes twice in Jupyter Book's
    pages, and its second `const` declaration is a JavaScript error in the browser."""
    context["default_mode"] = "light"  # with none, the theme logs an error in the browser
    seen, kept = set(), []
    for js in context.get("script_files", []):
        key = (str(getattr(js, "filename", js) or ""),
               tuple(sorted((k, str(v)) for k, v in getattr(js, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    context["script_files"] = kept


def fmt(v) -> str:
    """A number for a table: three significant figures, no exponent for everyday magnitudes."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, str):
        return v
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _table(header: list[str], rows: list[list[str]]):
    from docutils import nodes

    table = nodes.table(classes=["book-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group += [nodes.colspec(colwidth=1) for _ in header]
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body
    for cells, part in [(header, head)] + [(r, body) for r in rows]:
        row = nodes.row()
        for c in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=str(c))
            row += entry
        part += row
    return table


def status_tables(rows: list[dict]) -> tuple[str, tuple[list, list], tuple[list, list] | None, list[str]]:
    """The status page from ``status.status_rows``: its summary line, the chapters' table (header, rows),
    the targets' table (header, rows; None when no chapter set a target), every cell a string, and why each
    stale chapter is stale (one line a chapter, listed under the table so that its cells stay short).

    A chapter's row counts its claims held and its targets met; the targets' table lists each target in
    chapter order with its value, its goal, met or missed, and the date of the measurement it comes from."""
    from tools.site import status

    def count(r):
        goals = r["targets"]
        if not goals:
            return "-"
        met = sum(1 for g in goals if g["met"])
        return f"{met} of {len(goals)}" + (f" ({len(goals) - met} missed)" if met < len(goals) else "")

    chapters = (["chapter", "measured on", "libraries", "fresh", "claims hold", "targets met"],
                [[r["chapter"], f"{r['device']}, {r['date']}, commit {r.get('commit', '-')}" if r["results"]
                  else "no results",
                  f"torch {r['torch']}, Triton {r['triton']}, CUDA {r['cuda']}, driver {r['driver']}"
                  if r["results"] else "-",
                  ("yes" if r["fresh"] else "no (below)") if r["results"] else "-",
                  "-" if r["claims_total"] is None else f"{r['claims_held']:.0f} of {r['claims_total']:.0f}",
                  count(r)]
                 for r in rows])
    stale = [f"{r['chapter']}: " + "; ".join(r["stale"]) for r in rows if r["results"] and not r["fresh"]]
    goals = status.target_rows(rows)
    targets = (["chapter", "target", "value", "goal", "met", "measured"],
               [[g["chapter"], g["target"], fmt(g["value"]), g["goal"], "met" if g["met"] else "MISSED",
                 g["date"] or "-"] for g in goals]) if goals else None
    return status.summary(rows), chapters, targets, stale


def _directives():
    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective

    class BookStatus(SphinxDirective):
        """The status table of every chapter (status.status_rows)."""

        def run(self):
            from tools.site import status

            rows = status.status_rows()
            for r in rows:
                self.env.note_dependency(str(ROOT / "notebooks" / f"{r['chapter']}.ipynb"))
            summary, chapters, targets, stale = status_tables(rows)
            out = [nodes.paragraph(text=summary), _table(*chapters)]
            if stale:
                out.append(nodes.paragraph(text="Why a chapter's results are not fresh (re-measure it to make "
                                                "them so):"))
                items = nodes.bullet_list()
                for line in stale:
                    item = nodes.list_item()
                    item += nodes.paragraph(text=line)
                    items += item
                out.append(items)
            if targets:
                out.append(nodes.paragraph(text="The targets, each with its value on the reference measurement of "
                                                "its chapter and the date that measurement was taken (a missed "
                                                "target is listed here, never counted as a claim):"))
                out.append(_table(*targets))
            return out

    class BookDevices(SphinxDirective):
        """Every chapter's headline numbers on every device with results (status.device_rows)."""

        def run(self):
            from lib.bench import results
            from tools.site import status

            shown, rows, missing = status.device_rows()
            others = [s for s in shown if s != results.REFERENCE]
            header = ["chapter", "quantity", "unit", *shown, *[f"{s} / {results.REFERENCE}" for s in others]]
            table = _table(header, [[r["chapter"], r["quantity"], r["unit"], *[fmt(r.get(s)) for s in shown],
                                     *[fmt(r.get(f"{s} / {results.REFERENCE}")) for s in others]] for r in rows])
            out = []
            if not others:
                out.append(nodes.paragraph(text=f"results/ holds one device, {results.REFERENCE}: its headline "
                                                f"numbers are below. Add yours as the next section says."))
            if missing:
                out.append(nodes.paragraph(text="results/ also holds " + ", ".join(missing) + ", whose notebooks "
                                           "have not been replayed here: run python tools/book.py devices, then "
                                           "build the book again."))
            return [*out, table]

    return BookStatus, BookDevices


def _paste_figure_from_doc():
    from docutils import nodes
    from docutils.parsers.rst import directives as spec
    from myst_nb.ext.glue.directives import PasteFigureDirective
    from myst_nb.ext.glue.utils import PendingGlueReferenceError, create_pending_glue_ref, glue_warning

    class PasteFigureFromDoc(PasteFigureDirective):
        """myst-nb's glue:figure, which also takes ``:doc:``: the same pending cross-document reference
        that ``{glue}`` with ``:doc:`` creates, inside a figure with the directive's caption and name."""

        option_spec = {**PasteFigureDirective.option_spec, "doc": spec.unchanged}

        def run(self):
            if "doc" not in self.options:
                return super().run()
            try:
                ref = create_pending_glue_ref(self.document, self.source, self.line, self.options["doc"],
                                              self.arguments[0])
            except PendingGlueReferenceError as exc:
                return [glue_warning(str(exc), self.document, self.line)]
            is_table = self.options.get("name", "").startswith(TABLE_PREFIX)
            figure = (ResultsTable if is_table else nodes.figure)("", ref)
            self.set_source_info(figure)
            if self.options.get("figwidth") is not None:
                figure["width"] = self.options["figwidth"]
            if self.options.get("figclass"):
                figure["classes"] += self.options["figclass"]
            if self.options.get("align"):
                figure["align"] = self.options["align"]
            self.add_name(figure)
            if self.content:
                node = nodes.Element()
                self.state.nested_parse(self.content, self.content_offset, node)
                first = node[0]
                if not isinstance(first, nodes.paragraph):
                    return [figure, glue_warning("Figure caption must be a paragraph.", self.document, self.lineno)]
                caption = nodes.caption(first.rawsource, "", *first.children)
                caption.source, caption.line = first.source, first.line
                figure += caption
                if len(node) > 1:
                    figure += nodes.legend("", *node[1:])
            return [figure]

    return PasteFigureFromDoc


def setup(app):
    sys.path.insert(0, str(ROOT))
    app.connect("config-inited", _config_inited)
    app.connect("html-page-context", _dedupe_scripts)
    status, devices = _directives()
    app.add_directive("book-status", status)
    app.add_directive("book-devices", devices)
    app.add_directive_to_domain("glue", "figure", _paste_figure_from_doc(), override=True)
    app.add_enumerable_node(ResultsTable, "table", html=(_visit_results_table, _depart_results_table),
                            latex=(_visit_results_table, _depart_results_table))
    app.add_css_file("book.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
