"""Reading a DIP's load from its light requests, on samples drawn from the queueing models themselves."""

from __future__ import annotations

import random

import pytest

from knapsack_lb.controller.light_rounds import MAX_WORKERS, MIN_LIGHT_REQUESTS, light_load, light_round
from knapsack_lb.controller.waiting import erlang_c, wilson_interval

WORK = 0.001  # the light request's own work (s)
SERVICE = 0.02  # the application's unloaded latency (s)


def worker_pool(workers: int, utilisation: float, count: int, rng: random.Random, jitter: float = 0.0) -> list[float]:
    """Light latencies behind ``workers`` FCFS workers (M/M/c): a request that finds every worker busy
    waits an exponential time of mean S / (c - a)."""
    offered = workers * utilisation
    waited = erlang_c(workers, offered)
    out = []
    for _ in range(count):
        wait = rng.expovariate((workers - offered) / SERVICE) if rng.random() < waited else 0.0
        out.append(WORK + wait + rng.uniform(0, jitter))
    return out


def processor_sharing(cores: int, utilisation: float, count: int, rng: random.Random) -> list[float]:
    """Light latencies under processor sharing over ``cores``: a request that finds n >= c others is
    stretched to w (n + 1) / c, with n - c geometric of ratio the utilisation."""
    waited = erlang_c(cores, cores * utilisation)
    out = []
    for _ in range(count):
        if rng.random() < waited:
            extra = 0
            while rng.random() < utilisation:
                extra += 1
            out.append(WORK * (cores + extra + 1) / cores)
        else:
            out.append(WORK)
    return out


@pytest.mark.parametrize(("workers", "utilisation"), [(1, 0.5), (4, 0.7), (16, 0.85)])
def test_a_worker_pools_waits_read_in_its_service_time_give_its_utilisation(workers: int, utilisation: float) -> None:
    rng = random.Random(workers)
    pooled = light_round([worker_pool(workers, utilisation, 50, rng) for _ in range(6)])
    assert pooled is not None and pooled.probes == 300 and pooled.base == pytest.approx(WORK)
    assert pooled.waited / pooled.probes == pytest.approx(erlang_c(workers, workers * utilisation), abs=0.07)
    load = light_load(pooled, SERVICE, z=2.0)
    assert load.unit == "service"
    # six rounds of 50 read the utilisation to within 0.05-0.07 on four draws in five (p10-p90 of 200 draws)
    assert load.utilisation == pytest.approx(utilisation, abs=0.1)
    assert load.low <= utilisation <= (load.high or 1.0)
    assert load.saturation_share(0.3) == pytest.approx(0.3 / load.utilisation)


@pytest.mark.parametrize(("cores", "utilisation"), [(1, 0.5), (4, 0.7), (16, 0.85)])
def test_processor_sharings_stretches_read_in_the_light_requests_own_work(cores: int, utilisation: float) -> None:
    rng = random.Random(cores)
    pooled = light_round([processor_sharing(cores, utilisation, 50, rng) for _ in range(6)])
    assert pooled is not None
    load = light_load(pooled, SERVICE, z=2.0)  # S is at hand; the stretches fit the light request's own work
    assert load.unit == "stretch"
    assert load.utilisation == pytest.approx(utilisation, abs=0.1)


def test_without_the_service_time_a_worker_pool_reads_busier_never_idler() -> None:
    pooled = light_round([worker_pool(4, 0.7, 50, random.Random(7)) for _ in range(6)])
    assert pooled is not None
    blind = light_load(pooled, None, z=2.0)
    assert blind.unit == "stretch" and blind.utilisation is not None and blind.utilisation > 0.9


def test_jitter_below_the_base_raises_the_threshold_so_it_is_not_read_as_waiting() -> None:
    rng = random.Random(3)
    clean = light_round([worker_pool(4, 0.7, 50, rng) for _ in range(6)])
    rng = random.Random(3)
    jittery = light_round([worker_pool(4, 0.7, 50, rng, jitter=0.05 * WORK) for _ in range(6)])
    assert clean is not None and jittery is not None
    assert jittery.jitter >= 0.04 * WORK > clean.jitter
    assert abs(jittery.waited - clean.waited) <= 0.03 * clean.probes
    assert light_load(jittery, SERVICE, z=2.0).utilisation == pytest.approx(0.7, abs=0.07)


def test_too_few_waits_bound_the_load_as_the_most_workers_would_run_it() -> None:
    """No wait in 50: at most 7.4 % of arrivals wait (Wilson, z = 2), which 64 workers reach at 81 %; 300
    without a wait allow 1.3 %, reached at 72 %: the more evidence, the wider the trust region."""
    idle = light_round([[WORK] * 50])
    assert idle is not None and idle.waited == 0
    load = light_load(idle, SERVICE, z=2.0)
    assert load.utilisation is None and load.unit == "none" and load.high is not None
    assert erlang_c(MAX_WORKERS, MAX_WORKERS * load.high) == pytest.approx(wilson_interval(0, 50, 2.0)[1])
    assert load.high == pytest.approx(0.81, abs=0.01)
    assert load.saturation_share(0.2) == pytest.approx(0.2 / load.high)
    assert load.saturation_share(0.0) is None  # a DIP that carried nothing: no share to scale
    longer = light_load(light_round([[WORK] * 300]), SERVICE, z=2.0)  # type: ignore[arg-type]
    assert longer.high is not None and longer.high < load.high
    assert light_round([[WORK] * (MIN_LIGHT_REQUESTS - 1)]) is None
    assert light_round([[0.0] * 50]) is None


def test_every_request_waited_reads_a_full_dip_at_the_share_it_carried() -> None:
    full = light_round([[WORK] * 2 + [WORK * (1 + i) for i in range(2, 52)]])
    assert full is not None
    load = light_load(full, SERVICE, z=2.0)
    assert load.utilisation is not None and load.utilisation > 0.9
    share = load.saturation_share(0.25)
    assert share is not None and 0.25 <= share < 0.28
