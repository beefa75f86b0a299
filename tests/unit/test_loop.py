"""The one control loop (knapsack_lb/loop.py): the same plans whatever the sink when the
environments agree, confirmation before learning, refused applies, dry run, pause, drift."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

import pytest

from knapsack_lb.controller.core import VipController, is_solved
from knapsack_lb.controller.settings import ControllerSettings
from knapsack_lb.errors import StalePlanError
from knapsack_lb.lab.fluid import FluidLab, FluidModel, vip_config
from knapsack_lb.loop import (
    ControlLoop,
    ExactSink,
    FunctionSource,
    QuantisingSink,
    ShareMeter,
    fixed,
    run_now,
    split_distance,
    with_shares,
)
from knapsack_lb.model import Measurement, TimedRequests, Traffic, VipConfig, WeightPlan
from knapsack_lb.quantise import QUANTISERS
from knapsack_lb.store.memory import MemoryLatencyStore
from tests.unit.controller.loop import ALGORITHM1, FAST, record_steps, small_pool


class TruthSource:
    """Rounds without noise: each DIP's true mean latency at the split the sink carries."""

    def __init__(self, model: FluidModel, sink: ExactSink | QuantisingSink, config: VipConfig) -> None:
        self.model = model
        self.sink = sink
        self.config = config

    async def observe(self, now: float):  # type: ignore[no-untyped-def]
        from knapsack_lb.loop import Observation

        carried = self.sink.carried or {n: 1 / len(self.model.names) for n in self.model.names}
        rounds = {}
        for d in self.model.dips:
            latency = d.mean_latency(carried[d.name] * self.model.total_rate)
            ok = latency < 1.0
            rounds[d.name] = Measurement("vip", d.name, now, carried[d.name], 100, 100 if ok else 0, 0,
                                         0 if ok else 100, latency if ok else None, latency if ok else None,
                                         latency if ok else None, latency if ok else None, None, "truth",
                                         latency_std=0.0 if ok else None)
        return Observation(rounds, self.config)


def _run(sink: ExactSink | QuantisingSink, ticks: int = 60) -> list[tuple[str, tuple[str, ...], dict[str, float]]]:
    model = FluidModel(small_pool(), total_rate=0.7 * sum(d.capacity for d in small_pool()), seed=1)
    config = vip_config("vip", model.names)
    ctl = VipController("vip", model.names, FAST, rng=random.Random(1))
    now = [0.0]
    loop = ControlLoop(ctl, TruthSource(model, sink, config), fixed(sink), lambda: now[0])
    plans = []
    for _ in range(ticks):
        now[0] += FAST.loop.interval
        plan = run_now(loop.tick(now[0])).plan
        if plan is not None:
            plans.append((plan.method, plan.flags, dict(plan.weights)))
    return plans


def test_one_scenario_gives_the_same_plans_through_every_sink() -> None:
    """Where the environments agree (the same noiseless rounds), the fluid model's exact LB, the
    simulator's LB rounding like the recording adapter (1/10,000) and like Envoy (1/1,000) lead the
    one loop to the same plans: same methods and flags, weights within the rounding."""
    exact = _run(ExactSink())
    assert len(exact) > 5 and any("measuring" not in flags for _, flags, _ in exact)
    for lb, tolerance in (("recording", 2e-3), ("envoy", 5e-3)):
        quantised = _run(QuantisingSink(lb, lambda weights: None))
        assert [(m, f) for m, f, _ in quantised] == [(m, f) for m, f, _ in exact], lb
        for (_, _, a), (_, _, b) in zip(quantised, exact, strict=True):
            assert split_distance(a, b) <= tolerance, lb


def _lab_loop(sink_lb: str | None = None, settings: ControllerSettings = FAST,
              ) -> tuple[FluidLab, ControlLoop, ExactSink | QuantisingSink]:
    model = FluidModel(small_pool(), total_rate=0.7 * sum(d.capacity for d in small_pool()), seed=2)
    lab = FluidLab(model, vip_config("vip", model.names))
    ctl = VipController("vip", model.names, settings, rng=random.Random(1))
    sink: ExactSink | QuantisingSink = lab.sink
    if sink_lb is not None:
        sink = QuantisingSink(sink_lb, lambda weights: model.set_weights(weights, lab.now))
    source = FunctionSource(model.measure, lambda: lab.config, lab._take_remeasure)
    return lab, ControlLoop(ctl, source, fixed(sink), lambda: lab.now, state=MemoryLatencyStore()), sink


