"""The learner's traffic test on known answers: M/M/1 DIPs, whose shift under a traffic change is exact."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from knapsack_lb.controller.core import VipController
from knapsack_lb.controller.dynamics import K_EVENT_MAX
from knapsack_lb.controller.estimation import RoundEvidence
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.controller.traffic import (
    RateReading,
    TrafficChange,
    corroborated,
    rate_change,
    shifted,
    traffic_change,
)
from knapsack_lb.curves.utilisation import UtilisationCurve
from knapsack_lb.lab.bench.controller import paper30_dips
from knapsack_lb.lab.fluid import FluidModel
from knapsack_lb.model import Traffic

from .loop import Loop

S = 0.010  # unloaded latency
WEIGHTS = {"a": 0.1, "b": 0.15, "c": 0.2, "d": 0.25, "e": 0.3}  # each DIP's share, held throughout
CURVES = {n: (UtilisationCurve(S, w / 0.7, 1.0), 0.9 * w / 0.7) for n, w in WEIGHTS.items()}  # at 70 % utilisation
SETTINGS = {"confirmations": 2, "tolerance": 0.1, "threshold": 0.1, "quorum": 0.6}


def _round(t: float, weight: float, mean: float, n: int = 100, cv: float = 0.1) -> RoundEvidence:
    return RoundEvidence(t, weight, mean, cv * mean, n, 0.0)


def _rounds(traffic: dict[float, float], weights: dict[str, float] | None = None,
            **overrides: float) -> dict[str, list[RoundEvidence]]:
    """Rounds at times 0, 5, ...; ``traffic[t]`` the VIP's rate relative to the start from time t on:
    an M/M/1 DIP of saturation weight ``c`` at weight ``w`` shows ``S / (1 - rate * w / c)``."""
    out: dict[str, list[RoundEvidence]] = {}
    for name, w in (weights or WEIGHTS).items():
        curve, _ = CURVES[name]
        rounds = []
        for t, rate in sorted(traffic.items()):
            mean = S / (1 - rate * overrides.get(name, 1.0) * w / curve.c)
            rounds.append(_round(t, w, mean))
        out[name] = rounds
    return out


def _traffic(t_change: float, rate: float, until: float = 40.0) -> dict[float, float]:
    return {float(t): (rate if t >= t_change else 1.0) for t in range(0, int(until) + 1, 5)}


def test_more_traffic_at_held_weights_shifts_every_curve_by_the_ratio_of_rates() -> None:
    found = traffic_change(_rounds(_traffic(35, 1.2)), CURVES, **SETTINGS)
    assert found is not None
    assert found.k == pytest.approx(1 / 1.2, rel=1e-3)  # M/M/1: k = rate before / rate after
    assert found.judged == 5 and found.moved == 5 and found.ratio > 1.1 and not found.apart


def test_less_traffic_is_found_the_other_way() -> None:
    found = traffic_change(_rounds(_traffic(35, 0.9)), CURVES, **SETTINGS)
    assert found is not None and found.k == pytest.approx(1 / 0.9, rel=1e-3)


def test_rounds_that_vary_beyond_their_probes_need_a_larger_move() -> None:
    """Traffic up 10 % (latency +30 % at 70 % utilisation) is beyond the rounds' own probes (100 each,
    10 % spread) but, where the pool's rounds at one weight vary by 30 % between them (layer 4: the
    load moves with the connections), within the noise of single rounds; traffic up 40 % is beyond both."""
    rounds = _rounds(_traffic(35, 1.1))
    assert traffic_change(rounds, CURVES, **SETTINGS) is not None
    assert traffic_change(rounds, CURVES, **SETTINGS, spread=0.3) is None
    assert traffic_change(_rounds(_traffic(35, 1.4)), CURVES, **SETTINGS, spread=0.3) is not None


def test_one_changed_round_is_no_change_yet() -> None:
    assert traffic_change(_rounds(_traffic(40, 1.2)), CURVES, **SETTINGS) is None


def test_weights_that_move_are_never_judged() -> None:
    """The learner's own transient: every round at a new weight, latencies far from before."""
    rounds = {n: [_round(5.0 * i, w * (1 + 0.3 * i), S * (1 + i)) for i in range(8)] for n, w in WEIGHTS.items()}
    assert traffic_change(rounds, CURVES, **SETTINGS) is None


