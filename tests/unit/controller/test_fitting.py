"""Curve fitting (section 4.2) and the better models, with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from knapsack_lb.curves import PiecewiseLinearCurve, QuadraticCurve, QueueingCurve
from knapsack_lb.curves.fitting import fit_curve, leave_one_out_error
from knapsack_lb.errors import InvalidInputError


def test_quadratic_recovers_a_quadratic() -> None:
    ws = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    ls = 0.01 + 0.02 * ws + 0.3 * ws**2
    curve = QuadraticCurve.fit(ws, ls, 0.4, None)
    assert isinstance(curve, QuadraticCurve)
    assert (curve.a, curve.b, curve.c) == pytest.approx((0.01, 0.02, 0.3), abs=1e-9)


def test_quadratic_is_made_monotone_the_papers_way() -> None:
    ws = np.array([0.0, 0.1, 0.2, 0.3])
    ls = np.array([0.02, 0.01, 0.012, 0.03])  # the regression dips below its start
    curve = QuadraticCurve.fit(ws, ls, 0.3, None)
    grid = np.linspace(0, 0.3, 50)
    assert np.all(np.diff(curve.latencies(grid)) >= -1e-12)


def test_queueing_recovers_an_mm1_curve_exactly() -> None:
    """M/M/1 at total rate 1000/s, DIP service rate 300/s: T(w) = 1 / (300 - 1000 w) = 0.001 / (0.3 - w)."""
    ws = np.array([0.0, 0.1, 0.2, 0.25])
    ls = 1 / (300 - 1000 * ws)
    curve = QueueingCurve.fit(ws, ls, 0.0, None)
    assert curve.a == pytest.approx(0.0, abs=1e-5)
    assert curve.b == pytest.approx(0.001, rel=1e-3)
    assert curve.c == pytest.approx(0.3, rel=1e-3)


def test_queueing_capacity_is_bounded_by_the_drop_weight() -> None:
    ws = np.array([0.0, 0.1, 0.2])
    ls = np.array([0.01, 0.0101, 0.0102])  # flat: nothing says where it saturates...
    curve = QueueingCurve.fit(ws, ls, 0.24, (0.24, 0.1))  # ...but it dropped at 0.24
    assert curve.c <= 1.25 * 0.24 + 1e-9


def test_piecewise_is_convex_and_non_decreasing() -> None:
    ws = np.array([0.0, 0.1, 0.2, 0.3])
    ls = np.array([0.01, 0.02, 0.018, 0.05])
    curve = PiecewiseLinearCurve.fit(ws, ls, 0.35, (0.35, 0.1))
    assert isinstance(curve, PiecewiseLinearCurve)
    slopes = np.diff(curve.values) / np.diff(curve.weights)
    assert np.all(slopes >= 0) and np.all(np.diff(slopes) >= -1e-12)
    assert curve.weights[-1] == 0.35


def test_auto_prefers_the_queueing_model_on_queueing_data() -> None:
    points = [(w, 1 / (300 - 1000 * w)) for w in (0.0, 0.1, 0.15, 0.2, 0.25)]
    result = fit_curve(points, model="auto")
    assert result.model == "queueing"
    assert isinstance(result.curve, QueueingCurve)
    assert result.error is not None and result.error < 0.01
    assert result.errors["quadratic"] is not None and result.errors["quadratic"] > result.error


def test_auto_prefers_the_quadratic_on_quadratic_data() -> None:
    points = [(w, 0.01 + 0.1 * w * w) for w in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)]
    assert fit_curve(points, model="auto").model == "quadratic"


def test_too_few_points_for_leave_one_out_falls_back_to_the_preferred_model() -> None:
    points = [(0.0, 0.01), (0.1, 0.012), (0.2, 0.02)]
    result = fit_curve(points, model="auto")
    assert result.model == "queueing" and result.error is None
    assert leave_one_out_error("queueing", np.array([0.0, 0.1, 0.2]), np.array([0.01, 0.012, 0.02]), 0.2, None) \
        is None


def test_bad_input_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match="points"):
        fit_curve([(0.1, 0.01)])
    with pytest.raises(InvalidInputError, match="curve_model"):
        fit_curve([(0.0, 0.01), (0.1, 0.02)], model="cubic")


def test_points_far_from_weight_0_never_give_a_curve_below_0_there() -> None:
    # a refresh starts at the current weight: a steep rise far from 0 extrapolates below 0 at 0
    points = [(0.30, 0.010), (0.33, 0.020), (0.36, 0.045), (0.40, 0.11)]
    for model in ("auto", "quadratic", "queueing", "piecewise"):
        result = fit_curve(points, model=model, w_max=0.40)
        assert result.curve.latency(0.0) > 0, model
        if model != "quadratic":  # the paper's running maximum from weight 0 cannot follow such points
            assert result.curve.latency(0.36) == pytest.approx(0.045, rel=0.5), model
