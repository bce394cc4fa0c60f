"""Byte sizes as a reader reads them (1048576 -> '1 MiB'), for tables, figures and the page's words alike.

Chapters: all.
"""

from __future__ import annotations

UNITS = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B")]


def human_bytes(n: float) -> str:
    """1048576 -> '1 MiB', 1610612736 -> '1.5 GiB'."""
    for scale, unit in UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} B"
