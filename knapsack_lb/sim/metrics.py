"""What a run measured: per-request records and per-window DIP utilisation, and their summary.

Latency percentiles use numpy's linear interpolation over successful requests started after the
warm-up; ``spread_10_90`` is p90 - p10 (the "10-90 percentile range" of BLOC section V). Error rate
counts errors, timeouts and requests still unfinished when the run ended; drop rate counts
requests the LB shed (policy returned None) and final 429 rejections. Utilisation spread is the
standard deviation across DIPs of each window's utilisation, averaged over windows.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STATUS_CODES = {"ok": 0, "error": 1, "timeout": 2, "rejected": 3, "dropped": 4, "unfinished": 5}


class Recorder:
    """Append-only columns filled by the simulation (cheap per request)."""

    def __init__(self, n_dips: int) -> None:
        self.start = array("d")
        self.latency = array("d")
        self.status = array("b")
        self.dip = array("i")
        self.attempts = array("b")
        self.window_times: list[float] = []
        self.utilization: list[list[float]] = []  # per window, per DIP
        self.weights: list[list[float]] = []  # per window, LB 0's weights
        self.served = [0] * n_dips

    def request(self, start: float, latency: float, status: str, dip: int, attempts: int) -> None:
        self.start.append(start)
        self.latency.append(latency)
        self.status.append(STATUS_CODES[status])
        self.dip.append(dip)
        self.attempts.append(min(attempts, 127))

    def ok(self, start: float, latency: float, dip: int, attempts: int) -> None:
        """``request(start, latency, "ok", dip, attempts)``, the common case, with fewer lookups."""
        self.start.append(start)
        self.latency.append(latency)
        self.status.append(0)
        self.dip.append(dip)
        self.attempts.append(attempts if attempts < 127 else 127)


@dataclass(frozen=True)
class SimResult:
    scenario: str
    policy: str
    seed: int
    duration: float
    warmup: float
    requests: int
    ok: int
    errors: int
    timeouts: int
    rejected: int
    dropped: int
    unfinished: int
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float
    p9999: float
    p10: float
    spread_10_90: float
    throughput: float
    error_rate: float
    drop_rate: float
    dip_names: tuple[str, ...]
    dip_utilization: tuple[float, ...]
    utilization_spread: float
    dip_share: tuple[float, ...]
    wall_seconds: float
    events: int
    latencies: np.ndarray = field(repr=False, compare=False)
    series: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers (no per-request arrays)."""
        out: dict[str, Any] = {}
        for key in (
            "scenario",
            "policy",
            "seed",
            "duration",
            "warmup",
            "requests",
            "ok",
            "errors",
            "timeouts",
            "rejected",
            "dropped",
            "unfinished",
            "mean",
            "p50",
            "p90",
            "p99",
            "p999",
            "p9999",
            "p10",
            "spread_10_90",
            "throughput",
            "error_rate",
            "drop_rate",
            "utilization_spread",
            "wall_seconds",
            "events",
        ):
            value = getattr(self, key)
            out[key] = round(value, 9) if isinstance(value, float) else value
        out["dips"] = {
            name: {"utilization": round(u, 4), "share": round(s, 4)}
            for name, u, s in zip(self.dip_names, self.dip_utilization, self.dip_share, strict=True)
        }
        if "applies" in self.series:
            out["controller"] = controller_summary(self.series)
        return out


def controller_summary(series: dict[str, Any]) -> dict[str, Any]:
    """What KnapsackLB's control loop did in a run: plans the simulated LB carried, refused applies,
    and for each operator action the first split carried after it (weights rounded to 0.001)."""
    plans = series.get("plans", [])
    applies = series.get("applies", [])

    def split(weights: dict[str, float]) -> dict[str, float]:
        return {d: round(w, 3) for d, w in weights.items()}

    after = []
    for action in series.get("operator", []):
        carried = next((p for p in plans if p["time"] >= action["time"]), None)
        after.append({**action, "next_plan_at": None if carried is None else carried["time"],
                      "next_weights": None if carried is None else split(carried["weights"])})
    return {
        "plans_carried": len(plans),
        "applies_refused": [{"time": a["time"], "version": a["version"], "reason": a["reason"]}
                            for a in applies if not a["ok"]],
        "operator": after,
        "final_weights": split(plans[-1]["weights"]) if plans else {},
    }


def summarise(
    rec: Recorder,
    *,
    scenario: str,
    policy: str,
    seed: int,
    duration: float,
    warmup: float,
    dip_names: list[str],
    wall_seconds: float,
    events: int,
) -> SimResult:
    start = np.frombuffer(rec.start, dtype=np.float64) if len(rec.start) else np.zeros(0)
    latency = np.frombuffer(rec.latency, dtype=np.float64) if len(rec.latency) else np.zeros(0)
    status = np.frombuffer(rec.status, dtype=np.int8) if len(rec.status) else np.zeros(0, dtype=np.int8)
    dip = np.frombuffer(rec.dip, dtype=np.int32) if len(rec.dip) else np.zeros(0, dtype=np.int32)
    counted = (start >= warmup) & (start < duration)
    st = status[counted]
    ok_mask = counted & (status == 0)
    lat = latency[ok_mask]
    n = int(counted.sum())

    def count(code: str) -> int:
        return int((st == STATUS_CODES[code]).sum())

    def pct(q: float) -> float:
        return float(np.percentile(lat, q)) if lat.size else float("nan")

    n_dips = len(dip_names)
    served = np.bincount(dip[ok_mask & (dip >= 0)], minlength=n_dips).astype(float)
    share = served / served.sum() if served.sum() > 0 else served
    util_rows = [
        (t, row) for t, row in zip(rec.window_times, rec.utilization, strict=True) if t > warmup and t <= duration
    ]
    if util_rows:
        util = np.array([row for _, row in util_rows])
        dip_util = util.mean(axis=0)
        spread = float(util.std(axis=1).mean())
    else:
        dip_util = np.zeros(n_dips)
        spread = float("nan")
    ok, errors, timeouts, rejected, dropped, unfinished = (
        count(c) for c in ("ok", "error", "timeout", "rejected", "dropped", "unfinished")
    )
    measured = duration - warmup
    p10, p90 = pct(10), pct(90)
    series = {
        "window_times": list(rec.window_times),
        "utilization": [list(r) for r in rec.utilization],
        "weights": [list(w) for w in rec.weights],
    }
    return SimResult(
        scenario=scenario,
        policy=policy,
        seed=seed,
        duration=duration,
        warmup=warmup,
        requests=n,
        ok=ok,
        errors=errors,
        timeouts=timeouts,
        rejected=rejected,
        dropped=dropped,
        unfinished=unfinished,
        mean=float(lat.mean()) if lat.size else float("nan"),
        p50=pct(50),
        p90=p90,
        p99=pct(99),
        p999=pct(99.9),
        p9999=pct(99.99),
        p10=p10,
        spread_10_90=p90 - p10,
        throughput=ok / measured,
        error_rate=(errors + timeouts + unfinished) / n if n else 0.0,
        drop_rate=(rejected + dropped) / n if n else 0.0,
        dip_names=tuple(dip_names),
        dip_utilization=tuple(float(u) for u in dip_util),
        utilization_spread=spread,
        dip_share=tuple(float(s) for s in share),
        wall_seconds=wall_seconds,
        events=events,
        latencies=lat.copy(),
        series={**series, "start": start.copy(), "latency": latency.copy(), "status": status.copy()},
    )