def test_a_few_dips_moving_is_a_capacity_change_not_traffic() -> None:
    # two of five DIPs lost capacity (their latency rose); the other three held
    rounds = _rounds(_traffic(35, 1.0))
    for name in ("a", "b"):
        rounds[name] = _rounds(_traffic(35, 1.5), {name: WEIGHTS[name]})[name]
    assert traffic_change(rounds, CURVES, **SETTINGS) is None


def test_few_probes_per_round_need_many_dips_to_tell() -> None:
    """+15 % latency on three DIPs of five-probe rounds (cv 1): within the noise of the pool."""
    weights = {n: WEIGHTS[n] for n in "abc"}
    noisy = {n: [RoundEvidence(r.time, r.weight, r.mean, r.mean, 5, 0.0) for r in rs]
             for n, rs in _rounds(_traffic(35, 1.15), weights).items()}
    assert traffic_change(noisy, CURVES, **SETTINGS) is None
    precise = _rounds(_traffic(35, 1.15), weights)
    assert traffic_change(precise, CURVES, **SETTINGS) is not None


def test_a_dip_that_moved_against_the_pool_is_set_apart() -> None:
    rounds = _rounds(_traffic(35, 1.2))
    rounds["e"] = _rounds(_traffic(35, 0.6), {"e": WEIGHTS["e"]})["e"]  # more capacity, at the same time
    found = traffic_change(rounds, CURVES, **SETTINGS)
    assert found is not None and found.apart == ("e",) and found.moved == 4


def test_rounds_are_compared_under_the_weight_the_lb_carried_not_their_noisy_share() -> None:
    """At layer 4 the share a DIP carried over a round scatters around its configured weight; rounds
    under one weight are compared, the curve explaining what their shares' difference explains."""
    rng = random.Random(3)
    rounds = {}
    for name, w in WEIGHTS.items():
        curve, _ = CURVES[name]
        rounds[name] = []
        for t, rate in sorted(_traffic(35, 1.2).items()):
            share = w * rng.uniform(0.8, 1.2)
            rounds[name].append(RoundEvidence(t, share, S / (1 - rate * share / curve.c), 0.01 * S, 100, 0.0, w))
    found = traffic_change(rounds, CURVES, **SETTINGS)
    assert found is not None and found.k == pytest.approx(1 / 1.2, rel=0.02) and found.judged == 5
    by_share = {n: [replace(r, configured=math.nan) for r in rs] for n, rs in rounds.items()}
    assert traffic_change(by_share, CURVES, **SETTINGS) is None  # no two shares within the tolerance


def test_rounds_before_the_last_change_are_not_compared_again() -> None:
    rounds = _rounds(_traffic(35, 1.2))
    assert traffic_change(rounds, CURVES, **SETTINGS, since=35.0) is None  # nothing earlier at the new traffic


def test_a_shift_moves_all_but_the_newest_rounds() -> None:
    rounds = _rounds(_traffic(35, 1.2))["a"]
    moved = shifted(rounds, 0.8, keep=2)
    assert [r.weight for r in moved[:-2]] == pytest.approx([0.08] * (len(rounds) - 2))
    assert moved[-2:] == rounds[-2:]
    assert [r.mean for r in moved] == [r.mean for r in rounds]


def _rates(rng: random.Random, rates: list[float], seconds: float = 5.0) -> list[RateReading]:
    """Reads of the VIP's request counters every ``seconds``: Poisson counts at these rates."""
    return [RateReading(seconds * (i + 1), float(np.random.default_rng(rng.randrange(2**32)).poisson(r * seconds))
                        / seconds, seconds) for i, r in enumerate(rates)]


RATE = {"confirmations": 2, "threshold": 0.1, "z": 2.0}


def test_the_vip_request_rate_calls_a_traffic_change_and_its_size() -> None:
    """The LB's request counters at 200 req/s, then +15 % for two reads: a traffic change of the
    counted ratio (k its inverse); the same for less traffic, clamped to one event's bounds."""
    rng = random.Random(3)
    change = rate_change(_rates(rng, [200.0] * 8 + [230.0] * 2), **RATE)
    assert change is not None and change.counted and change.judged == 0
    assert change.ratio == pytest.approx(1.15, abs=0.03) and change.k == pytest.approx(1 / change.ratio)
    assert "request rate x1.1" in change.describe()
    halved = rate_change(_rates(rng, [200.0] * 8 + [100.0] * 2), **RATE)
    assert halved is not None and halved.ratio == pytest.approx(0.5, abs=0.05) and halved.k == K_EVENT_MAX


