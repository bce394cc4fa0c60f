"""Least squares that give the same numbers to the last bit on every machine.

A LAPACK or BLAS call (``numpy.linalg.lstsq``, ``polyfit``, ``A @ x``) picks its kernels by the CPU and the
thread count, and the order of its sums with them: the same points give a fit that differs in its last
digits from one machine to the next, and the book compares its replayed numbers exactly. Here every step is
an elementwise IEEE operation (correctly rounded, whatever the vector width) or a sum taken with
``math.fsum`` (correctly rounded, whatever the order), so the result depends on the points alone.

- ``fit_line``: y = a + b x, from the centred sums.
- ``lstsq``: min ||A x - y|| for a few columns, by Householder QR (the columns are reflected one by one
  onto the axes, then R x = Q^T y is solved from the bottom row up): no normal equations, so the error
  grows with the condition number of A, not with its square. The rows are sorted first, so the same points
  in another order give the same bits.
- ``nonneg_lstsq``: the same with every coefficient >= 0 (a negative one is set to 0 and the rest refitted).
- ``residual``: the sum of squares ||A x - y||^2.

Chapters: 3 (a fixed cost and a time per token), 6 (the decode step's cost per KV token), 8 (the engine's
step-cost fits), 10 (a collective's latency and bandwidth).
"""

from __future__ import annotations

import math

import numpy as np


def fit_line(xs, ys) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    n = len(xs)
    if n < 2:
        raise ValueError("fit_line needs at least two points")
    if len(ys) != n:
        raise ValueError(f"fit_line needs one y per x, got {n} x and {len(ys)} y")
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError(f"fit_line needs at least two different x to fix a slope, got {xs}")
    b = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _dot(u: np.ndarray, v: np.ndarray) -> float:
    return math.fsum((u * v).tolist())


def _matrix(A, y) -> tuple[np.ndarray, np.ndarray]:
    A = np.array(A, dtype=np.float64)
    y = np.array(y, dtype=np.float64)
    if A.ndim != 2 or y.ndim != 1 or A.shape[0] != y.shape[0]:
        raise ValueError(f"least squares needs A [m, n] and y [m]; got A {list(A.shape)} and y {list(y.shape)}")
    if not (np.isfinite(A).all() and np.isfinite(y).all()):
        raise ValueError("least squares needs finite A and y: a NaN or an infinity has no fit")
    return A, y


def _householder(cols: list[np.ndarray], rhs: list[np.ndarray], what: str = "column") -> list[tuple[int, np.ndarray, float]]:
    """Reflect ``cols`` (the columns of an m x n matrix, m >= n, in place) onto upper-triangular R, applying
    the same reflections to each vector of ``rhs``; refuses a column that depends on the ones before it.
    Returns the reflections (k, v, v.v): H_k = I - 2 v v^T / v.v on entries k and after."""
    scale = [math.sqrt(_dot(c, c)) for c in cols]
    reflections = []
    for k in range(len(cols)):
        v = cols[k][k:].copy()
        norm = math.sqrt(_dot(v, v))
        if norm <= 1e-12 * max(scale[k], 1e-300):
            raise ValueError(f"{what} {k} of A depends on the ones before it: the fit has no single solution")
        alpha = -norm if v[0] >= 0 else norm  # reflect onto -sign(v0) |v| e1: no cancellation in v0 - alpha
        v[0] -= alpha
        vv = _dot(v, v)
        for c in [*cols[k:], *rhs]:
            s = 2.0 * _dot(v, c[k:]) / vv
            c[k:] -= s * v
        reflections.append((k, v, vv))
    return reflections


def lstsq(A, y) -> np.ndarray:
    """The x of least ||A x - y|| (A [m, n] of independent columns), by Householder QR; with fewer rows
    than columns (m < n, independent rows), the x of least ||x|| that solves A x = y, from the QR of A^T."""
    A, y = _matrix(A, y)
    m, n = A.shape
    order = np.lexsort((y, *(A[:, j] for j in reversed(range(n)))))  # rows sorted: the fit of a set of points
    A, y = A[order], y[order]
    if m < n:  # A^T = Q R: A x = R^T (Q^T x) = y; z = Q^T x from R^T z = y, and x = Q z (z's last n - m are 0)
        cols = [A[i, :].copy() for i in range(m)]
        reflections = _householder(cols, [], "row (sorted)")
        z = np.zeros(m)
        for k in range(m):
            z[k] = (y[k] - math.fsum([cols[k][j] * z[j] for j in range(k)])) / cols[k][k]
        x = np.concatenate([z, np.zeros(n - m)])
        for k, v, vv in reversed(reflections):  # x = Q (z, 0) = H_0 ... H_{m-1} (z, 0)
            x[k:] -= 2.0 * _dot(v, x[k:]) / vv * v
        return x
    cols = [A[:, j].copy() for j in range(n)]
    b = y.copy()
    _householder(cols, [b])
    x = np.zeros(n)
    for k in reversed(range(n)):
        rest = math.fsum([cols[j][k] * x[j] for j in range(k + 1, n)])  # R[k, j] is column j's entry k
        x[k] = (b[k] - rest) / cols[k][k]
    return x


def nonneg_lstsq(A, y) -> np.ndarray:
    """Least squares with every coefficient >= 0: a coefficient that comes out negative is set to 0 and the
    rest refitted, the most negative first (enough for the two to five columns the book fits)."""
    A, y = _matrix(A, y)
    keep = list(range(A.shape[1]))
    while True:
        x = np.zeros(A.shape[1])
        if keep:
            x[keep] = lstsq(A[:, keep], y)
        neg = [j for j in keep if x[j] < 0]
        if not neg:
            return x
        keep.remove(min(neg, key=lambda j: x[j]))


def residual(A, x, y) -> float:
    """||A x - y||^2, its products elementwise and its sums exactly rounded."""
    A, y = _matrix(A, y)
    r = -y
    for j, xj in enumerate(np.asarray(x, dtype=np.float64).tolist()):
        r = r + A[:, j] * xj
    return _dot(r, r)
