"""What a chapter's analysis hands its page: numbers, words and tables, by the names the page pastes.

An experiment module computes a ``Page`` from its results (a function of data, tested like any other);
the notebook's glue cell only publishes it (``lib.bench.glue.publish``). The page itself is plain data,
so the measuring side of the library may build one without importing the book side.

Chapters: all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Page:
    """What a chapter's analysis hands to its page: numbers {name: float}, texts {name: words} and tables
    {name: DataFrame}, each pasted by name. An experiment module computes a ``Page`` from its results
    (a function of data, tested like any other); the notebook's glue cell only publishes it."""

    numbers: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)

    def __post_init__(self):
        for what in ("numbers", "texts", "tables"):
            if not isinstance(getattr(self, what), dict):
                raise TypeError(f"Page.{what} is a dict {{name: value}}, got {type(getattr(self, what)).__name__}")
        both = (set(self.numbers) & set(self.texts)) | (set(self.numbers) & set(self.tables)) \
            | (set(self.texts) & set(self.tables))
        if both:
            raise ValueError(f"a page name is glued once: {sorted(both)} appear under two kinds")

    def merged(self, other: Page) -> Page:
        """This page and ``other`` together; a name in both is an error (one of them would be lost)."""
        for what in ("numbers", "texts", "tables"):
            twice = set(getattr(self, what)) & set(getattr(other, what))
            if twice:
                raise ValueError(f"{what} {sorted(twice)} are on both pages: each name is glued once")
        return Page({**self.numbers, **other.numbers}, {**self.texts, **other.texts},
                    {**self.tables, **other.tables})
