"""Safety rails around every plan (not in the paper; each one can be switched off).

* A minimum weight for every healthy, non-drained DIP: none starves, and every curve keeps
  getting fresh points at a non-zero weight.
* A bound on how far one DIP's weight moves in one step (failure removal is exempt: the
  failed DIP goes to 0 at once and the bound is relaxed as far as needed to absorb it).
* Slow start: a returning DIP's weight may rise from the minimum to its solved weight only
  linearly over ``slow_start`` seconds.
* Over-capacity: when the DIPs' ``w_max`` sum to less than 1 no plan keeps every DIP below its
  measured limit; the traffic is spread in proportion to ``w_max`` (estimated capacity) and
  the plan is flagged ``over-capacity``.

All bounds are applied together by :func:`project`: the Euclidean projection of the solved
weights onto ``{sum = 1, lo <= w <= hi}`` (a shift ``lambda`` found by bisection, ``w_i =
clip(target_i + lambda, lo_i, hi_i)``). If the bounds admit no plan, upper bounds are
relaxed first, then lower bounds, so the result always sums to 1 and is never all zero.
"""

from __future__ import annotations

from collections.abc import Mapping


def project(target: Mapping[str, float], lo: Mapping[str, float], hi: Mapping[str, float]) -> dict[str, float]:
    """Closest weights to ``target`` with ``lo <= w <= hi`` summing to 1 (bounds relaxed if needed)."""
    names = list(target)
    low = {d: max(0.0, lo.get(d, 0.0)) for d in names}
    high = {d: max(low[d], hi.get(d, 1.0)) for d in names}
    if sum(high.values()) < 1:
        high = {d: 1.0 for d in names}
    if sum(low.values()) > 1:
        scale = 1 / sum(low.values())
        low = {d: v * scale for d, v in low.items()}

    def total(shift: float) -> float:
        return sum(min(high[d], max(low[d], target[d] + shift)) for d in names)

    a, b = -2.0, 2.0
    for _ in range(100):
        mid = (a + b) / 2
        if total(mid) < 1:
            a = mid
        else:
            b = mid
    out = {d: min(high[d], max(low[d], target[d] + b)) for d in names}
    s = sum(out.values())
    return {d: v / s for d, v in out.items()}


def apply_rails(
    solved: Mapping[str, float],
    *,
    previous: Mapping[str, float] | None,
    healthy: set[str],
    min_weight: float,
    max_change: float,
    ramp_caps: Mapping[str, float] | None = None,
    fixed: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Minimum weight, change bound, slow-start caps and fixed weights (pins, drains, failures)."""
    fixed = dict(fixed or {})
    ramp_caps = ramp_caps or {}
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for dip in solved:
        if dip in fixed:
            lo[dip] = hi[dip] = fixed[dip]
            continue
        low = min_weight if dip in healthy else 0.0
        high = 1.0 if dip in healthy else 0.0
        if previous is not None and dip in previous and max_change < 1:
            low = max(low, previous[dip] - max_change)
            high = min(high, previous[dip] + max_change)
        if dip in ramp_caps:
            high = min(high, max(min_weight, ramp_caps[dip]))
        lo[dip], hi[dip] = min(low, high), high
    result = project(dict(solved), lo, hi)
    if sum(hi.values()) < 1 - 1e-9 and previous is not None:
        # The change bound cannot absorb what failed DIPs released: drop it, keep the rest.
        return apply_rails(solved, previous=None, healthy=healthy, min_weight=min_weight, max_change=1.0,
                           ramp_caps=ramp_caps, fixed=fixed)
    return result


def capacity_proportional(w_max: Mapping[str, float]) -> dict[str, float]:
    """Weights in proportion to each DIP's estimated capacity ``w_max`` (equal if all are 0)."""
    total = sum(max(0.0, w) for w in w_max.values())
    if total <= 0:
        return {d: 1 / len(w_max) for d in w_max}
    return {d: max(0.0, w) / total for d, w in w_max.items()}
