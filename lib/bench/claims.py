"""A chapter's claims, checked on its data, and the table that ends each notebook.

Every chapter states its claims as checks on numbers it measured or computed ("the copy bandwidth
is at least 0.85 of the datasheet's"). Replaying the reference set, a claim that does not hold is an
error, so CI fails; measuring on another machine it is a visible warning, because other hardware
may legitimately differ and the reader should see where.

A claim teaches: it is a statement the chapter makes, with its bound from the theory or the prediction.
A target is different: a goal the book set for its own code ("the kernel at least 0.97 of SDPA's speed
at every shape"). ``target`` records it beside the claims; it is shown in its own table and on the
status page, met or missed, and never fails the notebook.

Chapters: all (each notebook ends with ``claims.report()``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.bench.results import warn


def _number(v: float) -> str:
    """A bound as a table prints a number (``glue.Table.cell``): 1000000 -> '1000000', 0.5 -> '0.5'."""
    from lib.bench.glue import Table

    return Table.cell(v)


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
            parts.append(f">= {_number(self.at_least)}")
        if self.at_most is not None:
            parts.append(f"<= {_number(self.at_most)}")
        return " and ".join(parts)


def _record(into: list, kind: str, text: str, value, at_least, at_most) -> Claim:
    """Check a claim's or target's arguments and append it to ``into``."""
    if at_least is None and at_most is None:
        raise ValueError(f"{kind} {text!r} has no bound: give at_least=, at_most= or both")
    if not text or any(c.text == text for c in into):
        raise ValueError(f"{kind} text must be non-empty and unique; {text!r} is empty or already used")
    try:
        value = float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{kind} {text!r}: value must be a number, got {value!r}") from e
    item = Claim(text, value, at_least, at_most)
    into.append(item)
    return item


class Claims:
    """Collects checks; ``report()`` shows them as a table and enforces them when ``strict``."""

    def __init__(self, strict: bool):
        self.strict = bool(strict)
        self.items: list[Claim] = []
        self.targets: list[Claim] = []

    def target(self, text: str, value: float, *, at_least: float | None = None,
               at_most: float | None = None) -> bool:
        """Record a target the book set for its own code; returns whether it is met. Never raises on a
        miss: a missed target is reported (the targets table, the status page), not a failed claim."""
        return _record(self.targets, "target", text, value, at_least, at_most).holds

    def targets_from(self, frame, *, text: str = "target", value: str = "measured", goal: str = "goal") -> None:
        """Record every row of a chapter's targets table as a target: its ``goal`` column reads ">= 0.9",
        "<= 1.15" or "0.15 to 0.30" (a band)."""
        for row in frame.to_dict("records"):
            words = str(row[goal]).split()
            if len(words) == 2 and words[0] in (">=", "<="):
                bound = {"at_least" if words[0] == ">=" else "at_most": float(words[1])}
            elif len(words) == 3 and words[1] == "to":
                bound = {"at_least": float(words[0]), "at_most": float(words[2])}
            else:
                raise ValueError(f"target {row[text]!r}: goal {row[goal]!r} is not '>= x', '<= x' or 'x to y'")
            self.target(row[text], row[value], **bound)

    def check(self, text: str, value: float, *, at_least: float | None = None, at_most: float | None = None) -> None:
        """Record that ``value`` should lie within the bounds (``failed`` lists the claims that do not hold).
        Nothing is returned, so a notebook cell that ends with a check shows nothing."""
        _record(self.items, "claim", text, value, at_least, at_most)

    @property
    def failed(self) -> list[Claim]:
        return [c for c in self.items if not c.holds]

    def frame(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "claim": [c.text for c in self.items],
                "value": [c.value for c in self.items],
                "bound": [c.bound for c in self.items],
                "holds": ["yes" if c.holds else "NO" for c in self.items],
            }
        ).set_index("claim")

    def targets_frame(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "target": [c.text for c in self.targets],
                "value": [c.value for c in self.targets],
                "goal": [c.bound for c in self.targets],
                "met": ["yes" if c.holds else "no" for c in self.targets],
            }
        )

    def targets_record(self) -> str:
        """The targets as JSON text (what the status page lists): text, value, goal, met."""
        import json

        return json.dumps([{"target": c.text, "value": c.value if math.isfinite(c.value) else None,
                            "goal": c.bound, "met": c.holds} for c in self.targets])

    def glue(self) -> None:
        """Glue the table as ``claims_table``, and ``claims_held`` and ``claims_total`` (the book's status
        page counts them); the targets as ``book_targets`` (JSON text, listed on the status page) and,
        when there are any, their table as ``book_targets_table``."""
        from lib.bench import glue

        glue.table("claims_table", self.frame())
        glue.number("claims_held", len(self.items) - len(self.failed))
        glue.number("claims_total", len(self.items))
        glue.text("book_targets", self.targets_record())
        if self.targets:
            glue.table("book_targets_table", self.targets_frame())

    def report(self) -> None:
        """Show the table; then raise (strict) or warn (otherwise) if a claim does not hold."""
        if not self.items:
            raise ValueError("no claims were checked: a chapter states its claims with check() first")
        try:
            from IPython.display import display

            display(self.frame())
            if self.targets:
                display(self.targets_frame())
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