@pytest.mark.parametrize("lb", [None, "haproxy", "nginx"])
async def test_a_refused_apply_keeps_the_last_confirmed_weights(lb: str | None) -> None:
    lab, loop, sink = _lab_loop(lb)
    for _ in range(8):
        lab.now += 5.0
        await loop.tick(lab.now)
    ctl = loop.controller
    confirmed, version, applied_at = dict(ctl.in_force), ctl.confirmed_version, ctl.applied_at
    assert confirmed and version > 0
    sink.fail_next.extend(["the admin socket is gone"] * 50)
    refused = 0
    for _ in range(6):
        lab.now += 5.0
        outcome = await loop.tick(lab.now)
        if outcome.applied is not None:
            refused += not outcome.applied.ok
            assert "admin socket" in outcome.error
        assert ctl.in_force == confirmed and ctl.confirmed_version == version and ctl.applied_at == applied_at
        assert (await sink.read()) == pytest.approx(confirmed)
    assert refused >= 1 and loop.counters["apply_failures"] == refused
    refusing_since = applied_at + 5.0
    learned = [(n, e.weight) for n, d in ctl.dips.items() for e in d.evidence if e.time > refusing_since]
    assert learned and all(w == pytest.approx(confirmed[n]) for n, w in learned)  # never at a refused plan's weight
    state = loop.state
    assert isinstance(state, MemoryLatencyStore)
    stored = await state.in_force("vip")
    assert stored is not None and stored.version == version and dict(stored.weights) == pytest.approx(confirmed)
    sink.fail_next.clear()
    lab.now += 5.0
    outcome = await loop.tick(lab.now)
    assert outcome.pushed and ctl.confirmed_version > version  # the pending plan goes through at once


async def test_the_controller_learns_only_confirmed_weights() -> None:
    lab, loop, sink = _lab_loop("haproxy")
    lab.now += 5.0
    outcome = await loop.tick(lab.now)
    assert outcome.plan is not None and outcome.pushed
    carried = await sink.read()
    assert carried is not None
    assert loop.controller.in_force == pytest.approx(dict(carried))  # the LB's integers, not the float plan
    assert loop.controller.applied_at == lab.now
    integers = QUANTISERS["haproxy"](outcome.plan.weights).weights
    assert max(integers.values()) == 256


async def test_dry_run_computes_but_pushes_and_learns_nothing() -> None:
    lab, loop, sink = _lab_loop()
    lab.config = lab.config.model_copy(update={"dry_run": True})
    curves_before = dict(loop.controller.dips)
    for _ in range(5):
        lab.now += 5.0
        outcome = await loop.tick(lab.now)
        assert outcome.skipped == "dry run" and outcome.applied is None
    assert isinstance(sink, ExactSink) and sink.applied == []
    assert loop.controller.in_force == {} and loop.controller.confirmed_version == 0
    assert all(d.points == [] for d in curves_before.values())
    pending = loop.controller.pending
    assert pending is not None  # computed, stored as a plan, never confirmed
    lab.config = lab.config.model_copy(update={"dry_run": False})
    lab.now += 5.0
    outcome = await loop.tick(lab.now)
    assert outcome.pushed and loop.controller.confirmed_version >= pending.version


async def test_pause_computes_nothing_and_keeps_the_lb() -> None:
    lab, loop, sink = _lab_loop()
    for _ in range(3):
        lab.now += 5.0
        await loop.tick(lab.now)
    carried = await sink.read()
    lab.config = lab.config.model_copy(update={"paused": True})
    for _ in range(4):
        lab.now += 5.0
        outcome = await loop.tick(lab.now)
        assert outcome.skipped == "paused" and outcome.plan is None
    assert await sink.read() == carried


