"""Count the words of prose on a book page, the measure of the house style's length limit.

    python tools/site/wordcount.py book/03-kv-cache.md [...]

Prose is what a reader reads as sentences: code and directive blocks (a figure's options, a
bibliography), Markdown tables, front matter and HTML comments are left out; a figure's caption, an
admonition's body, an exercise and its solution count. Inside prose a glued value ({glue:text}`...`), a
cross-reference ({numref}`...`, {doc}`...`, {cite:p}`...`), inline code and a math span count as one
word each, as a reader reads them.

Chapters: all (tests/test_book.py holds every chapter page to ``LIMIT`` words).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LIMIT = 3500
# directives whose body is prose (it is rendered as text the reader reads)
PROSE_DIRECTIVES = {"glue:figure", "figure", "admonition", "note", "tip", "warning", "important", "exercise",
                     "solution", "dropdown", "margin", "sidebar", "topic", "epigraph", "seealso"}
_ROLE = re.compile(r"\{[a-z:]+\}`[^`]*`")
_CODE = re.compile(r"`[^`]*`")
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.DOTALL)
_FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\s*(?:\{(?P<name>[^}]+)\})?")


def prose(text: str) -> str:
    """The prose of a MyST page: what the reader reads as sentences (see the module's docstring)."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    if text.startswith("---\n"):
        end = text.find("\n---", 4)
        if end != -1:
            text = text[end + 4:]
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # (fence, is prose)
    for line in text.splitlines():
        stripped = line.strip()
        m = _FENCE.match(stripped)
        if stack and stripped == stack[-1][0]:  # the closing fence of the innermost block
            stack.pop()
            continue
        if m and (not stack or stack[-1][1]):
            name = (m.group("name") or "").strip()
            stack.append((m.group("fence"), name in PROSE_DIRECTIVES))
            continue
        if stack and not stack[-1][1]:
            continue
        if stripped.startswith(":") and re.match(r"^:[a-z-]+:", stripped) and stack:
            continue  # a directive option
        if stripped.startswith("|"):
            continue  # a Markdown table row
        out.append(line)
    return "\n".join(out)


def count(text: str) -> int:
    """Words of prose in a MyST page's text; roles, inline code and math spans count one each."""
    body = prose(text)
    body = _ROLE.sub(" X ", body)
    body = _MATH.sub(" X ", body)
    body = _CODE.sub(" X ", body)
    body = re.sub(r"^#+\s", " ", body, flags=re.MULTILINE)
    return len(re.findall(r"[0-9A-Za-z][\w'’.,%/-]*", body))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    worst = 0
    for path in argv:
        n = count(Path(path).read_text())
        worst = max(worst, n)
        print(f"{n:6d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
