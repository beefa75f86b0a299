"""PNG plots of simulation results (matplotlib, Agg backend): latency CDFs, utilisation, weights."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from knapsack_lb.sim.metrics import SimResult


def latency_cdf_figure(results: Sequence[SimResult], title: str = "") -> Figure:
    """Empirical CDF of successful-request latency per policy (log x), plus a tail panel."""
    fig, (ax, tail) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in results:
        lat = np.sort(r.latencies) * 1000.0
        if lat.size == 0:
            continue
        y = np.arange(1, lat.size + 1) / lat.size
        ax.plot(lat, y, label=f"{r.policy} (mean {r.mean * 1000:.1f} ms)")
        tail.plot(lat, 1.0 - y + 1.0 / lat.size, label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    tail.set_xscale("log")
    tail.set_yscale("log")
    tail.set_xlabel("latency (ms)")
    tail.set_ylabel("P(latency > x)")
    tail.grid(alpha=0.3)
    fig.suptitle(title or (results[0].scenario if results else ""))
    fig.tight_layout()
    return fig


def save_latency_cdfs(results: Sequence[SimResult], path: str | Path, title: str = "") -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = latency_cdf_figure(results, title)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def utilization_figure(results: Sequence[SimResult]) -> Figure:
    """Mean utilisation per DIP for each policy (bars side by side)."""
    fig, ax = plt.subplots(figsize=(11, 3.8))
    if results:
        n = len(results[0].dip_names)
        width = 0.8 / len(results)
        for k, r in enumerate(results):
            ax.bar(np.arange(n) + k * width, r.dip_utilization, width=width, label=r.policy)
        ax.set_xticks(np.arange(n) + 0.4 - width / 2)
        ax.set_xticklabels(results[0].dip_names, rotation=90, fontsize=7)
    ax.set_ylabel("utilisation")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def timeline_figure(result: SimResult, *, group_of: Sequence[str] | None = None) -> Figure:
    """Weights (LB 0) and mean latency per window over time, for one run."""
    series = result.series
    times = np.asarray(series["window_times"])
    weights = np.asarray(series["weights"])
    start = np.asarray(series["start"])
    latency = np.asarray(series["latency"])
    status = np.asarray(series["status"])
    fig, (ax_w, ax_l) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    if weights.size:
        totals = weights.sum(axis=1, keepdims=True)
        shares = np.divide(weights, totals, out=np.zeros_like(weights), where=totals > 0)
        groups = list(group_of) if group_of is not None else list(result.dip_names)
        for g in dict.fromkeys(groups):
            cols = [i for i, name in enumerate(groups) if name == g]
            ax_w.plot(times, shares[:, cols].sum(axis=1), label=g)
    ax_w.set_ylabel("weight (share)")
    ax_w.legend(fontsize=8, ncol=4)
    ax_w.grid(alpha=0.3)
    if times.size:
        edges = np.concatenate([[0.0], times])
        ok = status == 0
        means = []
        for lo, hi in itertools.pairwise(edges):
            sel = ok & (start >= lo) & (start < hi)
            means.append(latency[sel].mean() * 1000 if sel.any() else np.nan)
        ax_l.plot(times, means)
    ax_l.set_ylabel("mean latency (ms)")
    ax_l.set_xlabel("time (s)")
    ax_l.grid(alpha=0.3)
    fig.tight_layout()
    return fig
