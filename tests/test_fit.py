"""lib.bench.fit: least squares against exact rational arithmetic, and the same bits whatever the order of
the points (what a BLAS-based fit cannot promise from one machine to the next)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from lib.bench import fit


def exact_lstsq(A: np.ndarray, y: np.ndarray) -> list[Fraction]:
    """The least-squares solution in exact rationals: the normal equations A^T A x = A^T y, eliminated."""
    m, n = A.shape
    G = [[sum(Fraction(A[i, a]) * Fraction(A[i, b]) for i in range(m)) for b in range(n)] for a in range(n)]
    h = [sum(Fraction(A[i, a]) * Fraction(y[i]) for i in range(m)) for a in range(n)]
    for k in range(n):
        for r in range(k + 1, n):
            f = G[r][k] / G[k][k]
            G[r] = [G[r][c] - f * G[k][c] for c in range(n)]
            h[r] -= f * h[k]
    x = [Fraction(0)] * n
    for k in reversed(range(n)):
        x[k] = (h[k] - sum(G[k][j] * x[j] for j in range(k + 1, n))) / G[k][k]
    return x


def test_a_line_through_hand_worked_points():
    assert fit.fit_line([0, 1, 2], [1, 3, 5]) == (1.0, 2.0)  # y = 1 + 2x exactly
    a, b = fit.fit_line([0, 1, 2, 3], [0, 1, 1, 2])  # mean x 1.5, mean y 1; sxy 3, sxx 5: b 0.6, a 0.1
    assert b == pytest.approx(0.6, rel=1e-15) and a == pytest.approx(0.1, rel=1e-14)
    with pytest.raises(ValueError, match="two different x"):
        fit.fit_line([1, 1], [2, 3])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lstsq_equals_the_exact_solution_within_the_condition_number(seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((40, 4)) * np.array([1.0, 1e2, 1e4, 1e6])  # columns of very different scales
    A[:, 0] = 1.0
    y = A @ rng.standard_normal(4) + 1e-2 * rng.standard_normal(40)
    exact = np.array([float(v) for v in exact_lstsq(A, y)])
    np.testing.assert_allclose(fit.lstsq(A, y), exact, rtol=1e-8)
    x = fit.lstsq(A, y)  # no worse a fit than the exact solution rounded to floats
    assert fit.residual(A, x, y) <= fit.residual(A, exact, y) * (1 + 1e-5)  # (y ~ 1e6: its last bits are 1e-9)


def test_the_fit_depends_on_the_points_not_their_order():
    rng = np.random.default_rng(3)
    A = np.column_stack([np.ones(500), rng.uniform(1, 64, 500), rng.uniform(0, 1e6, 500)])
    y = A @ np.array([2e-3, 1e-4, 3e-9]) * rng.lognormal(0, 0.05, 500)
    x = fit.lstsq(A, y)
    perm = rng.permutation(500)
    assert fit.lstsq(A[perm], y[perm]).tolist() == x.tolist()  # bit for bit
    assert fit.residual(A[perm], x, y[perm]) == fit.residual(A, x, y)
    a, b = fit.fit_line(A[:, 1], y)
    assert fit.fit_line(A[perm, 1], y[perm]) == (a, b)


def test_nonneg_lstsq_drops_a_negative_coefficient_and_refits():
    A = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # y = 4 - x: the slope would be negative; without it the mean, 2
    x = fit.nonneg_lstsq(A, y)
    assert x[1] == 0.0 and x[0] == pytest.approx(2.0, rel=1e-15)
    assert fit.residual(A, x, y) == pytest.approx(2.0, rel=1e-15)  # (3-2)^2 + 0 + (1-2)^2


def test_fewer_points_than_coefficients_give_the_shortest_exact_solution():
    # x1 + 2 x2 = 5: the solutions lie on a line, the shortest is along (1, 2): x = (1, 2)
    np.testing.assert_allclose(fit.lstsq([[1.0, 2.0]], [5.0]), [1.0, 2.0], rtol=1e-15)
    # x1 + x2 + x3 = 3 and x1 - x3 = 0: shortest (1, 1, 1)
    np.testing.assert_allclose(fit.lstsq([[1.0, 1.0, 1.0], [1.0, 0.0, -1.0]], [3.0, 0.0]), [1.0, 1.0, 1.0], atol=1e-15)


def test_bad_systems_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="depends on the ones before it"):
        fit.lstsq([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="row .* depends on the ones before it"):
        fit.lstsq([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        fit.lstsq([[1.0], [float("nan")]], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"A \[m, n\] and y \[m\]"):
        fit.lstsq([[1.0], [2.0]], [1.0, 2.0, 3.0])
