"""``/metrics``: Prometheus metrics built from the latency store on every scrape.

Nothing is counted in the API process itself: probes and controllers may run elsewhere
(``klb probe`` / ``klb controller`` scale out), so the store is the only place that knows
the weights, probe latencies, solve times and apply failures. A scrape reads one snapshot
per VIP (:func:`gather`), then a custom collector (:class:`StoreCollector`) turns it into
metric families in a registry of its own, so no state leaks between scrapes.

Metrics (labels ``vip`` and, where it applies, ``dip``):

* ``klb_dip_weight`` - weight of the DIP in the current plan (fraction)
* ``klb_dip_predicted_latency_seconds`` - latency the DIP's curve predicts at that weight
* ``klb_probe_latency_seconds`` - mean success latency of the DIP's latest probe round
* ``klb_probe_requests`` / ``klb_probe_errors`` / ``klb_probe_timeouts`` - of that round
* ``klb_probe_age_seconds`` - age of that round (wall clock)
* ``klb_plan_version``, ``klb_plan_solve_seconds``, ``klb_plan_age_seconds`` - per VIP
* ``klb_lb_weight`` - the split the load balancer confirmed it carries (fraction; beside the plan's)
* ``klb_apply_failures_total`` - failed pushes to the LB, as the controller counts them
* ``klb_apply_error`` - 1 while the last push to the LB failed (the reason is in ``/status``)
* ``klb_plan_flag`` - 1 per flag of the current plan (label ``flag``: ``over-capacity``,
  ``measuring``, ``slow-start``, ``rolled-back`` ...)
* ``klb_dip_learning`` - 1 while the DIP has no usable curve yet (or is being measured)
* ``klb_dip_overloaded`` - 1 while the controller judges the DIP overloaded at its weight
* ``klb_vip_paused``, ``klb_vip_dry_run`` - operator overrides (0/1)
* ``klb_store_up`` - 1 when the store answered
* ``klb_component_up`` - 1 per controller and probe worker whose status has not expired
  (labels ``component``, ``id``); a process that cannot reach the store stops reporting
* ``klb_controller_vips`` - VIPs a controller holds; ``klb_controller_step_failures_total`` -
  steps that failed after reading their inputs (a plan stored but not applied counts here)
* ``klb_probe_rounds_buffered`` - rounds a probe worker holds while the store is unreachable
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from knapsack_lb.store import CONTROLLER_STATUS, PROBE_STATUS, LatencyStore, VipSnapshot

APPLY_FAILURE_KEYS = ("apply_failures", "apply_failures_total")


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape read from the store."""

    store_up: bool
    now: float
    vips: Mapping[str, VipSnapshot] = field(default_factory=dict)
    controllers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    probes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def apply_failures(state: Mapping[str, Any] | None) -> float | None:
    """Apply failures the controller recorded in its state for a VIP (first known key), if any."""
    if not state:
        return None
    for key in APPLY_FAILURE_KEYS:
        value = _number(state.get(key))
        if value is not None:
            return value
    return None


def dip_states(state: Mapping[str, Any]) -> dict[str, dict[str, bool]]:
    """Per DIP of a stored controller state: ``learning`` (no usable curve yet, or in an Algorithm 1
    measurement) and ``overloaded`` (the learner's judgement at its weight)."""
    dips = state.get("dips")
    if not isinstance(dips, Mapping):
        return {}
    result = {}
    for name, dip in dips.items():
        if isinstance(dip, Mapping):
            usable = dip.get("curve") is not None and (_number(dip.get("w_max")) or 0.0) > 0
            result[str(name)] = {"learning": not usable or dip.get("measuring") is not None,
                                 "overloaded": bool(dip.get("overloaded"))}
    return result


async def gather(store: LatencyStore, now: float) -> MetricsSnapshot:
    """One snapshot per VIP; a store that fails gives ``store_up`` 0 and no other metric."""
    try:
        names = await store.list_vips()
        vips = {name: await store.snapshot(name) for name in names}
        controllers = await store.statuses(CONTROLLER_STATUS)
        probes = await store.statuses(PROBE_STATUS)
    except Exception:  # a scrape reports the outage instead of failing
        return MetricsSnapshot(store_up=False, now=now)
    return MetricsSnapshot(store_up=True, now=now, vips=vips, controllers=controllers, probes=probes)


