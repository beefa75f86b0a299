"""``klb bench solver``: every method on the same seeded instance, timed (KnapsackLB section 6.6).

The paper's Table 6 times the single-step ILP with 10 levels for 10 to 1000 DIPs (20 ms,
194 ms, 645 ms, 5.8 s, 21.1 s) and Table 7 compares 100 levels in one step (36.8 s) with
10 levels in two steps (0.65 s x 2) on 100 DIPs. This runs the same comparison here, adding
the exact solver. ``seconds`` is the median over ``repeat`` runs (each method's own
``Solution.seconds``); ``optimal_objective`` is the best objective any method found and
``gap`` the relative excess ``objective / optimal_objective - 1``.

``run_fleet_bench`` (``klb bench solver --fleet``) times the whole fleet of the paper's
Table 8 (section 6.7: 3,330 VIPs, 60,000 DIPs, 851 s on one 8-core VM) on one core, solved
VIP by VIP with ``solve(method="exact")`` and in one ``solve_many`` call, and checks that both
give the same plans.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from knapsack_lb.errors import InvalidInputError, KnapsackLBError
from knapsack_lb.lab.fleet import (
    PAPER_CONTROLLER_VMS,
    PAPER_FLEET_SOLVE_SECONDS,
    TABLE8_VIP_SIZES,
    make_fleet,
    table8_sizes,
)
from knapsack_lb.solver.api import Solution, objective_of, solve
from knapsack_lb.solver.batch import solve_many
from knapsack_lb.solver.inputs import DipInput
from knapsack_lb.solver.instances import identical_pool, table3_pool

PAPER_ILP_SECONDS = {10: 0.020, 50: 0.194, 100: 0.645, 500: 5.8, 1000: 21.1}
"""Table 6 of the paper: single-step ILP, 10 levels in [0, w_max], equal DIPs at 80% load."""

PAPER_MULTISTEP = {"100 levels, one step": 36.8, "10 levels, two steps (each)": 0.65}
"""Table 7 of the paper: 100 DIPs."""


def make_pool(dips: int, seed: int, pool: str = "table3", kind: str = "queueing") -> list[DipInput]:
    """The benchmark's instance: ``table3`` (heterogeneous, seeded) or ``identical`` (section 6.6)."""
    if pool == "table3":
        return table3_pool(dips, np.random.default_rng(seed), kind=kind)
    if pool == "identical":
        return identical_pool(dips, kind=kind)
    raise InvalidInputError("pool", pool, "must be 'table3' or 'identical'")