def test_a_rate_change_needs_every_newest_read_beyond_the_threshold_and_the_noise() -> None:
    rng = random.Random(4)
    steady = _rates(rng, [200.0] * 10)
    assert rate_change(steady, **RATE) is None
    assert rate_change(_rates(rng, [200.0] * 9 + [230.0]), **RATE) is None  # one read is no change yet
    assert rate_change(_rates(rng, [200.0] * 8 + [210.0] * 2), **RATE) is None  # 5 %: below the threshold
    assert rate_change(_rates(rng, [200.0] * 8 + [230.0, 170.0]), **RATE) is None  # not the same way
    assert rate_change(_rates(rng, [200.0] * 2 + [230.0] * 2), **RATE) is None  # too few reads before them
    # traffic burstier than Poisson (reads between 140 and 260 req/s): +15 % is within its spread
    bursty = [RateReading(5.0 * i, rate, 5.0) for i, rate in enumerate([140.0, 260.0] * 4 + [230.0, 230.0])]
    assert rate_change(bursty, **RATE) is None
    # a few requests a second: +15 % is within the counts' own noise
    assert rate_change(_rates(rng, [2.0] * 8 + [2.3] * 2), **RATE) is None


def _bytes(rates: list[float], latencies: list[float | None]) -> list[RateReading]:
    """Reads of the VIP's byte counters every 5 s at these rates, each with the VIP's probe latency."""
    return [RateReading(5.0 * (i + 1), rate, 5.0, "bytes", latency)
            for i, (rate, latency) in enumerate(zip(rates, latencies, strict=True))]


def test_a_counted_rate_of_bytes_is_traffic_only_where_the_latency_moved_the_same_way() -> None:
    """At layer 4 clients wait on the pool: more clients bring more bytes and a slower VIP; a DIP that
    lost capacity brings fewer bytes and a slower VIP, a recovered DIP or a better plan more bytes and
    a faster VIP. Only the first (and its mirror, fewer clients) is a traffic change."""
    before = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0]
    slow, fast = [0.050, 0.051, 0.049, 0.050, 0.050, 0.050], [0.040, 0.041]
    rise = rate_change(_bytes([*before, 1150.0, 1160.0], [*slow, 0.060, 0.062]), **RATE, clients_only=True)
    assert rise is not None and rise.ratio == pytest.approx(1.155) and rise.k == pytest.approx(1 / 1.155)
    assert "bytes rate" in rise.describe()
    fall = rate_change(_bytes([*before, 850.0, 860.0], [*slow, *fast]), **RATE, clients_only=True)
    assert fall is not None and fall.ratio == pytest.approx(0.855)
    # a capacity loss: fewer bytes, a slower VIP; a recovery: more bytes, a faster one
    assert rate_change(_bytes([*before, 850.0, 860.0], [*slow, 0.060, 0.062]), **RATE, clients_only=True) is None
    assert rate_change(_bytes([*before, 1150.0, 1160.0], [*slow, *fast]), **RATE, clients_only=True) is None
    # one of the newest reads the other way, or not measured: no verdict
    assert rate_change(_bytes([*before, 1150.0, 1160.0], [*slow, 0.060, 0.045]), **RATE, clients_only=True) is None
    assert rate_change(_bytes([*before, 1150.0, 1160.0], [*slow, 0.060, None]), **RATE, clients_only=True) is None
    # where the counters count requests the rate alone decides, as before
    assert rate_change(_bytes([*before, 850.0, 860.0], [*slow, 0.060, 0.062]), **RATE) is not None


