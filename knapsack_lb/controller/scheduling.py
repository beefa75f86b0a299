"""Scheduling measurement weights on a live LB: KnapsackLB section 4.6.

Algorithm 1 asks for one weight per measuring DIP, but the weights on the LB must sum to 1.
Requests are sorted into three priority classes - (a) over-utilised DIPs (their last round
was a drop: backtracking them relieves an overloaded DIP, so it goes first), (b) the other
measuring DIPs, (c) refreshes - FIFO within a class. A greedy pass hops over the list and
takes every request that still fits under a total of 1; the others wait for a later round.

The remainder ``R = 1 - W`` of the scheduled total ``W`` goes to the DIPs whose curves are
finished, through the solver with its total constraint changed to ``R``; when that is
infeasible (or there are no finished DIPs) it is split equally over all DIPs not scheduled
(ours: in proportion to their estimated capacities when the controller passes them).

Ours on top: weight-0 requests (for ``l_0``) always "fit" but at most ``max_zero`` DIPs sit
at 0 at once, so the rest of the pool is not overloaded at a cold start. When nothing is
left to take the remainder, it is spread over the scheduled DIPs in proportion to their
weights; when that remainder is small (``COUNTED_SCALE_REMAINDER``) the rounds count as
measurements at the scaled weights, else not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from knapsack_lb.errors import KnapsackLBError

SUM_EPSILON = 1e-9
COUNTED_SCALE_REMAINDER = 0.1  # a round scaled up to take at most this remainder still measures its weights

RemainderSolver = Callable[[Sequence[str], float], Mapping[str, float]]
"""``solve(finished_dips, total)`` -> weights over those DIPs summing to ``total``; raises a
``KnapsackLBError`` (e.g. ``InfeasibleError``) when it cannot."""


@dataclass(frozen=True)
class MeasurementRequest:
    dip: str
    weight: float
    priority: int
    enqueued_at: float


@dataclass(frozen=True)
class Schedule:
    """One round's weights. ``scheduled`` are DIPs measured at their requested weight."""

    weights: dict[str, float]
    scheduled: dict[str, float]
    deferred: tuple[str, ...]
    remainder: float
    remainder_method: str
    note: str = ""


def greedy_fill(
    requests: Sequence[MeasurementRequest], *, max_zero: int, budget: float = 1.0
) -> tuple[dict[str, float], list[str]]:
    """Section 4.6's greedy pass: priority then FIFO order, take what fits under ``budget`` (1, less
    what the operator pinned)."""
    taken: dict[str, float] = {}
    deferred: list[str] = []
    total = 0.0
    zeros = 0
    for req in sorted(requests, key=lambda r: (r.priority, r.enqueued_at, r.dip)):
        if req.weight <= 0:
            if zeros < max_zero:
                taken[req.dip] = 0.0
                zeros += 1
            else:
                deferred.append(req.dip)
        elif total + req.weight <= budget + SUM_EPSILON:
            taken[req.dip] = req.weight
            total += req.weight
        else:
            deferred.append(req.dip)
    return taken, deferred


