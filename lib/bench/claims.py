"""A chapter's claims, checked on its data, and the table that ends each notebook.

Every chapter states its claims as checks on numbers it measured or computed ("the copy bandwidth
is at least 0.85 of the datasheet's"). Replaying the reference set, a claim that does not hold is an
error, so CI fails; measuring on another machine it is a visible warning, because other hardware
may legitimately differ and the reader should see where.

Chapters: all (each notebook ends with ``claims.report()``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.bench.results import warn


class ClaimsFailed(AssertionError):
    """Raised by a strict report when a claim does not hold on the data."""


@dataclass(frozen=True)
class Claim:
    text: str
    value: float
    at_least: float | None
    at_most: float | None

    @property
    def holds(self) -> bool:
        if not math.isfinite(self.value):
            return False
        lo_ok = self.at_least is None or self.value >= self.at_least
        hi_ok = self.at_most is None or self.value <= self.at_most
        return lo_ok and hi_ok

    @property
    def bound(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f">= {self.at_least:.4g}")
        if self.at_most is not None:
            parts.append(f"<= {self.at_most:.4g}")
        return " and ".join(parts)


class Claims:
    """Collects checks; ``report()`` shows them as a table and enforces them when ``strict``."""

    def __init__(self, strict: bool):
        self.strict = bool(strict)
        self.items: list[Claim] = []

    def check(self, text: str, value: float, *, at_least: float | None = None, at_most: float | None = None) -> bool:
        """Record that ``value`` should lie within the bounds; returns whether it does."""
        if at_least is None and at_most is None:
            raise ValueError(f"claim {text!r} has no bound: give at_least=, at_most= or both")
        if not text or any(c.text == text for c in self.items):
            raise ValueError(f"claim text must be non-empty and unique; {text!r} is empty or already used")
        try:
            value = float(value)
        except (TypeError, ValueError) as e:
            raise TypeError(f"claim {text!r}: value must be a number, got {value!r}") from e
        claim = Claim(text, value, at_least, at_most)
        self.items.append(claim)
        return claim.holds

    @property
    def failed(self) -> list[Claim]:
        return [c for c in self.items if not c.holds]

    def frame(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "claim": [c.text for c in self.items],
                "value": [f"{c.value:.4g}" for c in self.items],
                "bound": [c.bound for c in self.items],
                "holds": ["yes" if c.holds else "NO" for c in self.items],
            }
        ).set_index("claim")

    def glue(self) -> None:
        """Glue the table as ``claims_table``, and ``claims_held`` and ``claims_total`` (the book's status
        page counts them)."""
        from lib.bench import glue

        glue.table("claims_table", self.frame())
        glue.number("claims_held", len(self.items) - len(self.failed))
        glue.number("claims_total", len(self.items))

    def report(self) -> None:
        """Show the table; then raise (strict) or warn (otherwise) if a claim does not hold."""
        if not self.items:
            raise ValueError("no claims were checked: a chapter states its claims with check() first")
        try:
            from IPython.display import display

            display(self.frame())
        except ImportError:  # pragma: no cover - outside a notebook
            print(self.frame().to_string())
        bad = self.failed
        if not bad:
            return
        lines = "; ".join(f"{c.text}: {c.value:.4g}, expected {c.bound}" for c in bad)
        if self.strict:
            raise ClaimsFailed(f"{len(bad)} of {len(self.items)} claims do not hold on the reference set: {lines}")
        warn(
            f"{len(bad)} of {len(self.items)} claims do not hold on this data: {lines}. "
            "Other hardware or a smoke-sized run may legitimately differ from the reference set."
        )