def test_a_latency_shift_is_traffic_only_where_the_counted_rate_bears_it_out() -> None:
    """Where the LB counts, the DIPs' rounds call a traffic change only when the counted rate moved
    beyond its noise the way their latency did (no size threshold): fewer clients, fewer bytes and
    a faster pool. A rate that held (the rounds' own swing), or one that moved against the latency
    (a capacity change), bears nothing out."""
    before = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0]
    latencies: list[float | None] = [None] * 8
    faster, slower = TrafficChange(1.1, 0.93, 10, 8), TrafficChange(0.92, 1.08, 10, 8)
    fell = _bytes([*before, 960.0, 955.0], latencies)  # -4 %: below the rate test's threshold, beyond its noise
    assert corroborated(faster, fell, confirmations=2, z=2.0)
    assert not corroborated(slower, fell, confirmations=2, z=2.0)  # a capacity loss: fewer bytes, slower
    held = _bytes([*before, 1003.0, 996.0], latencies)
    assert not corroborated(faster, held, confirmations=2, z=2.0)
    assert not corroborated(slower, held, confirmations=2, z=2.0)
    one = _bytes([*before, 1000.0, 955.0], latencies)  # only the newest read moved
    assert not corroborated(faster, one, confirmations=2, z=2.0)
    assert not corroborated(faster, fell[-4:], confirmations=2, z=2.0)  # too few reads to judge


def _paper_pool(seed: int, ticks: int) -> Loop:
    """The paper's 30-DIP pool at 70 % load, learned by the default learner for ``ticks`` intervals."""
    dips = paper30_dips(seed)
    model = FluidModel(dips, total_rate=0.7 * sum(d.capacity for d in dips), seed=seed)
    model.set_weights({d.name: 1.0 for d in dips}, 0.0)
    loop = Loop(model, VipController("vip", model.names, ControllerSettings(), rng=random.Random(seed)))
    for _ in range(ticks):
        loop.tick()
    return loop


def _reasons(loop: Loop, ticks: int) -> list[str]:
    """The reasons of the plans over the next ``ticks`` intervals."""
    reasons: list[str] = []
    for _ in range(ticks):
        plan = loop.tick()
        reasons += plan.reasons if plan is not None else ()
    return reasons


def _reasons_after_a_rise(loop: Loop, factor: float) -> list[str]:
    """The reasons of the plans over 12 intervals after the VIP's traffic rises by ``factor``; no plan
    may drive a DIP past capacity."""
    loop.model.set_total_rate(loop.model.total_rate * factor)
    reasons: list[str] = []
    for _ in range(12):
        plan = loop.tick()
        if plan is not None:
            reasons += plan.reasons
            assert max(loop.model.utilisation(plan.weights).values()) < 1.0
    return reasons


def test_the_learner_keeps_its_curves_through_a_traffic_rise() -> None:
    """+10 % traffic on the paper's 30-DIP pool: one traffic change, the DIPs keep their rounds, and
    no plan after it drives a DIP past capacity."""
    loop = _paper_pool(1, ticks=100)
    kept = {n: len(d.evidence) for n, d in loop.ctl.dips.items()}
    reasons = _reasons_after_a_rise(loop, 1.1)
    assert sum(r.startswith("traffic change") for r in reasons) == 1, reasons
    # without the shift nearly every DIP would relearn from two rounds; one found faster than its
    # shifted curve may still be
    assert len([r for r in reasons if r.startswith("change:")]) <= 3
    assert sum(len(d.evidence) >= min(kept[n], 10) for n, d in loop.ctl.dips.items()) >= 27
    assert math.isfinite(loop.ctl.traffic_changed_at)


def test_where_the_lb_counts_requests_the_learner_reads_traffic_from_the_rate() -> None:
    """The paper's pool behind an LB that counts requests (each DIP's served requests at its share of
    the VIP's rate): steady traffic for 40 s calls nothing; +15 % is one traffic change, read from the
    counters, and no plan after it drives a DIP past capacity."""
    loop = _paper_pool(1, ticks=100)
    model = loop.model
    served = dict.fromkeys(model.names, 0.0)

    async def traffic() -> Traffic:
        for name, share in model.effective_weights(loop.now).items():
            served[name] += share * model.total_rate * loop.ctl.settings.loop.interval
        return Traffic("requests", dict(served))

    loop.lab.sink.traffic = traffic  # type: ignore[attr-defined]
    assert not any(r.startswith("traffic change") for r in _reasons(loop, 8))
    assert len(loop.ctl.vip_rates) >= 7
    reasons = _reasons_after_a_rise(loop, 1.15)
    changes = [r for r in reasons if r.startswith("traffic change")]
    assert len(changes) == 1 and "the VIP's request rate x1.150" in changes[0], reasons


