"""Open every page of the built book in headless Chromium and fail on what a reader would see broken.

    python tools/site/check_html.py [_build/html] [--screenshots _build/screenshots] [--chromium /usr/bin/chromium]

Each page is opened twice, from a local HTTP server and over file:// (math must render both ways, with
no network), after MathJax has typeset and every image has loaded or failed. A page fails on:

- raw TeX left on the page (a math element MathJax did not typeset, a TeX error, or TeX-looking text
  outside code);
- an image that did not load, or a request for a file of the site that failed;
- an unresolved glue key or cross-reference (a reference without a link, a glue or figure
  placeholder left as text);
- a broken internal link (a page or file that is not in the site, or an anchor that is not on the page);
- a JavaScript error (an uncaught exception or an error logged to the console);
- on the book's pages (book/), a figure without an id or caption, one that no link on the page
  points to, a table of results outside a figure, a table numbered as a figure ("Fig. N" on a table),
  a table cell that prints NaN or an integer as 32.0, and a figure whose text is shown under 9 pt: the
  PNG records its smallest font and dpi (lib.bench.glue.figure), and the width the browser gives the
  image sets the size the reader sees;
- on a chapter page (book/NN-...), no "Key takeaways" box, fewer than three exercises, or no
  references section with at least one entry.

A full-page screenshot of each page (over HTTP) is saved under --screenshots for a person to look at.
Exit status 1 if any page fails; the problems are listed page by page.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: lib.bench.glue holds the figures' legibility rule
    sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
# flags for a closed network (no background connections) and a root user in a container
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
SKIP_DIRS = {"_static", "_sources", "_images", "_panels_static", "screenshots"}

# Run in the page once it has loaded: waits for MathJax and the images, then reports what it sees.
INSPECT = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await Promise.race([MathJax.startup.promise, new Promise(r => setTimeout(r, 20000))]);
  }
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = "eager"; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => {
    i.addEventListener("load", r); i.addEventListener("error", r); setTimeout(r, 10000); })));
  const skip = "script, style, pre, code, textarea, mjx-container, mjx-assistive-mml, .highlight, .MathJax";
  const texRe = new RegExp(String.raw`\\\(|\\\)|\\\[|\\\]|\$\$|\$[^$\s][^$]{0,80}\$|` +
                           String.raw`\\(frac|cdot|mathrm|text|times|approx|leq?|geq?|sum|log|sqrt|alpha|beta)\b`);
  const leftRe = /\{glue[:}]|::[A-Za-z_]+:\.\d|IPython\.core\.display|<Figure size|<IPython/;
  const rawTex = [], leftovers = [];
  const walker = document.createTreeWalker(document.body || document.documentElement, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest(skip) || !p.getClientRects().length) continue;
    const t = n.textContent;
    if (texRe.test(t)) rawTex.push(t.trim().slice(0, 120));
    if (leftRe.test(t)) leftovers.push(t.trim().slice(0, 120));
  }
  const math = Array.from(document.querySelectorAll("span.math, div.math"));
  const untypeset = math.filter(m => !m.querySelector("mjx-container")).map(m => m.textContent.trim().slice(0, 80));
  const texErrors = Array.from(document.querySelectorAll("mjx-merror")).map(e => e.textContent.slice(0, 80));
  const brokenImages = imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute("src"));
  const unresolvedRefs = Array.from(document.querySelectorAll(".xref")).filter(x => !x.closest("a"))
    .map(x => x.textContent.trim().slice(0, 80));
  const links = Array.from(document.querySelectorAll("a[href]")).map(a => a.href);
  const ids = Array.from(document.querySelectorAll("[id]")).map(e => e.id);
  const hrefs = new Set(Array.from(document.querySelectorAll("a[href]")).map(a => a.getAttribute("href")));
  const figures = Array.from(document.querySelectorAll("figure")).map(f => {
    const cap = f.querySelector("figcaption");
    const referenced = !!f.id && Array.from(hrefs).some(h => h.endsWith("#" + f.id));
    return {id: f.id, caption: cap ? cap.textContent.trim() : "", referenced};
  });
  const resultTables = Array.from(document.querySelectorAll("table.dataframe, table.book-table"));
  const looseTables = resultTables.filter(t => !t.closest("figure")).length;
  const tablesAsFigures = Array.from(document.querySelectorAll("figure")).filter(f =>
      (f.querySelector("table") || (f.id || "").startsWith("tab-")) &&
      /^\s*Fig/.test((f.querySelector("figcaption") || {textContent: ""}).textContent))
    .map(f => f.id || "(no id)");
  const badCells = [];
  resultTables.forEach(t => t.querySelectorAll("td").forEach(td => {
    const s = td.textContent.trim();
    if (/^-?nan$/i.test(s) || /^-?\d+\.0+$/.test(s)) badCells.push(s);
  }));
  const clipped = resultTables.filter(t => {
    let box = t.parentElement;
    while (box && box !== document.body) {
      const o = getComputedStyle(box).overflowX;
      if (o === "auto" || o === "scroll") return false;
      if (t.getBoundingClientRect().right > box.getBoundingClientRect().right + 1) return true;
      box = box.parentElement;
    }
    return false;
  }).length;
  const figureImages = Array.from(document.querySelectorAll("figure img")).map(i => ({
      src: i.getAttribute("src"), natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
      figure: (i.closest("figure") || {}).id || ""}));
  const takeaways = document.querySelectorAll(".admonition.key-takeaways").length;
  const exercises = document.querySelectorAll("div.exercise").length;
  const solutions = document.querySelectorAll("div.solution").length;
  const bibliography = document.querySelectorAll('[role="doc-biblioentry"], .citation, ' +
    'section#references [role="doc-footnote"], section#references .footnote').length;
  const referencesSection = !!document.querySelector("section#references");
  return {rawTex, leftovers, untypeset, texErrors, brokenImages, unresolvedRefs, links, ids, figures, looseTables,
          tablesAsFigures, badCells, clipped, figureImages, takeaways, exercises, solutions, bibliography,
          referencesSection, mathCount: math.length};
}
"""


