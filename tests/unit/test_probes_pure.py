"""Pure parts of the probe worker: assignment, round summaries, the outage buffer, options."""

from __future__ import annotations

import asyncio
import random

import pytest

from knapsack_lb.errors import InvalidInputError
from knapsack_lb.model import Measurement
from knapsack_lb.rounds import RoundSamples, nearest_rank, summarise
from probes.assignment import assigned_to, rendezvous_owner
from probes.buffer import RoundBuffer
from probes.worker import ProbeWorkerOptions, send_times

RESOURCES = [f"web:d{i}" for i in range(300)]


def test_rendezvous_gives_every_resource_one_owner_and_spreads_them() -> None:
    members = ["w1", "w2", "w3"]
    shares = [assigned_to(m, RESOURCES, members) for m in members]
    assert set().union(*shares) == set(RESOURCES)
    assert sum(len(s) for s in shares) == len(RESOURCES)
    assert all(70 <= len(s) <= 130 for s in shares)
    assert rendezvous_owner("web:d1", []) is None


def test_rendezvous_moves_only_the_leaving_or_joining_members_share() -> None:
    before = {r: rendezvous_owner(r, ["w1", "w2", "w3"]) for r in RESOURCES}
    after_leave = {r: rendezvous_owner(r, ["w1", "w3"]) for r in RESOURCES}
    moved = [r for r in RESOURCES if before[r] != after_leave[r]]
    assert moved and all(before[r] == "w2" for r in moved)
    after_join = {r: rendezvous_owner(r, ["w1", "w2", "w3", "w4"]) for r in RESOURCES}
    moved = [r for r in RESOURCES if before[r] != after_join[r]]
    assert moved and all(after_join[r] == "w4" for r in moved)


def test_a_member_not_yet_listed_counts_itself_live() -> None:
    assert assigned_to("w9", RESOURCES, []) == set(RESOURCES)


def test_summary_keeps_success_and_failure_latency_apart() -> None:
    samples = RoundSamples(success_latencies=[0.010, 0.020, 0.030, 0.040])
    samples.add_error("status_503", 0.001)
    samples.add_timeout(1.0)
    m = summarise(samples, vip="web", dip="d1", time=5.0, weight=0.25, worker="w1")
    assert (m.sent, m.successes, m.errors, m.timeouts) == (6, 4, 1, 1)
    assert m.latency_mean == pytest.approx(0.025)
    assert (m.latency_p50, m.latency_p90, m.latency_p99) == (0.020, 0.040, 0.040)
    assert m.failure_latency_mean == pytest.approx(0.5005)
    assert samples.error_kinds == {"status_503": 1}


def test_summary_of_a_round_without_successes() -> None:
    samples = RoundSamples()
    samples.add_error("connection", 0.0001)
    m = summarise(samples, vip="web", dip="d1", time=1.0, weight=0.0, worker="w1")
    assert m.latency_mean is None and m.latency_p99 is None and m.success_rate == 0.0


def test_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 0.5) == 50.0
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 1.0) == 100.0
    assert nearest_rank([], 0.5) is None


def _round(t: float) -> list[Measurement]:
    return [Measurement(vip="web", dip=d, time=t, weight=0.5, sent=1, successes=1, errors=0, timeouts=0,
                        latency_mean=0.01, latency_p50=0.01, latency_p90=0.01, latency_p99=0.01,
                        failure_latency_mean=None, worker="w1") for d in ("d1", "d2")]


