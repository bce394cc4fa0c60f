"""Numbers, words and figures handed from a notebook to the book's prose (myst-nb glue).

A page never types a measured number: it pastes a glued one, for example
{glue:text}`../notebooks/00-the-machine.ipynb::copy_bw_GBps:.0f`. Numbers are glued as plain
Python floats (a ratio as 0.85, not "85%"), in the unit their name says (``_us``, ``_GBps``).
Words (a device name, a date) are glued as strings and pasted the same way, with {glue:text}.

Chapters: all.
"""

from __future__ import annotations

from numbers import Real


def number(name: str, value) -> None:
    """Glue a number under ``name`` as a float (not displayed here).

    NaN is allowed (a smoke run may lack the sizes a quantity needs) and shows as "nan"; the
    chapter's claims fail on it, so the reference set can never carry one into the book.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"glue {name!r}: expected a real number, got {type(value).__name__} {value!r}")
    _paste(name, float(value))


def numbers(values: dict) -> None:
    """Glue every number of a table {name: value}: how a notebook hands its numbers to the page, as data."""
    for name, value in values.items():
        number(name, value)


def texts(values: dict) -> None:
    """Glue every text of a table {name: words}."""
    for name, words in values.items():
        text(name, words)


def text(name: str, words: str) -> None:
    """Glue a short text (a device name, a date), pasted with {glue:text}."""
    if not isinstance(words, str) or not words.strip():
        raise TypeError(f"glue {name!r}: expected a non-empty string, got {words!r}")
    _paste(name, words)


def figure(name: str, fig) -> None:
    """Glue a matplotlib figure; a page shows it with the {glue} directive and its :doc: option."""
    _paste(name, fig)


def table(name: str, frame) -> None:
    """Glue a pandas DataFrame (a claims table, a summary); shown like a figure."""
    _paste(name, frame)


def _paste(name: str, value) -> None:
    from myst_nb import glue

    if not name.isidentifier():
        raise ValueError(f"glue name {name!r} must be an identifier such as copy_bw_GBps")
    glue(name, value, display=False)