def pages_of(site: Path) -> list[Path]:
    """Every HTML page of the site, the theme's own folders excepted."""
    return sorted(p for p in site.rglob("*.html") if not SKIP_DIRS & set(p.relative_to(site).parts[:-1]))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(site: Path):
    """A local HTTP server over ``site`` on a free port, in a daemon thread; returns (server, base URL)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _target(site: Path, base: str, page_url: str, href: str) -> tuple[Path, str] | None:
    """(file, fragment) of a link inside the site, or None for a link elsewhere."""
    url = urllib.parse.urljoin(page_url, href)
    parts = urllib.parse.urlsplit(url)
    if url.startswith(base):
        rel = urllib.parse.unquote(parts.path)[len(urllib.parse.urlsplit(base).path):]
    elif parts.scheme == "file" and urllib.parse.unquote(parts.path).startswith(str(site)):
        rel = urllib.parse.unquote(parts.path)[len(str(site)):].lstrip("/")
    else:
        return None
    path = site / rel
    if rel == "" or rel.endswith("/"):
        path = path / "index.html"
    return path, urllib.parse.unquote(parts.fragment)


def _redirect(path: Path) -> str | None:
    """The target of a page that only forwards the reader (a meta refresh), else None."""
    m = re.search(r'<meta[^>]+http-equiv="refresh"[^>]+content="\d+;\s*url=([^"]+)"', path.read_text(errors="replace"),
                  re.IGNORECASE)
    return m.group(1) if m else None


def inspect_page(context, url: str):
    """Open ``url`` in a fresh tab: (what INSPECT saw, JavaScript and request errors, the tab)."""
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(f"JavaScript error: {e}"))
    page.on("console", lambda m: errors.append(f"console error: {m.text}")
            if m.type == "error" and "favicon.ico" not in (m.location or {}).get("url", "") else None)
    # the site needs no network: any request that fails, here or elsewhere, is a problem
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} ({r.failure})"))
    # the browser asks for /favicon.ico on its own; the site does not link one
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    page.goto(url, wait_until="load", timeout=60000)
    page.wait_for_load_state("load")  # after a redirect page
    seen = page.evaluate(INSPECT)
    return seen, errors, page


MIN_SHOWN_PT = 9.0
MIN_EXERCISES = 3
CHAPTER_PAGE = re.compile(r"^book/\d\d-[^/]+\.html$")


def png_font_record(path: Path) -> tuple[float, float] | None:
    """(smallest font in points, dpi) that lib.bench.glue.figure wrote into a PNG, or None."""
    from lib.bench import glue

    try:
        from PIL import Image

        with Image.open(path) as im:
            text = dict(getattr(im, "text", {}) or {})
    except (OSError, ValueError):
        return None
    if glue.PNG_FONT_KEY not in text or glue.PNG_DPI_KEY not in text:
        return None
    return float(text[glue.PNG_FONT_KEY]), float(text[glue.PNG_DPI_KEY])


def figure_text_problems(images: list[dict], resolve) -> list[str]:
    """Figures whose text the reader sees under MIN_SHOWN_PT: ``resolve(src)`` gives the PNG's file."""
    from lib.bench import glue

    out = []
    for img in images:
        path = resolve(img["src"])
        if path is None or not path.exists() or not img["natural"]:
            continue
        record = png_font_record(path)
        name = img["figure"] or img["src"]
        if record is None:
            out.append(f"figure {name!r}: its image does not record its font size (glue it with "
                       f"lib.bench.glue.figure, which checks that it is legible)")
            continue
        font, dpi = record
        shown = glue.shown_pt(font, dpi, img["natural"], img["shown"])
        if shown < MIN_SHOWN_PT:
            out.append(f"figure {name!r}: its smallest text is shown at {shown:.1f} pt (under {MIN_SHOWN_PT:.0f} pt): "
                       f"the {img['natural']}-pixel image is shown {img['shown']:.0f} pixels wide")
    return out


