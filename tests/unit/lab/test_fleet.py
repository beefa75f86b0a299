"""The seeded fleet of the paper's Table 8 (section 6.7): sizes, curves, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.fleet import TABLE8_VIP_SIZES, lognormal_sizes, make_fleet, table8_sizes


def test_table8_has_the_papers_3330_vips_and_60000_dips() -> None:
    sizes = table8_sizes()
    assert len(sizes) == 3330 == sum(TABLE8_VIP_SIZES.values())
    assert sum(sizes) == 60_000 and max(sizes) == 1000 and sizes.count(5) == 2000
    assert table8_sizes(0.1).count(1000) == 1 and len(table8_sizes(0.1)) == 333


def test_lognormal_sizes_sum_exactly_and_are_heavy_tailed() -> None:
    sizes = lognormal_sizes(3410, 60_000, np.random.default_rng(0))
    assert len(sizes) == 3410 and sum(sizes) == 60_000 and min(sizes) >= 2
    assert max(sizes) >= 1000 and float(np.median(sizes)) <= 10
    assert sizes == lognormal_sizes(3410, 60_000, np.random.default_rng(0))
    with pytest.raises(InvalidInputError):
        lognormal_sizes(10, 15, np.random.default_rng(0))


def test_every_vip_carries_its_true_curves_and_solver_inputs() -> None:
    fleet = make_fleet(5, scale=0.01)
    assert fleet.dip_count == sum(len(v.dips) for v in fleet.vips) and fleet.largest_vip == 1000
    for vip in fleet.vips:
        assert len(vip.capacities) == len(vip.true_curves) == len(vip.dips)
        assert 0.70 <= vip.load <= 0.80
        for mu, true, dip in zip(vip.capacities, vip.true_curves, vip.dips, strict=True):
            assert true.c == pytest.approx(mu / vip.traffic)  # saturates at its capacity
            assert dip.w_max == pytest.approx(min(0.95 * true.c, 1.0))
            assert dip.curve.kind == "quadratic" and dip.curve.latency(0.0) >= 0
    assert make_fleet(5, scale=0.01) == fleet and make_fleet(6, scale=0.01) != fleet