async def test_rounds_taken_while_paused_teach_nothing_after_the_resume() -> None:
    """While a VIP is paused the LB carries the operator's split, not one the controller confirmed:
    rounds taken then, or before that split drained, are not learned from when control resumes."""
    lab, loop, _ = _lab_loop(settings=FAST.tuned(drain={"time": 3.0}))
    lab.config = lab.config.model_copy(update={"paused": True})
    for _ in range(3):
        lab.now += 5.0
        await loop.tick(lab.now)
    paused_until = lab.now
    resumed = lab.config.model_copy(update={"paused": False})
    ctl = loop.controller
    for taken in (paused_until - 1.0, paused_until + 1.0):  # during the pause; before the split drained
        ctl.step(paused_until + 2.0, lab.model.measure(taken), config=resumed)
        assert all(not d.evidence for d in ctl.dips.values()), taken
    ctl.step(paused_until + 4.0, lab.model.measure(paused_until + 3.5), config=resumed)
    assert all(d.evidence for d in ctl.dips.values())


async def test_a_split_changed_behind_the_loops_back_is_reapplied() -> None:
    lab, loop, sink = _lab_loop("haproxy")
    for _ in range(40):
        lab.now += 5.0
        await loop.tick(lab.now)
    assert isinstance(sink, QuantisingSink)
    confirmed = dict(loop.controller.in_force)
    loop.controller.step = lambda *args, **kwargs: None  # type: ignore[method-assign]  # no new plan would undo it
    sink.carried = {n: (1.0 if n == "a" else 0.0) for n in confirmed}  # an operator edited the LB by hand
    reapplied = False
    for _ in range(3):
        lab.now += 5.0
        outcome = await loop.tick(lab.now)
        reapplied |= outcome.reapplied
    assert reapplied and split_distance(await sink.read() or {}, loop.controller.in_force) < 0.01


async def test_a_newer_plan_in_the_store_is_another_owners_not_drift_to_undo() -> None:
    """A controller that was frozen while another took its VIP over sees the LB on the newer owner's
    split: re-applying its own older plan would undo the new owner's work, so it steps back."""
    lab, loop, sink = _lab_loop("haproxy")
    await _tick(lab, loop, 10)
    assert isinstance(sink, QuantisingSink) and loop.state is not None and loop.controller.plan is not None
    mine = loop.controller.plan
    newer = WeightPlan(mine.vip, {n: (1.0 if n == "a" else 0.0) for n in mine.weights}, version=mine.version + 5,
                       computed_at=lab.now)
    await loop.state.put_plan(newer)
    sink.carried = dict(newer.weights)  # the new owner pushed it
    loop.controller.step = lambda *args, **kwargs: None  # type: ignore[method-assign]  # nothing new: only the drift
    with pytest.raises(StalePlanError):
        for _ in range(3):
            await _tick(lab, loop)
    assert sink.carried == newer.weights  # nothing was pushed over it


async def test_rounds_stamped_with_another_split_are_not_learned_from() -> None:
    """A round whose stamped weight contradicts what the LB confirmed (a stale prober, a change
    behind the controller's back) is dropped, not taken at the confirmed weight."""
    lab, loop, _ = _lab_loop()
    for _ in range(6):
        lab.now += 5.0
        await loop.tick(lab.now)
    ctl = loop.controller
    name = next(iter(ctl.in_force))
    wrong = ctl.in_force[name] + 0.2
    rounds = lab.model.measure(lab.now + 5.0)
    stale: Mapping[str, Measurement] = {**rounds, name: Measurement(**{**vars(rounds[name]), "weight": wrong})}
    before = ctl.dips[name].last_round
    ctl.step(lab.now + 5.0, stale)
    assert ctl.dips[name].last_round == before


async def _tick(lab: FluidLab, loop: ControlLoop, times: int = 1) -> None:
    for _ in range(times):
        lab.now += 5.0
        await loop.tick(lab.now)