def chapter_problems(seen: dict) -> list[str]:
    """What a chapter page must have: a Key takeaways box, exercises, a references section."""
    out = []
    if not seen["takeaways"]:
        out.append("chapter without a 'Key takeaways' box (an admonition with class key-takeaways)")
    if seen["exercises"] < MIN_EXERCISES:
        out.append(f"chapter with {seen['exercises']} exercises (at least {MIN_EXERCISES}, sphinx-exercise)")
    if seen["solutions"] < seen["exercises"]:
        out.append(f"{seen['exercises'] - seen['solutions']} exercise(s) without a solution")
    if not seen["referencesSection"] or not seen["bibliography"]:
        out.append("chapter without a references section listing at least one reference")
    return out


def problems_of(seen: dict, errors: list[str], chapter: bool) -> list[str]:
    """What is wrong with a page, from what INSPECT saw and the errors logged while it loaded."""
    out = list(errors)
    out += [f"math not typeset: {t!r}" for t in seen["untypeset"]]
    out += [f"TeX error: {t!r}" for t in seen["texErrors"]]
    out += [f"raw TeX in the text: {t!r}" for t in seen["rawTex"]]
    out += [f"unresolved glue or output left as text: {t!r}" for t in seen["leftovers"]]
    out += [f"image did not load: {s}" for s in seen["brokenImages"]]
    out += [f"unresolved cross-reference: {t!r}" for t in seen["unresolvedRefs"]]
    if chapter:
        for f in seen["figures"]:
            if not f["id"]:
                out.append(f"figure without an id (label): caption {f['caption'][:60]!r}")
            elif not f["referenced"]:
                out.append(f"figure {f['id']!r} is not referenced from the page")
            if len(f["caption"]) < 20:
                out.append(f"figure {f['id']!r} has no real caption: {f['caption']!r}")
        if seen["looseTables"]:
            out.append(f"{seen['looseTables']} table(s) of results outside a captioned figure")
        out += [f"table {i!r} is numbered as a figure (name it tab-..., a Table)" for i in seen["tablesAsFigures"]]
        out += [f"table cell prints {s!r} (NaN, or an integer as a float)" for s in dict.fromkeys(seen["badCells"])]
        if seen["clipped"]:
            out.append(f"{seen['clipped']} table(s) wider than the column and clipped (no horizontal scroll)")
    return out


