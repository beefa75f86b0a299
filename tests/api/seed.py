"""Seeded data for API tests: one VIP with three DIPs, its plan history, curves, probe rounds,
controller state and status entries, written through the real store."""

from __future__ import annotations

from knapsack_lb.curves import QueueingCurve
from knapsack_lb.model import DipConfig, Measurement, VipConfig, WeightPlan
from knapsack_lb.store import CurveRecord, InForce, LatencyStore

VIP = "web"
DIPS = ("dip1", "dip2", "dip3")
CAPACITY = {"dip1": 1.0, "dip2": 0.8, "dip3": 0.6}
BASE = 0.004  # s: latency floor of every emulated DIP
APPLY_ERROR = "cannot reach the HAProxy admin socket /run/haproxy.sock"
PLAN_WEIGHTS = ({"dip1": 0.34, "dip2": 0.33, "dip3": 0.33}, {"dip1": 0.4, "dip2": 0.33, "dip3": 0.27},
                {"dip1": 0.42, "dip2": 0.34, "dip3": 0.24})


def curve_of(dip: str) -> QueueingCurve:
    """Latency of a processor-sharing DIP at 70 % total load: it saturates at weight c."""
    share = CAPACITY[dip] / sum(CAPACITY.values()) / 0.7
    return QueueingCurve(a=0.0, b=BASE * share, c=share)


def vip_config(**overrides: object) -> VipConfig:
    data: dict[str, object] = {
        "name": VIP,
        "dips": [DipConfig(name=d, address=f"127.0.0.1:{18081 + i}") for i, d in enumerate(DIPS)],
    }
    data.update(overrides)
    return VipConfig.model_validate(data)


async def seed_store(store: LatencyStore, now: float, rounds: int = 6) -> None:
    """Write a plausible history ending at ``now`` (seconds since the epoch)."""
    await store.put_vip(vip_config())
    for i, weights in enumerate(PLAN_WEIGHTS):
        predicted = {d: curve_of(d).latency(w) for d, w in weights.items()}
        await store.put_plan(
            WeightPlan(
                vip=VIP, weights=weights, predicted_latency=predicted,
                objective=sum(w * predicted[d] for d, w in weights.items()), method="exact-greedy",
                solve_seconds=0.002 + i / 1000, version=i + 1, computed_at=now - 10.0 * (len(PLAN_WEIGHTS) - 1 - i),
                reasons=(f"step {i + 1}",), flags=("slow-start",) if i == len(PLAN_WEIGHTS) - 1 else (),
            )
        )
    records = []
    for d in DIPS:
        curve = curve_of(d)
        points = tuple((f * curve.c, curve.latency(f * curve.c)) for f in (0.0, 0.25, 0.5, 0.7, 0.85))
        records.append(
            CurveRecord(vip=VIP, dip=d, curve=curve.to_dict(), w_max=min(0.9 * curve.c, 1.0), points=points,
                        model="queueing", fit_error=0.0001, fitted_at=now - 5.0)
        )
    await store.put_curves(VIP, records)
    for r in range(rounds):
        t = now - 5.0 * (rounds - 1 - r)
        weights = PLAN_WEIGHTS[min(r, len(PLAN_WEIGHTS) - 1)]
        batch = []
        for d in DIPS:
            latency = curve_of(d).latency(weights[d])
            batch.append(
                Measurement(vip=VIP, dip=d, time=t, weight=weights[d], sent=100, successes=99 if d == "dip3" else 100,
                            errors=1 if d == "dip3" else 0, timeouts=0, latency_mean=latency,
                            latency_p50=latency * 0.9, latency_p90=latency * 1.5, latency_p99=latency * 2.5,
                            failure_latency_mean=0.001 if d == "dip3" else None, worker="probe-1")
            )
        await store.put_measurements(batch)
    await store.put_in_force(VIP, InForce({"dip1": 0.5, "dip2": 0.25, "dip3": 0.25}, len(PLAN_WEIGHTS) - 1, now - 10))
    await store.put_controller_state(VIP, {
        "phase": "steady", "apply_failures": 2, "drain_time": 0.5, "apply_error": APPLY_ERROR,
        "dips": {"dip1": {"curve": curve_of("dip1").to_dict(), "w_max": 0.5, "measuring": None, "overloaded": True},
                 "dip2": {"curve": curve_of("dip2").to_dict(), "w_max": 0.4, "measuring": None},
                 "dip3": {"curve": None, "w_max": 0.0, "measuring": None}}})
    await store.put_status("controller", "ctl-1", {"vips": [VIP], "rounds": 12, "step_failures": 1}, ttl=60.0)
    await store.put_status("probe", "probe-1", {"owned_dips": 3, "rounds_buffered": 4}, ttl=60.0)