async def test_stopping_mid_measurement_leaves_the_last_solved_plan() -> None:
    lab, loop, sink = _lab_loop("haproxy", ALGORITHM1)
    ctl = loop.controller
    for _ in range(80):
        await _tick(lab, loop)
        if ctl.plan is not None and is_solved(ctl.plan) and ctl.pending is None and not ctl.measuring:
            break
    solved = ctl.last_solved
    assert solved is not None and solved.version == ctl.confirmed_version
    lab.remeasure.add("c")  # Algorithm 1 measures c again: measurement plans reach the LB
    await _tick(lab, loop, 2)
    assert ctl.plan is not None and "measuring" in ctl.plan.flags and ctl.pending is None
    lab.now += 1.0
    outcome = await loop.stop(lab.now)
    assert outcome.pushed and outcome.plan is not None and outcome.plan.method == "kept"
    assert outcome.plan.weights == pytest.approx(dict(solved.weights))
    assert split_distance(await sink.read() or {}, solved.weights) < 0.01
    assert any("controller stopping" in r for r in outcome.plan.reasons)
    stored = await loop.state.current_plan("vip")  # type: ignore[union-attr]
    assert stored is not None and stored.version == outcome.plan.version
    assert (await loop.stop(lab.now + 1.0)).plan is None  # already on it: nothing more is pushed


@pytest.mark.parametrize("policy", ["equal", "capacity", "last-solved"])
async def test_stopping_before_anything_is_learned_leaves_equal_weights(policy: str) -> None:
    lab, loop, _ = _lab_loop(None, ALGORITHM1.tuned(loop={"on_stop": policy}))
    lab.config = lab.config.model_copy(update={"drained": ("b",)})
    await _tick(lab, loop)  # the first measurement round is on the LB
    outcome = await loop.stop(lab.now + 1.0)
    assert outcome.pushed and outcome.plan is not None
    assert outcome.plan.method == "equal-split" and outcome.plan.weights["b"] == 0.0  # a drained DIP stays out
    assert min(w for n, w in outcome.plan.weights.items() if n != "b") > 0.1


async def test_stopping_on_capacity_spreads_by_estimated_capacity() -> None:
    lab, loop, _ = _lab_loop(None, FAST.tuned(loop={"on_stop": "capacity"}))
    await _tick(lab, loop, 10)
    outcome = await loop.stop(lab.now + 1.0)
    assert outcome.pushed and outcome.plan is not None and outcome.plan.method == "capacity-proportional"
    w_max = {n: d.w_max for n, d in loop.controller.dips.items()}
    assert outcome.plan.weights == pytest.approx({n: w / sum(w_max.values()) for n, w in w_max.items()})


async def test_stopping_leaves_paused_dry_run_and_keep_alone() -> None:
    for update, settings in (({"paused": True}, ALGORITHM1), ({"dry_run": True}, ALGORITHM1),
                             ({}, ALGORITHM1.tuned(loop={"on_stop": "keep"}))):
        lab, loop, sink = _lab_loop(None, settings)
        await _tick(lab, loop)
        carried = await sink.read()
        lab.config = lab.config.model_copy(update=update)
        outcome = await loop.stop(lab.now + 1.0)
        assert outcome.plan is None and not outcome.pushed and await sink.read() == carried


def test_run_now_refuses_a_coroutine_that_waits() -> None:
    import asyncio

    async def waits() -> None:
        await asyncio.sleep(0)  # yields to an event loop: a real source or sink would

    with pytest.raises(RuntimeError, match="waited"):
        run_now(waits())



async def test_applies_failures_and_recovery_are_logged_with_their_reasons(caplog: pytest.LogCaptureFixture) -> None:
    lab, loop, sink = _lab_loop("haproxy")
    caplog.set_level("INFO", logger="knapsack_lb.loop")
    await _tick(lab, loop)
    applied = [r for r in caplog.records if r.getMessage() == "plan applied"]
    assert applied and applied[0].version == 1 and "->" in applied[0].changes and applied[0].reason  # type: ignore[attr-defined]
    caplog.clear()
    sink.fail_next.extend(["admin socket unreachable"] * 2)
    for _ in range(8):
        await _tick(lab, loop)
        if not sink.fail_next:
            break
    refused = [r for r in caplog.records if r.levelname == "WARNING" and "refused" in r.getMessage()]
    assert refused and "admin socket unreachable" in refused[0].reason  # type: ignore[attr-defined]
    await _tick(lab, loop, 3)
    back = [r for r in caplog.records if r.getMessage() == "the load balancer takes plans again"]
    assert len(back) == 1 and back[0].after_failures == 2  # type: ignore[attr-defined]
    plans = await loop.state.plan_history("vip", limit=100)  # type: ignore[union-attr]
    assert plans and all(p.reasons for p in plans)