def check_site(site: Path, screenshots: Path | None = None, chromium: str = CHROMIUM, file_too: bool = True,
               log=print) -> dict[str, list[str]]:
    """Problems per page (relative path -> list; empty lists for good pages)."""
    from playwright.sync_api import sync_playwright

    site = site.resolve()
    pages = pages_of(site)
    if not pages:
        raise SystemExit(f"no HTML pages under {site}: build the book first (make book)")
    if not Path(chromium).exists():
        raise SystemExit(f"{chromium} not found: install Debian's chromium (apt-get install chromium), or pass "
                         f"--chromium with the path of a Chromium binary")
    server, base = serve(site)
    found: dict[str, list[str]] = {}
    ids: dict[Path, set[str]] = {}
    links: list[tuple[str, Path, str]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=FLAGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            for path in pages:
                t0 = time.perf_counter()
                rel = path.relative_to(site).as_posix()
                redirect = _redirect(path)
                if redirect is not None:  # a page that only forwards the reader: its target must exist
                    links.append((rel, *_target(site, base, base + rel, redirect)))
                    found[rel] = []
                    log(f"ok   {rel} (forwards to {redirect})")
                    continue
                chapter = rel.startswith("book/")
                probs = []
                transports = [("http", base + rel)] + ([("file", path.as_uri())] if file_too else [])
                for how, url in transports:
                    seen, errors, page = inspect_page(context, url)
                    probs += [f"[{how}] {p}" for p in problems_of(seen, errors, chapter)]
                    if how == "http" and chapter:
                        def resolve(src, url=url):
                            t = _target(site, base, url, src)
                            return t[0] if t else None
                        probs += [f"[{how}] {p}" for p in figure_text_problems(seen["figureImages"], resolve)]
                        if CHAPTER_PAGE.match(rel):
                            probs += [f"[{how}] {p}" for p in chapter_problems(seen)]
                    if how == "http":
                        ids[path] = set(seen["ids"])
                        for href in seen["links"]:
                            t = _target(site, base, url, href)
                            if t:
                                links.append((rel, *t))
                        if screenshots is not None:
                            shot = screenshots / (rel.replace("/", "__").removesuffix(".html") + ".png")
                            shot.parent.mkdir(parents=True, exist_ok=True)
                            page.screenshot(path=str(shot), full_page=True)
                    page.close()
                found[rel] = probs
                log(f"{'ok  ' if not probs else 'FAIL'} {rel}" + (f" ({len(probs)} problems)" if probs else "")
                    + f" [{time.perf_counter() - t0:.1f} s]")
            browser.close()
    finally:
        server.shutdown()
    for rel, path, frag in links:
        if not path.exists():
            found[rel].append(f"broken link: {path.relative_to(site) if path.is_relative_to(site) else path}")
        elif frag and path.suffix == ".html" and path in ids and frag not in ids[path]:
            found[rel].append(f"broken link: {path.relative_to(site)}#{frag} (no such anchor)")
    for rel in found:
        found[rel] = list(dict.fromkeys(found[rel]))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", nargs="?", default=str(ROOT / "_build" / "html"))
    ap.add_argument("--screenshots", default=None, help="folder for the screenshots (default: _build/screenshots "
                                                         "beside the site)")
    ap.add_argument("--chromium", default=CHROMIUM)
    ap.add_argument("--no-file", action="store_true", help="only over HTTP, not over file://")
    args = ap.parse_args(argv)
    site = Path(args.site)
    shots = Path(args.screenshots) if args.screenshots else site.resolve().parent / "screenshots"
    found = check_site(site, shots, args.chromium, file_too=not args.no_file)
    bad = {k: v for k, v in found.items() if v}
    for rel, probs in bad.items():
        print(f"\n{rel}:")
        for p in probs:
            print(f"  - {p}")
    print(f"\n{len(found) - len(bad)} of {len(found)} pages pass; screenshots in {shots}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