def run_solver_bench(
    dips: int,
    *,
    levels: int = 10,
    methods: Sequence[str] = ("exact", "ilp", "ilp-multistep"),
    objective: str = "mean",
    seed: int = 0,
    repeat: int = 3,
    pool: str = "table3",
    kind: str = "queueing",
    units: int = 1_000_000,
    time_limit: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Solve one instance with each method ``repeat`` times; one result row per method."""
    if repeat < 1:
        raise InvalidInputError("repeat", repeat, "must be >= 1")
    instance = make_pool(dips, seed, pool, kind)
    rows: list[dict[str, Any]] = []
    for method in methods:
        times: list[float] = []
        row: dict[str, Any] = {"method": method, "dips": dips, "levels": levels, "objective_kind": objective}
        try:
            for _ in range(repeat):
                solution = solve(instance, objective=objective, method=method, levels=levels, units=units,
                                 time_limit=time_limit)
                times.append(solution.seconds)
                if progress is not None:
                    progress(method)
            row.update(
                seconds=statistics.median(times), runs=times, objective=solution.objective, ran=solution.method,
                note=solution.note,
            )
        except KnapsackLBError as exc:
            row.update(seconds=None, runs=times, objective=None, ran=None, note=f"failed: {exc}")
        rows.append(row)
    found = [r["objective"] for r in rows if r["objective"] is not None]
    best = min(found) if found else None
    for row in rows:
        row["optimal_objective"] = best
        row["gap"] = None if row["objective"] is None or not best else row["objective"] / best - 1.0
    return rows


def scaling(
    sizes: Sequence[int],
    methods: Sequence[str],
    *,
    levels: int = 10,
    seed: int = 0,
    repeat: int = 1,
    pool: str = "table3",
    time_limit: float | None = None,
    largest: dict[str, int] | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """Median seconds per method and pool size (a method is skipped above ``largest[method]`` DIPs)."""
    series: dict[str, list[tuple[int, float]]] = {m: [] for m in methods}
    for n in sizes:
        chosen = [m for m in methods if largest is None or n <= largest.get(m, n)]
        for row in run_solver_bench(n, levels=levels, methods=chosen, seed=seed, repeat=repeat, pool=pool,
                                    time_limit=time_limit):
            if row["seconds"] is not None:
                series[row["method"]].append((n, float(row["seconds"])))
    return series


def objective_table(dips: Sequence[DipInput], objectives: Sequence[str] = ("mean", "sum")) -> list[dict[str, Any]]:
    """Solve ``dips`` once per objective and score every plan under every objective (rows per plan)."""
    rows = []
    for objective in objectives:
        solution = solve(dips, objective=objective)
        row: dict[str, Any] = {"solved_for": objective, "weights": solution.weights}
        for score in ("mean", "sum", "max"):
            row[score] = objective_of(dips, solution.weights, score)
        rows.append(row)
    return rows


@contextmanager
def pinned_to(cpu: int | None) -> Iterator[None]:
    """Run the block with this process pinned to ``cpu`` (Linux ``sched_setaffinity``); no-op for None."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    if cpu not in before:
        raise InvalidInputError("pin_cpu", cpu, f"must be one of this process's CPUs {sorted(before)}")
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _same_plan(a: Solution, b: Solution) -> bool:
    return (a.weights, a.predicted_latency, a.objective, a.method) == (b.weights, b.predicted_latency, b.objective,
                                                                       b.method)


def run_fleet_bench(
    *,
    seed: int = 0,
    shape: str = "table8",
    scale: float = 1.0,
    vips: int = 3410,
    dips: int = 60_000,
    kind: str = "quadratic",
    objective: str = "mean",
    units: int = 1_000_000,
    per_vip: bool = True,
    pin_cpu: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Build a seeded fleet (``knapsack_lb.lab.fleet.make_fleet``) and time solving all of it on one core.

    ``batched``: one ``solve_many`` call. ``per_vip`` (unless turned off): one
    ``solve(method="exact")`` call per VIP, each timed, plus the count of VIPs whose plan differs
    from the batched one (0 expected). Wall time is ``time.perf_counter``, CPU time
    ``time.process_time`` (every thread of the process: CPU <= wall shows that at most one core's
    worth was used). ``pin_cpu`` pins the process to that CPU while solving (on a shared machine
    that can only lengthen the wall time). Building the fleet is timed apart (``build_seconds``).
    ``progress(phase, done, total)`` reports DIPs built and VIPs solved one by one.
    """
    built = time.perf_counter()
    fleet_dips = sum(table8_sizes(scale)) if shape == "table8" else dips
    done = 0

    def built_one(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress("build", done, fleet_dips)

    fleet = make_fleet(seed, shape=shape, scale=scale, vips=vips, dips=dips, kind=kind, progress=built_one)
    build_seconds = time.perf_counter() - built
    problems = fleet.problems()
    count = len(problems)
    result: dict[str, Any] = {
        "benchmark": "solver-fleet",
        "fleet": {
            "shape": shape, "scale": scale if shape == "table8" else None, "seed": seed, "kind": kind,
            "vips": count, "dips": fleet.dip_count, "largest_vip": fleet.largest_vip,
            "median_vip": float(np.median([len(p) for p in problems])),
        },
        "objective": objective,
        "units": units,
        "build_seconds": round(build_seconds, 3),
    }
    result["pinned_cpu"] = pin_cpu
    with pinned_to(pin_cpu):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        batched = solve_many(problems, objective=objective, units=units)
        wall, cpu_used = time.perf_counter() - wall0, time.process_time() - cpu0
        result["batched"] = {
            "call": "solve_many(all VIPs)",
            "wall_seconds": round(wall, 4),
            "cpu_seconds": round(cpu_used, 4),
            "vips_per_second": round(count / wall, 1),
            "batched_vips": sum(1 for s in batched if "batched" in s.note),
        }
        if per_vip:
            times: list[float] = []
            by_size: dict[int, list[float]] = defaultdict(list)
            differ = 0
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for i, dips_of_vip in enumerate(problems):
                t0 = time.perf_counter()
                alone = solve(dips_of_vip, objective=objective, method="exact", units=units)
                elapsed = time.perf_counter() - t0
                times.append(elapsed)
                by_size[len(dips_of_vip)].append(elapsed)
                differ += not _same_plan(alone, batched[i])
                if progress is not None and (i % 50 == 49 or i == count - 1):
                    progress("solve", i + 1, count)
            wall, cpu_used = time.perf_counter() - wall0, time.process_time() - cpu0
            ms = np.array(times) * 1000
            result["per_vip"] = {
                "call": "solve(dips, method='exact') per VIP",
                "wall_seconds": round(wall, 4),
                "cpu_seconds": round(cpu_used, 4),
                "vips_per_second": round(count / wall, 1),
                "median_ms": round(float(np.median(ms)), 4),
                "p99_ms": round(float(np.percentile(ms, 99)), 4),
                "max_ms": round(float(ms.max()), 4),
                "median_ms_by_vip_size": (
                    {str(n): round(statistics.median(v) * 1000, 4) for n, v in sorted(by_size.items())}
                    if shape == "table8" else None
                ),
            }
            result["plans_differing_from_batched"] = differ
            result["batched"]["speedup_over_per_vip"] = round(wall / result["batched"]["wall_seconds"], 1)
    result["paper"] = {
        "what": "KnapsackLB paper, section 6.7: ILP (CBC via PuLP) for every VIP of its Table 8 fleet, "
                "on one 8-core VM; not this machine, not this solver",
        "vips": sum(TABLE8_VIP_SIZES.values()),
        "dips": sum(n * c for n, c in TABLE8_VIP_SIZES.items()),
        "seconds_on_8_core_vm": PAPER_FLEET_SOLVE_SECONDS,
        "controller_vms_to_resolve_every_5_s": PAPER_CONTROLLER_VMS,
    }
    result["note"] = ("one single-threaded process (CPU seconds <= wall seconds; pinned to pinned_cpu if set); "
                      "wall and CPU seconds of the solves only (build_seconds apart); exact greedy on a grid of "
                      "units per VIP, the optimum on that grid; the paper's number is another solver on another "
                      "machine, shown for scale")
    return result
