"""gRPC's ``weighted_round_robin`` load balancing policy with ORCA load reports (gRFC A58).

Source: gRFC A58 "weighted_round_robin LB policy" (grpc/proposal), with grpc-go's
``balancer/weightedroundrobin`` as the reference implementation of its corner cases. An
anchor a user would pick instead of this project: weights from server-reported load.

* Weight per endpoint from its latest ORCA report (A58 "Subchannel Weights"):
  ``weight = qps / (utilization + eps / qps * error_utilization_penalty)``; a report with zero
  utilisation or zero qps is ignored.
* ``non_empty_since``: when the first usable report arrived; the weight stays 0 (unknown)
  until ``blackout_period`` has passed since then, so that a fresh endpoint's first, noisy
  report does not steer traffic.
* ``last_updated``: a weight older than ``weight_expiration_period`` is 0 again and
  ``non_empty_since`` restarts (a new blackout follows the next report).
* Scheduler (A58 "Picker Behavior"): earliest deadline first; each endpoint's deadline
  advances by ``1 / weight`` when picked, ties go to the lower index, initial deadlines are
  random offsets in ``[0, 1/weight)``. Endpoints with weight 0 (unknown, blacked out, expired)
  use the mean of the known weights; with fewer than two known weights the policy is plain
  round robin (grpc-go's rule). The scheduler is rebuilt every ``weight_update_period``.

Server side (the simulator's DIP model): per-call ORCA reports on every response as
``Outcome.extra["utilization"]`` (busy share in [0, 1]), ``extra["qps"]`` and ``extra["eps"]``
(the server's recent queries and errors per second). OOB reporting is not modelled (A58's
default ``enable_oob_load_report`` is false).

How it fails: the weights lag load by the report window plus the update period; a server that
fails fast shows high qps at low utilisation, which only ``error_utilization_penalty`` offsets.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.sim.policies.base import LbView, Outcome, Request
from knapsack_lb.sim.policies.registry import PolicyContext


def orca_weight(qps: float, utilization: float, eps: float = 0.0, error_utilization_penalty: float = 1.0) -> float:
    """A58: ``qps / (utilization + eps / qps * penalty)``; 0 when the report is unusable."""
    if qps <= 0.0 or utilization <= 0.0:
        return 0.0
    return qps / (utilization + eps / qps * error_utilization_penalty)


@dataclass
class EndpointWeight:
    """One endpoint's weight state (grpc-go ``endpointWeight``)."""

    value: float = 0.0
    non_empty_since: float | None = None
    last_updated: float | None = None

    def update(self, now: float, qps: float, utilization: float, eps: float, penalty: float) -> None:
        weight = orca_weight(qps, utilization, eps, penalty)
        if weight <= 0.0:
            return  # ignore empty reports
        self.value = weight
        if self.non_empty_since is None:
            self.non_empty_since = now
        self.last_updated = now

    def weight(self, now: float, expiration: float, blackout: float) -> float:
        """The usable weight at ``now``: 0 while blacked out or after expiry."""
        if self.last_updated is None or self.non_empty_since is None:
            return 0.0
        if expiration > 0 and now - self.last_updated >= expiration:
            self.non_empty_since = None
            return 0.0
        if blackout > 0 and now - self.non_empty_since < blackout:
            return 0.0
        return self.value


class EdfScheduler:
    """Earliest-deadline-first over fixed weights (A58); immutable weights, mutable deadlines."""

    def __init__(self, weights: Sequence[float], rng: random.Random) -> None:
        known = [w for w in weights if w > 0.0]
        if len(known) < 2:
            effective = [1.0] * len(weights)  # round robin
        else:
            mean = sum(known) / len(known)
            effective = [w if w > 0.0 else mean for w in weights]
        self.weights = effective
        self._heap = [(rng.random() / w, i) for i, w in enumerate(effective)]
        heapq.heapify(self._heap)

    def next(self) -> int:
        deadline, index = self._heap[0]
        heapq.heapreplace(self._heap, (deadline + 1.0 / self.weights[index], index))
        return index


class GrpcWrrPolicy:
    """A58 weighted round robin. Defaults are A58's: blackout 10 s, expiration 180 s, update 1 s, penalty 1.0."""

    name = "grpc_wrr"

    def __init__(self, *, blackout_period: float = 10.0, weight_expiration_period: float = 180.0,
                 weight_update_period: float = 1.0, error_utilization_penalty: float = 1.0) -> None:
        if weight_update_period < 0.1:
            raise InvalidInputError("weight_update_period", weight_update_period, "A58's minimum is 0.1 s")
        for field, value in (("blackout_period", blackout_period),
                             ("weight_expiration_period", weight_expiration_period),
                             ("error_utilization_penalty", error_utilization_penalty)):
            if value < 0:
                raise InvalidInputError(field, value, "must be >= 0")
        self.blackout_period = blackout_period
        self.weight_expiration_period = weight_expiration_period
        self.weight_update_period = weight_update_period
        self.error_utilization_penalty = error_utilization_penalty
        self.endpoints: dict[int, EndpointWeight] = {}
        self._scheduler: EdfScheduler | None = None
        self._scheduler_size = 0
        self._next_update = -math.inf

    def current_weights(self, view: LbView) -> list[float]:
        now = view.now
        return [self.endpoints[d].weight(now, self.weight_expiration_period, self.blackout_period)
                if d in self.endpoints else 0.0 for d in range(len(view.dip_names))]

    def pick(self, request: Request, view: LbView, rng: random.Random) -> int | None:
        n = len(view.dip_names)
        if n == 0:
            return None
        if self._scheduler is None or view.now >= self._next_update or self._scheduler_size != n:
            self._scheduler = EdfScheduler(self.current_weights(view), rng)
            self._scheduler_size = n
            self._next_update = view.now + self.weight_update_period
        for _ in range(n):
            dip = self._scheduler.next()
            if dip not in request.excluded:
                return dip
        return None

    def observe(self, outcome: Outcome, view: LbView) -> None:
        extra = outcome.extra
        if "qps" not in extra or "utilization" not in extra:
            return
        endpoint = self.endpoints.setdefault(outcome.dip, EndpointWeight())
        endpoint.update(outcome.finished_at, extra["qps"], extra["utilization"], extra.get("eps", 0.0),
                        self.error_utilization_penalty)

    def probe_targets(self, view: LbView, rng: random.Random) -> Sequence[int]:
        return ()


def make_grpc_wrr(ctx: PolicyContext) -> GrpcWrrPolicy:
    """gRPC weighted_round_robin (gRFC A58): ORCA qps/utilisation weights, blackout, expiry, EDF."""
    return GrpcWrrPolicy(**dict(ctx.params))