def _count_bytes(loop: Loop, *, follow_traffic: bool) -> None:
    """The LB counts bytes (layer 4): each DIP's share of the VIP's rate, 2 kB a request; at the
    rate of the start whatever the traffic does, unless ``follow_traffic``."""
    model, counted, start = loop.model, dict.fromkeys(loop.model.names, 0.0), loop.model.total_rate

    async def traffic() -> Traffic:
        rate = model.total_rate if follow_traffic else start
        for name, share in model.effective_weights(loop.now).items():
            counted[name] += share * rate * 2_000 * loop.ctl.settings.loop.interval
        return Traffic("bytes", dict(counted))

    loop.lab.sink.traffic = traffic  # type: ignore[attr-defined]


@pytest.mark.parametrize("bytes_follow", [True, False])
def test_where_the_lb_counts_bytes_a_latency_shift_its_rate_does_not_bear_out_is_no_traffic(
        bytes_follow: bool) -> None:
    """The paper's pool behind an LB that counts bytes (layer 4): +8 % clients, below the rate test's
    10 %, is called by the DIPs' rounds and borne out by the bytes; the same rise in latency with the
    bytes held (what the rounds of a pool whose queues swing together show) is no traffic change."""
    loop = _paper_pool(1, ticks=100)
    _count_bytes(loop, follow_traffic=bytes_follow)
    assert not any(r.startswith("traffic change") for r in _reasons(loop, 8))
    loop.model.set_total_rate(loop.model.total_rate * 1.08)
    changes = [r for r in _reasons(loop, 12) if r.startswith("traffic change")]
    assert len(changes) == (1 if bytes_follow else 0), changes
    assert all("at unchanged weights" in c for c in changes)


def test_a_dip_restored_as_traffic_rises_is_relearned_not_shifted() -> None:
    """Four DIPs of the paper's pool run at 75 % of their capacity long enough to be learned so,
    then get it back as traffic rises by 10 %. A DIP whose weight moved meanwhile is not judged by
    the traffic test; shifting its rounds from the slow period put them beside its new, faster ones
    at one weight, and the curve between them held dip-26 at 0.54 of the oracle's share (1.042x the
    oracle's latency). Faster than its curve as traffic rose, it is relearned instead."""
    loop = _paper_pool(6, ticks=80)
    model = loop.model
    restored = ("dip-25", "dip-26", "dip-27", "dip-28")
    for name in restored:
        model.set_capacity_factor(name, 0.75)
    for _ in range(36):
        loop.tick()
    for name in restored:
        model.set_capacity_factor(name, 1.0)
    model.set_total_rate(model.total_rate * 1.1)
    reasons = _reasons(loop, 36)
    assert any(r.startswith("traffic change") for r in reasons)
    # relearned: by the traffic test itself when their weights held, else as moving against it
    assert any("moved against the traffic change" in r or "moved the other way" in r for r in reasons), reasons
    assert loop.ctl.plan is not None
    oracle = model.oracle()
    for name in restored:
        assert loop.ctl.plan.weights[name] >= 0.8 * oracle.weights[name], name
    assert model.quality(loop.ctl.plan.weights).mean_latency <= 1.02 * oracle.quality.mean_latency


def test_a_traffic_change_lifts_the_holds_of_earlier_rollbacks() -> None:
    """The first rounds under new traffic make the plan in force look worse than the one before it, and
    the guard may roll back and hold DIPs at their old weights for half a window before the traffic
    test calls the change; those holds compared plans across the change and go with it (in the fluid
    dynamics two DIPs restored to full capacity stayed held at 0.77 of the oracle's share)."""
    loop = _paper_pool(1, ticks=100)
    model = loop.model
    assert loop.ctl.plan is not None
    held = loop.ctl.dips["dip-27"]
    held.held, held.held_until = 0.5 * loop.ctl.plan.weights["dip-27"], loop.now + 300
    model.set_total_rate(model.total_rate * 1.1)
    reasons = _reasons(loop, 12)
    assert any(r.startswith("traffic change") for r in reasons), reasons
    assert held.held is None
    assert loop.ctl.plan.weights["dip-27"] > 0.6 * model.oracle().weights["dip-27"]
