"""The store on a real Redis Cluster when things go wrong: a master SIGKILLed while rounds are being
written (its replica is promoted and the store resumes; the probe worker's buffer keeps every
round it could not write meanwhile), a VIP's slot resharded to another master under the store
(ASK, then MOVED), `klb run` learning and planning on a cluster, and the three ways the setting can point at
the wrong thing (nothing answers, a cluster with slots and no live master, a plain Redis), each
named by `klb check` and by a starting process with the setting and the URL.

The behavioural suite that runs on one Redis and on the cluster alike is test_store_redis.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.crc import key_slot

from knapsack_lb.cli.service_commands import run_checks
from knapsack_lb.config import parse_config
from knapsack_lb.errors import InvalidInputError, StoreUnavailableError
from knapsack_lb.lab.procs import RedisClusterServers, RedisServer, free_cluster_port
from knapsack_lb.lab.testbed.emulator import EmulatorConfig, EmulatorFleet
from knapsack_lb.model import DipConfig, Measurement, ProbeSpec, VipConfig, WeightPlan
from knapsack_lb.store.redis import STORE_RETRIES, RedisLatencyStore
from probes.worker import ProbeWorker, ProbeWorkerOptions
from tests.integration.processes import counts, klb, terminate, wait_until, write_config
from tests.integration.test_store_redis import CountingBackoff, measurement, vip_config

DIPS = ("d1", "d2", "d3")


def _cluster_store(cluster: RedisClusterServers, **options: Any) -> RedisLatencyStore:
    nodes = [(cluster.host, port) for port in cluster.ports[1:]]
    return RedisLatencyStore.from_url(cluster.url, namespace="f" + uuid.uuid4().hex[:8], cluster=True,
                                      startup_nodes=nodes, **options)


def _caught_up(cluster: RedisClusterServers, master: int, replica: int, timeout: float = 10.0) -> None:
    """Until ``replica`` has applied everything ``master`` had written when this was called (its
    ``slave_repl_offset`` reaches the master's ``master_repl_offset``)."""
    target = int(cluster.info(master, "replication")["master_repl_offset"])
    deadline = time.monotonic() + timeout
    while int(cluster.info(replica, "replication").get("slave_repl_offset", -1)) < target:
        assert time.monotonic() < deadline, f"the replica on {replica} did not catch up with {master} in {timeout} s"
        time.sleep(0.02)


def _master_of_vip(cluster: RedisClusterServers, vip: str) -> int:
    """Port of the master serving the slot of ``vip``'s keys (hash tag ``{vip}``)."""
    slot = key_slot(vip.encode())
    live = next(p for p in cluster.ports if cluster.alive(p))
    for line in cluster.cli(live, "cluster", "nodes").splitlines():
        fields = line.split()
        if "master" not in fields[2] or "fail" in fields[2]:
            continue
        for part in fields[8:]:
            low, _, high = part.partition("-")
            if low.isdigit() and int(low) <= slot <= int(high or low):
                return int(fields[1].split("@")[0].rsplit(":", 1)[1])
    raise AssertionError(f"no live master serves slot {slot}")


@pytest.mark.slow
@pytest.mark.parametrize("fresh_redis_cluster", [1000, 4000], indirect=True, ids=["node-timeout-1s", "node-timeout-4s"])
async def test_a_master_killed_while_rounds_are_written_is_replaced_and_the_store_resumes(
    fresh_redis_cluster: RedisClusterServers,
) -> None:
    """With a 1 s node timeout the promotion (about 2 s) mostly fits in the client's own retries:
    writes stall, then succeed. With 4 s it does not: writes fail, and only ever with
    StoreUnavailableError (what the probe worker buffers on), until the replica takes over."""
    cluster = fresh_redis_cluster
    # every round is kept: the count below is of rounds the failover lost, not of rounds retention trimmed (a slow
    # promotion lets the writer store more than the default 120 rounds, and the oldest would go; its round times
    # advance by 1 a write, failed ones too, so they also pass the default 600 s of age during a slow promotion)
    store = _cluster_store(cluster, socket_timeout=0.5, retention_count=100_000, retention_seconds=1e9)
    written: list[float] = []  # round times the store acknowledged
    failures: list[BaseException] = []
    longest_write = 0.0
    stop = asyncio.Event()

    async def write_rounds() -> None:
        nonlocal longest_write
        t = 0.0
        while not stop.is_set():
            t += 1.0
            started = time.monotonic()
            try:
                await store.put_measurements([measurement(dip, t) for dip in DIPS])
                written.append(t)
            except Exception as exc:  # every failure is recorded; the test checks its type
                failures.append(exc)
            longest_write = max(longest_write, time.monotonic() - started)
            await asyncio.sleep(0.02)

    async def role(port: int) -> str | None:
        return (await asyncio.to_thread(cluster.info, port, "replication")).get("role")

    try:
        await store.put_vip(vip_config())
        await store.put_plan(WeightPlan(vip="web", weights={"d1": 0.5, "d2": 0.5}, version=1))
        master = _master_of_vip(cluster, "web")
        (replica,) = cluster.replica_ports(master)
        writer = asyncio.create_task(write_rounds())
        while len(written) < 20:
            await asyncio.sleep(0.02)
        # a replica still on its first sync has nothing to lose yet: the rounds at stake are ones it had
        await asyncio.to_thread(_caught_up, cluster, master, replica)
        await asyncio.to_thread(cluster.kill, master)
        killed_after = len(written)
        killed_at = time.monotonic()
        deadline = killed_at + 60
        while await role(replica) != "master":  # promoted after about two node timeouts
            assert time.monotonic() < deadline, "the replica was not promoted"
            await asyncio.sleep(0.1)
        promoted_in = time.monotonic() - killed_at
        promoted_after = len(written)
        while len(written) < promoted_after + 20:
            assert time.monotonic() < deadline, f"no writes after the failover; failures: {failures[-3:]}"
            await asyncio.sleep(0.05)
        stop.set()
        await writer
        assert all(isinstance(f, StoreUnavailableError) for f in failures), failures[:5]
        if cluster.node_timeout_ms >= 4000:
            assert failures, f"no write failed although the promotion took {promoted_in:.1f} s"
        assert longest_write < promoted_in + 5.0  # a write never hangs much beyond the failover
        assert _master_of_vip(cluster, "web") == replica

        # Every round acknowledged after the promotion is there; of those acknowledged before the
        # kill, the last few may be lost (asynchronous replication: docs/store.md).
        stored = {m.time for m in await store.measurements("web", "d1")}
        assert set(written[promoted_after:]) <= stored
        kept = len(stored & set(written[:killed_after]))
        assert kept >= killed_after - 5, (f"{kept} of the {killed_after} rounds before the kill kept; promoted in "
                                          f"{promoted_in:.1f} s, last round {written[-1]:.0f}, oldest stored "
                                          f"{min(stored, default=None)}, {len(failures)} failed writes")
        snapshot = await store.snapshot("web")
        assert snapshot.latest["d1"].time == written[-1] and snapshot.config == vip_config()
        await store.put_plan(WeightPlan(vip="web", weights={"d1": 1.0}, version=2))
        assert [p.version for p in await store.plan_history("web")] == [1, 2]
        assert await store.acquire_lease("controllers", "web", "c1", ttl=5.0)
        assert await store.lease_owner("controllers", "web") == "c1"
    finally:
        stop.set()
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("fresh_redis_cluster", [4000], indirect=True, ids=["node-timeout-4s"])
async def test_the_probe_worker_buffers_through_a_failover_and_loses_no_round_it_started_after_the_kill(
    fresh_redis_cluster: RedisClusterServers,
) -> None:
    cluster = fresh_redis_cluster
    store = _cluster_store(cluster, socket_timeout=0.5)
    interval = 0.3
    with EmulatorFleet([EmulatorConfig(d, service_time=0.001) for d in ("d1", "d2")]) as fleet:
        config = VipConfig(name="web", dips=tuple(DipConfig(name=d, address=a) for d, a in fleet.addresses.items()),
                           probe=ProbeSpec(requests_per_round=5, interval=interval))
        await store.put_vip(config)
        worker = ProbeWorker(store, ProbeWorkerOptions(worker_id="w1", backoff_initial=0.05, backoff_max=0.2))
        produced: list[Measurement] = []
        original = worker.probe_round

        async def recording_round(vip: str) -> list[Measurement]:
            measurements = await original(vip)
            produced.extend(measurements)
            return measurements

        worker.probe_round = recording_round  # type: ignore[method-assign]
        stop = asyncio.Event()
        running = asyncio.ensure_future(worker.run(stop))
        try:
            deadline = time.monotonic() + 30
            while len(await store.measurements("web", "d1")) < 2:
                assert time.monotonic() < deadline, "the worker wrote no rounds"
                await asyncio.sleep(0.05)
            master = _master_of_vip(cluster, "web")
            await asyncio.to_thread(cluster.kill, master)
            killed_at = time.time()
            while worker.stats.store_errors == 0 or not worker.buffer:
                assert time.monotonic() < deadline, "the store never failed during the failover"
                await asyncio.sleep(0.05)
            while worker.buffer or worker.stats.store_errors == 0:
                assert time.monotonic() < deadline + 30, "the buffer was not flushed after the failover"
                await asyncio.sleep(0.05)
            await asyncio.sleep(2 * interval)
        finally:
            stop.set()
            stats = await running
        try:
            assert stats.dropped_rounds == 0
            stored = {(m.dip, m.time) for m in await store.measurements("web")}
            during = [(m.dip, m.time) for m in produced if m.time > killed_at]
            assert len(during) >= 4
            assert [r for r in during if r not in stored] == []
        finally:
            await store.close()


async def test_a_vip_slot_moved_to_another_master_under_the_store_loses_nothing(
    fresh_redis_cluster: RedisClusterServers,
) -> None:
    """Resharding (redis-cli --cluster reshard does these steps): while the VIP's slot is migrating the
    cluster client follows ASK redirections, after it moved it follows MOVED; a plain client sent to
    the old master gets ASK, which is unavailability, not a crash."""
    cluster = fresh_redis_cluster
    slot = key_slot(b"web")
    source = _master_of_vip(cluster, "web")
    target = next(p for p in cluster.master_ports() if p != source)
    source_id, target_id = (cluster.cli(p, "cluster", "myid").strip() for p in (source, target))
    store = _cluster_store(cluster)
    plain = RedisLatencyStore.from_url(f"redis://127.0.0.1:{source}/0", namespace=store.namespace)
    try:
        await store.put_measurements([measurement("d1", 1.0)])
        await store.put_plan(WeightPlan(vip="web", weights={"d1": 1.0}, version=1))
        assert cluster.cli(target, "cluster", "setslot", str(slot), "importing", source_id).strip() == "OK"
        assert cluster.cli(source, "cluster", "setslot", str(slot), "migrating", target_id).strip() == "OK"

        await store.put_vip(vip_config())  # a new key of a migrating slot: written on the target (ASK)
        await store.put_measurements([measurement("d1", 2.0), measurement("d2", 2.0)])
        snapshot = await store.snapshot("web")
        assert snapshot.config == vip_config() and snapshot.current_plan is not None
        assert {d: m.time for d, m in snapshot.latest.items()} == {"d1": 2.0, "d2": 2.0}
        with pytest.raises(StoreUnavailableError, match="AskError"):
            await plain.get_vip("web")

        keys = cluster.cli(source, "cluster", "getkeysinslot", str(slot), "1000").split()
        assert keys, "the slot's keys were all on the target already"
        cluster.cli(source, "migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys)
        for port in (target, source):
            assert cluster.cli(port, "cluster", "setslot", str(slot), "node", target_id).strip() == "OK"
        assert _master_of_vip(cluster, "web") == target

        assert [m.time for m in await store.measurements("web", "d1")] == [1.0, 2.0]  # MOVED, then the target
        await store.put_plan(WeightPlan(vip="web", weights={"d2": 1.0}, version=2))
        assert [p.version for p in await store.plan_history("web")] == [1, 2]
        assert await store.list_vips() == ["web"]
    finally:
        await plain.close()
        await store.close()


@pytest.mark.slow
def test_klb_run_learns_and_plans_on_a_cluster_and_stops_cleanly(redis_cluster: RedisClusterServers,
                                                                   tmp_path: Path) -> None:
    configs = [EmulatorConfig(name=f"dip{i}", mode="ps", service_time=0.002, distribution="fixed") for i in (1, 2)]
    with EmulatorFleet(configs) as fleet:
        path = write_config(tmp_path, redis_cluster.url, fleet)
        raw = yaml.safe_load(path.read_text())
        raw["redis"].update(cluster=True, startup_nodes=redis_cluster.startup_nodes,
                            namespace=f"run{uuid.uuid4().hex[:6]}")
        path.write_text(yaml.safe_dump(raw))
        settings = parse_config(raw).redis

        def stored() -> tuple[int, int]:
            async def read() -> tuple[int, int]:
                store = RedisLatencyStore.from_settings(settings)
                try:
                    return await counts(store)
                finally:
                    await store.close()
            return asyncio.run(read())

        run = klb("run", "--config", str(path))
        try:
            found = wait_until(stored, lambda c: c[0] >= 4 and c[1] >= 1, timeout=90)
        finally:
            code, out = terminate(run)
        assert found[0] >= 4 and found[1] >= 1, (found, out[-2000:])
        assert code == 0, out[-2000:]
        assert stored()[1] >= found[1]


def _config_file(tmp_path: Path, redis: dict[str, object]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"redis": {"namespace": "start", **redis}, "api": {"enabled": False}}))
    return path