class StoreCollector(Collector):
    """Turns a :class:`MetricsSnapshot` into Prometheus metric families."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        up = GaugeMetricFamily("klb_store_up", "1 when the latency store answered this scrape.")
        up.add_metric([], 1.0 if snap.store_up else 0.0)
        yield up
        if not snap.store_up:
            return
        g: dict[str, GaugeMetricFamily] = {}

        def gauge(name: str, doc: str, labels: list[str]) -> Callable[[list[str], float | None], None]:
            family = g.setdefault(name, GaugeMetricFamily(name, doc, labels=labels))

            def add(values: list[str], value: float | None) -> None:
                if value is not None:
                    family.add_metric(values, value)

            return add

        weight = gauge("klb_dip_weight", "Weight of the DIP in the current plan (fraction).", ["vip", "dip"])
        predicted = gauge(
            "klb_dip_predicted_latency_seconds", "Latency the DIP's curve predicts at its weight.", ["vip", "dip"]
        )
        probe_lat = gauge(
            "klb_probe_latency_seconds", "Mean success latency of the DIP's latest probe round.", ["vip", "dip"]
        )
        probe_sent = gauge("klb_probe_requests", "Requests sent in the DIP's latest probe round.", ["vip", "dip"])
        probe_err = gauge("klb_probe_errors", "Errors in the DIP's latest probe round.", ["vip", "dip"])
        probe_to = gauge("klb_probe_timeouts", "Timeouts in the DIP's latest probe round.", ["vip", "dip"])
        probe_age = gauge("klb_probe_age_seconds", "Age of the DIP's latest probe round.", ["vip", "dip"])
        version = gauge("klb_plan_version", "Version of the VIP's current plan.", ["vip"])
        solve = gauge("klb_plan_solve_seconds", "Solver time of the VIP's current plan.", ["vip"])
        age = gauge("klb_plan_age_seconds", "Seconds since the VIP's current plan was computed.", ["vip"])
        paused = gauge("klb_vip_paused", "1 when the VIP is paused by an operator.", ["vip"])
        dry = gauge("klb_vip_dry_run", "1 when the VIP's plans are not pushed (dry run).", ["vip"])
        lb_weight = gauge("klb_lb_weight", "The split the load balancer confirmed it carries (fraction).",
                          ["vip", "dip"])
        apply_error = gauge("klb_apply_error", "1 while the last push to the load balancer failed.", ["vip"])
        plan_flag = gauge("klb_plan_flag", "1 per flag of the VIP's current plan.", ["vip", "flag"])
        learning = gauge("klb_dip_learning", "1 while the DIP has no usable curve yet.", ["vip", "dip"])
        overloaded = gauge("klb_dip_overloaded", "1 while the DIP is judged overloaded at its weight.", ["vip", "dip"])
        failures = CounterMetricFamily(
            "klb_apply_failures", "Failed pushes of a plan to the load balancer.", labels=["vip"]
        )
        for vip, vs in sorted(snap.vips.items()):
            if vs.config is not None:
                paused([vip], 1.0 if vs.config.paused else 0.0)
                dry([vip], 1.0 if vs.config.dry_run else 0.0)
            plan = vs.current_plan
            if plan is not None:
                for dip, w in sorted(plan.weights.items()):
                    weight([vip, dip], _number(w))
                    predicted([vip, dip], _number(plan.predicted_latency.get(dip)))
                version([vip], float(plan.version))
                solve([vip], _number(plan.solve_seconds))
                if plan.computed_at > 0:
                    age([vip], max(0.0, snap.now - plan.computed_at))
            for dip, m in sorted(vs.latest.items()):
                probe_lat([vip, dip], _number(m.latency_mean))
                probe_sent([vip, dip], float(m.sent))
                probe_err([vip, dip], float(m.errors))
                probe_to([vip, dip], float(m.timeouts))
                probe_age([vip, dip], max(0.0, snap.now - m.time))
            count = apply_failures(vs.controller_state)
            if count is not None:
                failures.add_metric([vip], count)
            if vs.in_force is not None:
                for dip, w in sorted(vs.in_force.weights.items()):
                    lb_weight([vip, dip], _number(w))
            if plan is not None:
                for flag in plan.flags:
                    plan_flag([vip, str(flag)], 1.0)
            state = vs.controller_state or {}
            if state:
                apply_error([vip], 1.0 if state.get("apply_error") else 0.0)
            for dip, known in sorted(dip_states(state).items()):
                learning([vip, dip], 1.0 if known["learning"] else 0.0)
                overloaded([vip, dip], 1.0 if known["overloaded"] else 0.0)
        yield from g.values()
        yield failures
        yield from self._components()

    def _components(self) -> Iterator[Metric]:
        snap = self.snapshot
        up = GaugeMetricFamily("klb_component_up", "1 per controller or probe worker reporting its status.",
                               labels=["component", "id"])
        vips = GaugeMetricFamily("klb_controller_vips", "VIPs the controller holds.", labels=["controller"])
        steps = CounterMetricFamily("klb_controller_step_failures",
                                    "Controller steps that failed, a plan stored but not applied included.",
                                    labels=["controller"])
        buffered = GaugeMetricFamily("klb_probe_rounds_buffered",
                                     "Probe rounds a worker holds until the store answers again.", labels=["worker"])
        for component, statuses in ((CONTROLLER_STATUS, snap.controllers), (PROBE_STATUS, snap.probes)):
            for ident in sorted(statuses):
                up.add_metric([component, ident], 1.0)
        for ident, status in sorted(snap.controllers.items()):
            held = status.get("vips")
            if isinstance(held, list):
                vips.add_metric([ident], float(len(held)))
            failed = _number(status.get("step_failures"))
            if failed is not None:
                steps.add_metric([ident], failed)
        for ident, status in sorted(snap.probes.items()):
            count = _number(status.get("rounds_buffered"))
            if count is not None:
                buffered.add_metric([ident], count)
        yield from (up, vips, steps, buffered)


def render(snapshot: MetricsSnapshot) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(snapshot))
    return generate_latest(registry)