def test_buffer_drops_the_oldest_beyond_its_bound_and_counts() -> None:
    buffer = RoundBuffer(max_rounds=3)
    dropped = [buffer.push(_round(float(t))) for t in range(5)]
    assert dropped == [0, 0, 0, 1, 1]
    assert (buffer.dropped_rounds, buffer.dropped_measurements) == (2, 4)
    assert [m.time for m in buffer.peek_all()] == [2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    pending, newest = buffer.pending()
    assert len(pending) == 6
    buffer.written(newest)
    assert len(buffer) == 0 and buffer.pending() == ([], 0)
    with pytest.raises(ValueError, match="max_buffered_rounds"):
        RoundBuffer(0)


def test_rounds_pushed_while_a_write_is_in_flight_stay_though_the_bound_dropped_older_ones() -> None:
    """A write takes rounds 1 and 2; two rounds come before it succeeds, and the bound of two
    drops 1 and 2 to keep them: the success forgets nothing unwritten (popping as many rounds as
    were taken would lose rounds 3 and 4)."""
    buffer = RoundBuffer(max_rounds=2)
    buffer.push(_round(1.0))
    buffer.push(_round(2.0))
    pending, newest = buffer.pending()
    assert [m.time for m in pending] == [1.0, 1.0, 2.0, 2.0]
    buffer.push(_round(3.0))
    buffer.push(_round(4.0))
    buffer.written(newest)
    assert [m.time for m in buffer.peek_all()] == [3.0, 3.0, 4.0, 4.0]
    buffer.push(_round(5.0))  # 4 and 5 in flight; 6 comes and the bound drops 4: the success forgets 5 only
    pending, newest = buffer.pending()
    buffer.push(_round(6.0))
    buffer.written(newest)
    assert [m.time for m in buffer.peek_all()] == [6.0, 6.0]


def test_a_write_forgets_only_what_it_wrote_and_a_failed_one_keeps_everything() -> None:
    buffer = RoundBuffer(max_rounds=4)
    stored: list[float] = []

    async def failing(measurements: list[Measurement]) -> None:
        raise ConnectionError("store down")

    async def put_while_a_round_comes(measurements: list[Measurement]) -> None:
        buffer.push(_round(3.0))  # a round finished while the write was in flight
        stored.extend(m.time for m in measurements)

    async def run() -> None:
        assert await buffer.write(failing) == []  # nothing buffered: put is not called
        buffer.push(_round(1.0))
        buffer.push(_round(2.0))
        with pytest.raises(ConnectionError):
            await buffer.write(failing)
        assert [m.time for m in buffer.peek_all()] == [1.0, 1.0, 2.0, 2.0]
        written = await buffer.write(put_while_a_round_comes)
        assert [m.time for m in written] == stored == [1.0, 1.0, 2.0, 2.0]
        assert [m.time for m in buffer.peek_all()] == [3.0, 3.0]

    asyncio.run(run())


def test_worker_options_refuse_bad_values_by_name() -> None:
    with pytest.raises(InvalidInputError, match="worker_id"):
        ProbeWorkerOptions(worker_id="bad id")
    with pytest.raises(InvalidInputError, match="lease_ttl"):
        ProbeWorkerOptions(worker_id="w1", lease_ttl=0)
    with pytest.raises(InvalidInputError, match="max_buffered_rounds"):
        ProbeWorkerOptions(worker_id="w1", max_buffered_rounds=0)


async def test_takeover_and_rebalance_follow_the_injected_clock() -> None:
    from knapsack_lb.clock import FakeClock
    from knapsack_lb.model import DipConfig, ProbeSpec, VipConfig
    from knapsack_lb.store.memory import MemoryLatencyStore
    from probes.worker import ProbeWorker

    clock = FakeClock(1000.0)
    store = MemoryLatencyStore(clock=clock)
    dips = tuple(DipConfig(name=f"d{i}", address=f"127.0.0.1:{9000 + i}") for i in range(12))
    await store.put_vip(VipConfig(name="web", dips=dips, probe=ProbeSpec(interval=1.0)))
    workers = {w: ProbeWorker(store, ProbeWorkerOptions(worker_id=w), clock=clock) for w in ("wa", "wb")}
    for _ in range(2):
        for worker in workers.values():
            await worker.refresh()
    everything = {f"web:{d.name}" for d in dips}
    assert workers["wa"].owned | workers["wb"].owned == everything
    assert not workers["wa"].owned & workers["wb"].owned and workers["wa"].owned and workers["wb"].owned
    assert workers["wa"].lease_ttl == pytest.approx(0.5)

    clock.advance(0.4)  # wb dies: no more refreshes from it; its leases are still valid
    await workers["wa"].refresh()
    assert workers["wa"].owned != everything
    clock.advance(0.2)  # past wb's TTL (0.5 s after its last refresh)
    await workers["wa"].refresh()
    assert workers["wa"].owned == everything

    workers["wc"] = ProbeWorker(store, ProbeWorkerOptions(worker_id="wc"), clock=clock)
    await workers["wc"].refresh()  # heartbeat; wa still holds everything
    await workers["wa"].refresh()  # wa sees wc and releases wc's share
    await workers["wc"].refresh()  # wc leases it
    assert workers["wc"].owned and workers["wa"].owned | workers["wc"].owned == everything
    assert not workers["wa"].owned & workers["wc"].owned


def test_send_times_put_one_request_in_each_equal_slot_of_the_span() -> None:
    times = send_times(10.0, 2.0, 8, random.Random(1))
    assert times == sorted(times)
    for index, at in enumerate(times):
        assert 10.0 + index * 0.25 <= at < 10.0 + (index + 1) * 0.25
    assert send_times(10.0, 2.0, 8, random.Random(1)) == times  # the seeded RNG decides them
    assert send_times(10.0, 0.0, 3, random.Random(1)) == [10.0, 10.0, 10.0]  # back to back
    assert send_times(10.0, 2.0, 0, random.Random(1)) == []


def test_send_times_sample_the_span_uniformly() -> None:
    """Stratified times are uniform over the span: their mean offset is the span's middle, with far
    less spread than independent uniform times (each is confined to its slot)."""
    rng = random.Random(7)
    means = [sum(send_times(0.0, 1.0, 5, rng)) / 5 for _ in range(2000)]
    centre = sum(means) / len(means)
    spread = (sum((m - centre) ** 2 for m in means) / len(means)) ** 0.5
    assert centre == pytest.approx(0.5, abs=0.01)
    assert spread < 0.5 * (1 / 12 / 5) ** 0.5  # independent uniforms: sqrt(1/12/5) = 0.129
