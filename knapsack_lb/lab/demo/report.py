"""Metrics of each phase, the comparison table, ``report.json`` and the PNG plot."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from knapsack_lb.lab.demo.phases import PHASES


def phase_metrics(samples: Mapping[str, Any], stats: Mapping[str, Mapping[str, Any]], seconds: float,
                  weights: Mapping[str, float], names: Sequence[str]) -> dict[str, Any]:
    """Latency (mean, p50, p99 over every counted request), and per DIP: requests, share of
    requests, connections placed, mean latency, utilisation (busy seconds from the emulator's
    /stats over the counted window, probe work included) and the weight HAProxy ran."""
    latency = np.asarray(samples["latency"], dtype=float)
    status = np.asarray(samples["status"], dtype=int)
    backend = np.asarray(samples["backend"], dtype=object)
    ok = status == 200
    lat_ok = latency[ok]
    total = int(ok.sum())
    per_dip: dict[str, Any] = {}
    for name in names:
        mask = ok & (backend == name)
        count = int(mask.sum())
        busy = float(stats.get(name, {}).get("busy_seconds", 0.0))
        per_dip[name] = {
            "requests": count,
            "share": count / total if total else 0.0,
            "connections": int(samples.get("connections", {}).get(name, 0)),
            "mean_latency": float(latency[mask].mean()) if count else None,
            "utilisation": busy / seconds if seconds > 0 else None,
            "weight": float(weights.get(name, 0.0)),
        }

    def pct(q: float) -> float | None:
        return float(np.percentile(lat_ok, q)) if total else None

    return {
        "requests": total,
        "failed": int((~ok).sum()) + int(samples.get("errors", 0)),
        "mean": float(lat_ok.mean()) if total else None,
        "p50": pct(50),
        "p99": pct(99),
        "seconds": seconds,
        "per_dip": per_dip,
    }


def improvement(baseline: float | None, ours: float | None) -> float | None:
    """Relative mean-latency reduction: (baseline - ours) / baseline."""
    if baseline is None or ours is None or baseline <= 0:
        return None
    return (baseline - ours) / baseline


def build_report(settings: Mapping[str, Any], phases: Mapping[str, Mapping[str, Any]],
                 learned: Mapping[str, float], learning: Mapping[str, Any]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        phase = phases.get(key)
        return None if phase is None else phase.get("mean")

    klb = mean("knapsacklb")
    return {
        "settings": dict(settings),
        "phases": {k: dict(v) for k, v in phases.items()},
        "improvement_vs_roundrobin": improvement(mean("roundrobin"), klb),
        "improvement_vs_leastconn": improvement(mean("leastconn"), klb),
        "http_leastconn_vs_knapsacklb": improvement(klb, mean("http-leastconn")),
        "learned_weights": dict(learned),
        "learning": dict(learning),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.1f}"


def comparison_table(report: Mapping[str, Any]) -> Table:
    """Mean, p50, p99 (ms) and per-DIP utilisation per phase."""
    phases = report["phases"]
    names: list[str] = []
    for phase in phases.values():
        names = list(phase["per_dip"])
        break
    table = Table(title="latency per phase (ms) and utilisation per DIP")
    for column in ("phase", "requests", "failed", "mean", "p50", "p99", *[n.replace("dip-", "d") for n in names]):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for key, phase in phases.items():
        utils = [phase["per_dip"][n]["utilisation"] for n in names]
        table.add_row(key, str(phase["requests"]), str(phase["failed"]), _ms(phase["mean"]), _ms(phase["p50"]),
                      _ms(phase["p99"]), *["-" if u is None else f"{u:.0%}" for u in utils])
    return table


def listed(weights: Mapping[str, float]) -> str:
    """Weights as the demo prints them: ``dip-1 0.208, dip-2 0.208, ...``."""
    return ", ".join(f"{n} {w:.3f}" for n, w in weights.items())


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    lines = [
        f"KnapsackLB mean latency vs roundrobin: {pct(report['improvement_vs_roundrobin'])} lower",
        f"KnapsackLB mean latency vs leastconn:  {pct(report['improvement_vs_leastconn'])} lower",
    ]
    http = report.get("http_leastconn_vs_knapsacklb")
    if http is not None:
        lines.append(f"HTTP leastconn + learned weights vs KnapsackLB (L4): {pct(http)} lower mean latency "
                     "(request-level least connections is near-optimal on its own)")
    lines.append(f"learned weights (the plan at the end of its phase): {listed(report['learned_weights'])}")
    # the controller keeps learning while its phase is counted: these are the weights its latency came from
    in_force = report["phases"].get("knapsacklb", {}).get("mean_weights")
    if in_force:
        lines.append(f"weights in force while counted (mean): {listed(in_force)}")
    return lines


def write_report(report: Mapping[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False))
    return path


def plot_report(report: Mapping[str, Any], latencies: Mapping[str, Sequence[float]], path: Path) -> Path:
    """Left: latency CDF per phase; right: per DIP the capacity share, the learned weight and
    the share of requests each phase sent it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {p.key: p.title for p in PHASES}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for key, values in latencies.items():
        if not len(values):
            continue
        data = np.sort(np.asarray(values) * 1000)
        left.plot(data, np.arange(1, len(data) + 1) / len(data), label=f"{titles.get(key, key)}")
    left.set_xscale("log")
    left.set_xlabel("request latency (ms, log scale)")
    left.set_ylabel("CDF")
    left.set_title("Latency per phase")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)

    settings = report["settings"]
    names = [f"dip-{i + 1}" for i in range(len(settings["capacities"]))]
    caps = np.asarray(settings["capacities"], dtype=float)
    series = {"capacity share": caps / caps.sum(),
              "learned weight": np.asarray([report["learned_weights"].get(n, 0.0) for n in names])}
    for key, phase in report["phases"].items():
        series[f"requests: {key}"] = np.asarray([phase["per_dip"][n]["share"] for n in names])
    width = 0.8 / len(series)
    x = np.arange(len(names))
    for i, (label, values) in enumerate(series.items()):
        right.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
    right.set_xticks(x, [f"{n}\n(cap {c:g})" for n, c in zip(names, caps, strict=True)])
    right.set_ylabel("fraction of traffic")
    right.set_title("Weights and traffic share per DIP")
    right.legend(fontsize=7)
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