def _since_previous(meter: ShareMeter, traffic: Traffic | None,
                    now: float) -> tuple[float, dict[str, float] | None] | None:
    """Take a read; the window from the read before it (when it was, its shares), or None without one."""
    meter.update(traffic, now)
    windows = meter.windows()
    return windows[0] if windows else None


def test_the_share_meter_takes_differences_and_refuses_resets_and_kind_changes() -> None:
    meter = ShareMeter()
    assert _since_previous(meter, Traffic("requests", {"a": 10, "b": 10}), 5.0) is None  # nothing to compare with
    known = _since_previous(meter, Traffic("requests", {"a": 40, "b": 20}), 10.0)
    assert known is not None and known[1] == pytest.approx({"a": 0.75, "b": 0.25}) and known[0] == 5.0
    assert meter.rate == pytest.approx(40 / 5.0)
    reset = _since_previous(meter, Traffic("requests", {"a": 5, "b": 30}), 15.0)
    assert reset is not None and reset[1] is None  # a went down: the LB reloaded
    assert _since_previous(meter, Traffic("bytes", {"a": 900, "b": 100}), 20.0) is None  # another kind of counter
    idle = _since_previous(meter, Traffic("bytes", {"a": 900, "b": 100}), 25.0)
    assert idle is not None and idle[1] is None  # nothing served
    _since_previous(meter, Traffic("bytes", {"a": 1400, "b": 600}), 30.0)
    counted = meter.latest()  # bytes per second reach the learner's traffic test; the probe budget wants requests
    assert counted is not None and counted.kind == "bytes" and counted.rate == pytest.approx(1000 / 5.0)
    assert meter.rate is None
    assert _since_previous(meter, None, 35.0) is None


def test_a_round_that_started_before_the_previous_read_takes_the_share_over_both_windows() -> None:
    """A live probe round is stamped with its start and read after it ended: with rounds as long as
    the tick, it started before the previous read, and its share spans that read's window and the
    newest. Only reads the meter still keeps count; a round from before them has no share."""
    meter = ShareMeter()
    for now, a in ((-2.0, 0), (0.0, 0), (2.0, 100), (4.0, 400), (6.0, 500)):
        meter.update(Traffic("bytes", {"a": a, "b": 100 + now * 50}), now)
    # reads kept: 0 s (a 0, b 100), 2 s (a 100, b 200), 4 s (a 400, b 300), 6 s (a 500, b 400)
    m = Measurement("v", "a", 3.1, 0.5, 5, 5, 0, 0, 0.01, 0.01, 0.01, 0.01, None, "w")
    stamped = with_shares({"a": m}, meter)["a"]
    assert stamped.share == pytest.approx(400 / 600)  # from the read at 2 s to the newest, at 6 s
    assert with_shares({"a": replace(m, time=5.0)}, meter)["a"].share == pytest.approx(0.5)  # within the last tick
    assert with_shares({"a": replace(m, time=-1.0)}, meter)["a"].share is None  # older than every kept read
    assert with_shares({"a": replace(m, share=0.2)}, meter)["a"].share == 0.2  # the prober's own share stands


async def test_rounds_are_placed_at_the_share_the_lb_counted() -> None:
    """At layer 4 a DIP's share lags its weight: the learner takes each round at the share the
    LB's counters say the DIP carried since the last tick, not at its weight."""
    lab, loop, sink = _lab_loop()
    served = {n: 0.0 for n in lab.model.names}
    counted: list[dict[str, float]] = []

    async def traffic() -> Traffic:
        for n in served:  # the DIPs carried an equal split whatever the weights said
            served[n] += 100.0
        counted.append(dict(served))
        return Traffic("requests", dict(served))

    sink.traffic = traffic  # type: ignore[union-attr]
    await _tick(lab, loop, 4)
    evidence = loop.controller.dips["a"].evidence
    assert len(counted) >= 3 and evidence
    assert evidence[-1].weight == pytest.approx(0.25)  # the counted share, not the planned weight
    assert loop.controller.in_force["a"] != pytest.approx(0.25)
    # the VIP's request rate between two reads (4 DIPs x 100 requests in 5 s) reaches the controller too
    rates = loop.controller.vip_rates
    assert rates and all(r.rate == pytest.approx(80.0) and r.seconds == pytest.approx(5.0) for r in rates)
    assert rates[-1].time == lab.now