def _start(tmp_path: Path, command: str, config: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """``klb <command> --config`` with its output in a file, so the test can read it while it runs."""
    log = tmp_path / f"{command}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "knapsack_lb.cli.main", command, "--config", str(config)],
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, log


def _output_once(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    """The process's output as soon as it contains ``text`` (or the process ended, or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        output = " ".join(log.read_text(errors="replace").split())  # rich wraps long lines
        if text in output or process.poll() is not None:
            return output
        time.sleep(0.2)
    return " ".join(log.read_text(errors="replace").split())


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.terminate()
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


async def _redis_check(redis: dict[str, object]) -> tuple[bool, str]:
    items = await run_checks(parse_config({"redis": redis}))
    (item,) = [i for i in items if i.what == "redis"]
    return item.ok, item.detail


async def test_a_plain_redis_configured_as_a_cluster_is_refused_naming_the_setting_and_url(
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    ok, detail = await _redis_check({"url": redis_server.url, "cluster": True})
    assert not ok and "redis.cluster" in detail and redis_server.url in detail and "not a cluster node" in detail

    probe, log = _start(tmp_path, "probe", _config_file(tmp_path, {"url": redis_server.url, "cluster": True}))
    try:
        assert probe.wait(timeout=60) == 2  # no retry fixes a wrong setting: the process does not start
    finally:
        _stop(probe)
    output = _output_once(log, "redis.cluster", probe)
    assert "redis.cluster" in output and redis_server.url in output, output


async def test_a_cluster_node_configured_as_one_redis_is_named_and_its_redirections_are_unavailability(
    redis_cluster: RedisClusterServers,
) -> None:
    ok, detail = await _redis_check({"url": redis_cluster.url})
    assert not ok and "redis.cluster" in detail and redis_cluster.url in detail and "cluster_enabled:1" in detail

    store = RedisLatencyStore.from_url(redis_cluster.url, namespace="plain")
    try:
        with pytest.raises(StoreUnavailableError, match="MovedError"):  # some VIP's slot lives on another node
            for vip in ("a", "b", "c", "d", "e", "f", "g", "h"):
                await store.get_vip(vip)
        with pytest.raises(InvalidInputError, match=r"redis\.cluster"):
            await store.verify()
    finally:
        await store.close()


async def test_a_cluster_that_is_down_is_named_by_check_and_at_start(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_cluster_port()}/0"
    settings = {"url": url, "cluster": True, "startup_nodes": [f"127.0.0.1:{free_cluster_port()}"]}
    ok, detail = await _redis_check(settings)
    assert not ok and "redis.url" in detail and url in detail and "cannot be connected" in detail

    store = RedisLatencyStore.from_settings(parse_config({"redis": settings}).redis)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.list_vips()
        assert await store.ping() is False
    finally:
        await store.close()

    controller, log = _start(tmp_path, "controller", _config_file(tmp_path, settings))
    try:
        output = _output_once(log, "service starting", controller)
        assert controller.poll() is None, output  # it runs and retries, as through any outage
    finally:
        code = _stop(controller)
    assert "latency store not ready" in output and "redis.url" in output and url in output, output
    assert code == 0


async def test_a_cluster_with_slots_and_no_live_master_is_named_by_check_and_at_start(
    fresh_redis_cluster: RedisClusterServers, tmp_path: Path,
) -> None:
    cluster = fresh_redis_cluster
    master = cluster.master_ports()[-1]
    for port in [master, *cluster.replica_ports(master)]:
        cluster.kill(port)
    survivor = next(p for p in cluster.ports if cluster.alive(p))
    cluster.wait_for_state(survivor, "fail")
    settings = {"url": f"redis://127.0.0.1:{survivor}/0", "cluster": True}
    ok, detail = await _redis_check(settings)
    assert not ok and "redis.url" in detail and settings["url"] in detail and "cluster_state:fail" in detail, detail
    assert detail.count("redis.url") == 1, detail  # said once, not wrapped again on the way out

    store = RedisLatencyStore.from_settings(parse_config({"redis": settings}).redis)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.put_vip(vip_config())
    finally:
        await store.close()
    backoff = CountingBackoff()  # the store's policy, its waits counted: a wait before each retry
    store = RedisLatencyStore.from_url(str(settings["url"]), cluster=True, retry=Retry(backoff, STORE_RETRIES))
    try:
        for calls in (1, 2):  # every call, not only the first
            with pytest.raises(StoreUnavailableError):
                await store.put_vip(vip_config())
            assert backoff.computed == calls * STORE_RETRIES
    finally:
        await store.close()

    for command in ("probe", "controller"):  # each starts anyway, and stops in time though every store call hangs
        service, log = _start(tmp_path, command, _config_file(tmp_path, settings))
        try:
            output = _output_once(log, "service starting", service)
            assert service.poll() is None, output
            time.sleep(1.0)  # a store call in flight when the stop comes
        finally:
            code = _stop(service)
        assert "cluster_state:fail" in output and "redis.url" in output and str(settings["url"]) in output, output
        assert code == 0, (command, log.read_text(errors="replace"))


def test_every_multi_key_operation_stays_in_one_slot() -> None:
    """The keys each Lua script and the one MULTI/EXEC touch hash to one slot (what a cluster requires)."""
    store = RedisLatencyStore.from_url("redis://127.0.0.1:1/0", cluster=True)
    assert isinstance(store.client, RedisCluster)
    groups = [
        [store._vk("web", "plan"), store._vk("web", "plans")],  # put_plan's fence
        store._status_keys("probe"),  # put_status, statuses
        [store._vk("web", s) for s in ("config", "latest", "plan", "curves", "state", "remeasure", "lb", "mdips",
                                    "budget")]
        + [store._mkey("web", "d1")],  # snapshot, delete_vip's one DEL
    ]
    for keys in groups:
        assert len({key_slot(k.encode()) for k in keys}) == 1, keys


def test_klb_probe_redis_cluster_option_runs_on_a_cluster_and_refuses_a_plain_redis(
    redis_cluster: RedisClusterServers, redis_server: RedisServer,
) -> None:
    from typer.testing import CliRunner

    from knapsack_lb.cli.probe_main import app

    common = ["--redis-cluster", "--namespace", "cli" + uuid.uuid4().hex[:6], "--worker-id", "w1"]
    refused = CliRunner().invoke(app, ["--redis", redis_server.url, *common, "--duration", "1"])
    assert refused.exit_code == 2
    output = " ".join(refused.output.split())
    assert "redis.cluster" in output and redis_server.url in output, output
    ran = CliRunner().invoke(app, ["--redis", redis_cluster.url, *common, "--duration", "0.5"])
    assert ran.exit_code == 0, ran.output
