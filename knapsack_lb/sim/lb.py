"""One load-balancer instance (a MUX or a sidecar) and its own view of the pool.

The view is what the instance itself knows: its own outstanding requests per DIP (at layer 4: its
own open connections per DIP, which is what a MUX's least-connections counts) and the weights
pushed to it. Nothing global leaks in: N instances each see only their share (KnapsackLB section
2, "LB designs run on multiple instances (called MUXes)"; DL3 section II, Fig. 2).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from knapsack_lb.sim.engine import Engine
from knapsack_lb.sim.network import Network
from knapsack_lb.sim.policies.base import Policy, StatelessPolicy


class LbInstance:
    """Implements ``LbView`` for the policy of this instance."""

    __slots__ = ("_engine", "_names", "_network", "counts", "index", "observes", "policy", "rng", "weights")

    def __init__(
        self,
        index: int,
        policy: Policy,
        rng: random.Random,
        names: Sequence[str],
        weights: Sequence[float],
        engine: Engine,
        network: Network | None = None,
    ) -> None:
        self.index = index
        self.policy = policy
        # False for policies that ignore outcomes (StatelessPolicy.observe, no retry hook): the
        # simulator then skips building Outcome objects for their requests
        self.observes = not (
            isinstance(policy, StatelessPolicy)
            and type(policy).observe is StatelessPolicy.observe
            and getattr(policy, "should_retry", None) is None
        )
        self.rng = rng
        self.counts = [0] * len(names)
        self.weights = [float(w) for w in weights]
        self._names = tuple(names)
        self._engine = engine
        self._network = network

    @property
    def now(self) -> float:
        return self._engine.now

    @property
    def dip_names(self) -> Sequence[str]:
        return self._names

    def outstanding(self, dip: int) -> int:
        return self.counts[dip]

    def weight(self, dip: int) -> float:
        return self.weights[dip]

    def path_rtt(self, dip: int) -> float | None:
        """Round trip on the path to ``dip`` now (base RTT plus any spike, both directions): what the
        kernel reports (``ss``) for a connection with a request in flight (DL3 section III-B)."""
        if self._network is None:
            return None
        now = self._engine.now
        return 2.0 * self._network.one_way + 2.0 * self._network.extra(self.index, dip, now)

    def set_weights(self, weights: Sequence[float]) -> None:
        if len(weights) != len(self._names):
            raise ValueError(f"expected {len(self._names)} weights, got {len(weights)}")
        self.weights = [max(0.0, float(w)) for w in weights]