def _probe_capacity_share(ctl: VipController, name: str) -> float:
    """A DIP's capacity as a share of the VIP's traffic, as the probe budget reads it."""
    dip = ctl.dips[name]
    return max(dip.curve_obj().upper_bound, dip.w_max, ctl.in_force[name])


async def test_the_probe_budget_follows_capacity_without_a_request_rate_and_is_capped_with_one() -> None:
    """Each tick stores how many probe requests each DIP gets next round, the VIP's total kept.
    Without the LB's request counters (layer 4) a DIP gets at most the VIP's budget times its
    capacity as a share of the VIP's traffic, so the smallest DIP gets fewer than the uniform share;
    with counters each DIP gets at most 3 % of its estimated capacity over an interval."""
    lab, loop, sink = _lab_loop()
    store = loop.state
    assert isinstance(store, MemoryLatencyStore)
    ctl = loop.controller
    await _tick(lab, loop, 3)
    uniform = lab.config.probe.requests_per_round
    total = uniform * len(lab.model.names)
    budget = await store.probe_budget("vip")
    assert set(budget) == set(lab.model.names) and sum(budget.values()) == total
    for name, count in budget.items():
        assert FAST.breaker.min_requests <= count <= max(FAST.breaker.min_requests,
                                                         total * _probe_capacity_share(ctl, name))
    smallest = min(lab.model.names, key=lambda n: _probe_capacity_share(ctl, n))
    assert budget[smallest] < uniform
    served = dict.fromkeys(lab.model.names, 0.0)

    async def traffic() -> Traffic:
        for n, w in (sink.carried or {}).items():
            served[n] += w * lab.model.total_rate * 5.0
        return Traffic("requests", dict(served))

    sink.traffic = traffic  # type: ignore[union-attr]
    await _tick(lab, loop, 4)
    budget = await store.probe_budget("vip")
    assert set(budget) == set(lab.model.names) and sum(budget.values()) <= total
    for name, count in budget.items():
        capacity = _probe_capacity_share(ctl, name) * lab.model.total_rate
        assert 1 <= count <= max(FAST.breaker.min_requests, 0.03 * capacity * lab.config.probe.interval)
    assert budget != dict.fromkeys(lab.model.names, uniform)


async def test_no_probe_budget_in_dry_run_or_with_the_uniform_allocation() -> None:
    lab, loop, _ = _lab_loop(settings=FAST.tuned(probe_budget={"allocation": "uniform"}))
    await _tick(lab, loop, 2)
    assert await loop.state.probe_budget("vip") is None  # type: ignore[union-attr]
    lab, loop, _ = _lab_loop()
    lab.config = lab.config.model_copy(update={"dry_run": True})
    await _tick(lab, loop, 2)
    assert await loop.state.probe_budget("vip") is None  # type: ignore[union-attr]


async def test_a_dip_removed_from_the_vip_leaves_no_stale_curve_in_the_store() -> None:
    lab, loop, _ = _lab_loop("haproxy")
    await _tick(lab, loop, 10)
    assert loop.state is not None and set(await loop.state.curves("vip")) == {"a", "b", "c", "d"}
    lab.config = vip_config("vip", ["a", "b", "c"])
    await _tick(lab, loop, 3)
    assert set(await loop.state.curves("vip")) == {"a", "b", "c"}


async def test_what_the_lb_timed_is_pooled_into_the_rounds_and_the_next_probes_shrink() -> None:
    lab, loop, sink = _lab_loop()
    asked: list[float] = []

    async def timings() -> dict[str, TimedRequests]:
        asked.append(lab.now)
        return {"a": TimedRequests(500, 0.02, 0.02, failures=5)}

    sink.timings = timings  # type: ignore[union-attr]
    seen = record_steps(loop.controller)
    await _tick(lab, loop, 2)
    assert asked and seen[-1]["a"].lb_timed == 505 and seen[-1]["a"].errors >= 5
    assert all(m.lb_timed == 0 for name, m in seen[-1].items() if name != "a")
    assert loop.budget is not None and loop.budget["a"] == loop.controller.settings.probe_budget.floor
    assert loop.budget["a"] < min(v for name, v in loop.budget.items() if name != "a")
