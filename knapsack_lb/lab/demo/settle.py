"""When a learning controller has settled: the demo and the day-2 tour count traffic only after it.

A controller has settled when its plan in force is a solved plan and no weight of it has moved by
``SETTLED_CHANGE`` for a settle window. The window is at least two *plan cycles* - the drain time
(the controller trusts no round taken sooner after a weight change, KnapsackLB section 4.7), one probe
round and one controller step - because a controller still moving its weights moves them only once
per cycle: a shorter window passes between two of its plans and calls it settled.

How it fails: a controller that moves one weight by less than ``SETTLED_CHANGE`` per plan, in the
same direction for many plans, is called settled while it still drifts.
"""

from __future__ import annotations

from dataclasses import dataclass

from knapsack_lb.controller.core import is_solved
from knapsack_lb.model import LEARNED_METHODS, WeightPlan

SETTLED_CHANGE = 0.02  # a weight that moves by less than this between plans has not moved


def plan_cycle(*, drain_time: float, probe_interval: float, controller_interval: float) -> float:
    """Seconds from a new plan to the controller's next decision on it."""
    return drain_time + probe_interval + controller_interval


def settle_window(settle_seconds: float, cycle: float) -> float:
    """How long no weight may move before learning counts as settled: ``settle_seconds``, and at
    least two plan cycles."""
    return max(settle_seconds, 2 * cycle)


@dataclass
class SettleWatch:
    """Watches the plans in force (observe every plan, or poll the current one: observing the same
    plan again changes nothing). A plan that is not solved (an Algorithm 1 measurement schedule, the
    split for a VIP with no live DIP) is a move: learning has not settled while it is in force."""

    window: float
    solved_at: float | None = None  # when the first solved plan was seen
    changed_at: float | None = None  # when the weights last moved (None before the first solved plan)
    weights: dict[str, float] | None = None  # the weights in force since changed_at

    def observe(self, plan: WeightPlan | None, now: float) -> bool:
        """Take the plan in force at ``now``; True when it is the first solved plan seen. Until then only
        a plan placed from learned curves counts: the learner's start (the LB's own weights, or an equal
        split, restated until a curve is usable) is not learning settled."""
        started = self.solved_at is not None or (plan is not None and plan.method in LEARNED_METHODS)
        if plan is None or not is_solved(plan) or not started:
            if self.weights is not None:
                self.changed_at, self.weights = now, None
            return False
        first = self.solved_at is None
        if first:
            self.solved_at = now
        last = self.weights
        if last is None or max((abs(plan.weights.get(n, 0.0) - last.get(n, 0.0)) for n in {*plan.weights, *last}),
                               default=0.0) >= SETTLED_CHANGE:
            self.changed_at, self.weights = now, dict(plan.weights)
        return first

    def confirm(self, plan: WeightPlan | None, now: float) -> bool:
        """Take the plan in force at ``now``, read after :meth:`settled` said yes on an earlier poll,
        and say whether learning is still settled: a plan that came between that poll and the
        decision and moved a weight starts the window again."""
        self.observe(plan, now)
        return self.settled(now)

    def settled(self, now: float) -> bool:
        """A solved plan has been in force, unmoved, for the window."""
        return self.weights is not None and self.changed_at is not None and now - self.changed_at >= self.window