def schedule_round(
    requests: Sequence[MeasurementRequest],
    finished: Sequence[str],
    others: Sequence[str],
    solve_remainder: RemainderSolver | None,
    *,
    max_zero: int = 1,
    capacity: Mapping[str, float] | None = None,
    fallback_capacity: Mapping[str, float] | None = None,
    budget: float = 1.0,
) -> Schedule:
    """Build one round: greedy fill, then the remainder via the solver or an equal split.

    ``budget``: the share of the VIP's traffic these DIPs carry together (1, less what pinned DIPs
    hold); every weight of the schedule sums to it.

    ``capacity`` (ours): estimated capacity per DIP; when given, the remainder is spread over
    every DIP not scheduled (finished, deferred, others) in proportion to it instead of going
    through the solver, so it is never piled on a few DIPs whose curves happen to be done.
    ``fallback_capacity`` (ours): when the solver fails, spread the remainder by these estimates
    instead of the paper's equal split (on a pool of mixed sizes an equal split overloads the
    small DIPs, as round robin does).
    """
    taken, deferred = greedy_fill(requests, max_zero=max_zero, budget=budget)
    total = sum(taken.values())
    remainder = max(0.0, budget - total)
    weights = dict(taken)
    finished = [d for d in finished if d not in taken]
    rest = [d for d in (*finished, *deferred, *others) if d not in taken]
    for dip in rest:
        weights[dip] = 0.0
    if remainder <= SUM_EPSILON:
        return Schedule(weights, taken, tuple(deferred), 0.0, "none")
    if capacity is not None and rest and _spread_by_capacity(weights, rest, capacity, remainder):
        return _normalised(weights, taken, deferred, remainder, "capacity", budget=budget)
    note = ""
    if finished and solve_remainder is not None:
        try:
            solved = solve_remainder(finished, remainder)
            if abs(sum(solved.values()) - remainder) > 1e-6:
                raise KnapsackLBError(f"solver returned {sum(solved.values()):.6f}, wanted {remainder:.6f}")
            for dip in finished:
                weights[dip] = max(0.0, float(solved.get(dip, 0.0)))
            return _normalised(weights, taken, deferred, remainder, "solver", budget=budget)
        except KnapsackLBError as exc:
            if fallback_capacity is not None and rest and _spread_by_capacity(weights, rest, fallback_capacity,
                                                                               remainder):
                return _normalised(weights, taken, deferred, remainder, "capacity",
                                   f"solver on the remainder failed ({exc}); spread by estimated capacity",
                                   budget=budget)
            note = f"solver on the remainder failed ({exc}); equal split"
    if rest:
        share = remainder / len(rest)
        for dip in rest:
            weights[dip] = share
        return _normalised(weights, taken, deferred, remainder, "equal-split", note, budget=budget)
    positive = {d: w for d, w in taken.items() if w > 0}
    if positive:
        scale = budget / sum(positive.values())
        for dip, w in positive.items():
            weights[dip] = w * scale
        # A small scale-up is a measurement at the scaled weights: Algorithm 1 goes on from there (not
        # counting it livelocked a cold start of a small pool at high load: every DIP measuring, targets
        # summing to 0.97, every round scaled and discarded). A large one (an l_0 request leaving one
        # DIP all the traffic) says little about the weight Algorithm 1 asked for: it waits.
        if remainder <= COUNTED_SCALE_REMAINDER:
            return Schedule(weights, {d: weights[d] for d in taken}, tuple(deferred), remainder, "scaled",
                            "no DIP left for the remainder: scheduled weights scaled up, measured there")
        return Schedule(weights, {d: w for d, w in taken.items() if w <= 0}, tuple(deferred), remainder, "scaled",
                        "no DIP left for the remainder: scheduled weights scaled up")
    share = budget / len(taken)
    return Schedule({d: share for d in taken}, {}, tuple(deferred), remainder, "equal-split",
                    "every scheduled weight was 0: equal split")


def _spread_by_capacity(
    weights: dict[str, float], rest: Sequence[str], capacity: Mapping[str, float], remainder: float
) -> bool:
    """Give ``rest`` the remainder in proportion to ``capacity``; False (nothing changed) if it is all 0."""
    estimates = {d: max(0.0, float(capacity.get(d, 0.0))) for d in rest}
    mass = sum(estimates.values())
    if mass <= 0:
        return False
    for dip in rest:
        weights[dip] = remainder * estimates[dip] / mass
    return True


def _normalised(
    weights: dict[str, float], taken: dict[str, float], deferred: list[str], remainder: float, method: str,
    note: str = "", *, budget: float = 1.0,
) -> Schedule:
    total = sum(weights.values())
    if abs(total - budget) > 1e-12 and total > 0:
        weights = {d: w * budget / total for d, w in weights.items()}
    return Schedule(weights, taken, tuple(deferred), remainder, method, note)
