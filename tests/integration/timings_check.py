"""The check every adapter's ``timings()`` must pass against its real LB: each request the LB
forwarded is counted under the DIP that served it, at the backends' time of work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from knapsack_lb.lab.testbed import lb_harness
from knapsack_lb.model import WeightPlan

REQUESTS = 200
WORK = 0.02  # seconds of work per request at the emulated backends of the tests


def assert_timed_as_served(testbed: lb_harness.LbTestbed, adapter: Any, plan: WeightPlan,
                           backend_of: Mapping[str, str] | None = None) -> None:
    """Start the adapter's receiver, apply ``plan``, send ``REQUESTS`` through the LB, and check what
    the adapter timed per DIP against what each backend served (``backend_of``: DIP -> backend name,
    where they differ)."""
    assert adapter.timings() == {}  # the first call starts the receiver
    assert adapter.apply(plan).ok
    counts = lb_harness.measure_split(testbed, REQUESTS)
    served = dict(counts) if backend_of is None else {dip: counts.get(b, 0) for dip, b in backend_of.items()}
    assert sum(served.values()) == REQUESTS and "<failed>" not in counts, counts
    timed = lb_harness.timed_per_dip(adapter.timings, REQUESTS)
    assert {dip: t.successes for dip, t in timed.items()} == served
    for t in timed.values():
        assert t.failures == 0 and WORK * 0.95 <= (t.latency_mean or 0.0) <= WORK * 2, t
