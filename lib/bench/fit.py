"""A straight line through points, by least squares, in plain Python floats.

The sums run in a fixed order, so the same points give the same line to the last bit on every machine
(a LAPACK-based fit can differ in its last digits between CPUs, and the book compares its replayed
numbers exactly).

Chapters: 3 (a fixed cost and a time per token), 6 (the decode step's cost per KV token).
"""

from __future__ import annotations


def fit_line(xs, ys) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    n = len(xs)
    if n < 2:
        raise ValueError("fit_line needs at least two points")
    if len(ys) != n:
        raise ValueError(f"fit_line needs one y per x, got {n} x and {len(ys)} y")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError(f"fit_line needs at least two different x to fix a slope, got {list(xs)}")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b
