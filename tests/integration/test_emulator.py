"""The backend emulator over real sockets: headers, keep-alive, failures, admin, subprocess."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knapsack_lb.lab.procs import ManagedProcess, free_listening_port, wait_for_port
from knapsack_lb.lab.testbed.emulator import Emulator, EmulatorConfig, EmulatorFleet
from knapsack_lb.lab.testbed.realtime import scheduler_name


def _conn(address: str) -> http.client.HTTPConnection:
    host, port = address.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=5)


def _get(conn: http.client.HTTPConnection, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path)
    response = conn.getresponse()
    body = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def test_responses_carry_backend_inflight_and_server_latency_on_one_connection() -> None:
    with EmulatorFleet([EmulatorConfig("dip-a", service_time=0.01, distribution="fixed")]) as fleet:
        conn = _conn(fleet.addresses["dip-a"])
        for _ in range(5):
            start = time.perf_counter()
            status, headers, body = _get(conn, "/work")
            elapsed = time.perf_counter() - start
            assert status == 200 and body == b"ok\n"
            assert headers["x-backend"] == "dip-a"
            assert headers["x-inflight"] == "1"
            server_latency = float(headers["x-server-latency"])
            assert 0.0095 <= server_latency <= elapsed
        stats = fleet.stats("dip-a")
        assert stats.successes == 5 and stats.connections == 1  # keep-alive: one connection
        assert stats.work_seconds == pytest.approx(0.05)
        assert stats.busy_seconds >= 0.05
        status, _, body = _get(conn, "/health")
        assert status == 200 and fleet.stats("dip-a").requests == 5  # health checks do no work
        status, _, body = _get(conn, "/stats")
        assert json.loads(body)["successes"] == 5


def test_fast_and_slow_failures_differ_in_latency() -> None:
    configs = [
        EmulatorConfig("fast", failure_probability=1.0, failure_mode="fast", service_time=0.01),
        EmulatorConfig("slow", failure_probability=1.0, failure_mode="slow", failure_delay=0.1, service_time=0.01),
    ]
    with EmulatorFleet(configs) as fleet:
        status, headers, _ = _get(_conn(fleet.addresses["fast"]), "/")
        assert status == 503 and float(headers["x-server-latency"]) < 0.01
        status, headers, _ = _get(_conn(fleet.addresses["slow"]), "/")
        assert status == 503 and float(headers["x-server-latency"]) >= 0.1
        assert fleet.stats("fast").fast_failures == 1 and fleet.stats("slow").slow_failures == 1


def test_admin_capacity_slows_service_and_bad_values_are_refused() -> None:
    with EmulatorFleet([EmulatorConfig("dip", service_time=0.05, distribution="fixed")]) as fleet:
        conn = _conn(fleet.addresses["dip"])
        status, _, body = _get(conn, "/admin/capacity?factor=0.5", method="POST")
        assert status == 200 and json.loads(body)["capacity"] == 0.5
        _, headers, _ = _get(conn, "/")
        assert float(headers["x-server-latency"]) >= 0.1
        assert _get(conn, "/admin/capacity?factor=-1", method="POST")[0] == 400
        assert _get(conn, "/admin/capacity", method="POST")[0] == 400
        assert _get(conn, "/admin/capacity?factor=2", method="GET")[0] == 405
        fleet.set_capacity("dip", 1.0)
        _, headers, _ = _get(conn, "/")
        assert 0.05 <= float(headers["x-server-latency"]) < 0.1


def test_connection_close_is_honoured() -> None:
    with EmulatorFleet([EmulatorConfig("dip", service_time=0.0)]) as fleet:
        conn = _conn(fleet.addresses["dip"])
        conn.request("GET", "/", headers={"Connection": "close"})
        response = conn.getresponse()
        assert response.getheader("Connection") == "close"
        response.read()
        assert response.will_close


def test_runs_as_a_subprocess_and_stops_on_sigterm(tmp_path: object) -> None:
    port = free_listening_port()
    argv = [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", "sub", "--port", str(port),
            "--mode", "ps", "--service-time", "0.005", "--distribution", "lognormal", "--duration", "30"]
    with ManagedProcess(argv) as proc:
        wait_for_port("127.0.0.1", port)
        status, headers, _ = _get(_conn(f"127.0.0.1:{port}"), "/")
        assert status == 200 and headers["x-backend"] == "sub"
        proc.stop()
        assert proc.process is not None and proc.process.returncode == 0


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="needs sched_getscheduler (Linux)")
def test_realtime_priority_is_applied_or_refused_with_a_warning(tmp_path: Path) -> None:
    port = free_listening_port()
    log = tmp_path / "emulator.log"
    argv = [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", "rt", "--port", str(port),
            "--service-time", "0.002", "--distribution", "fixed", "--spin-limit", "0.0005",
            "--realtime-priority", "5", "--duration", "30"]
    with ManagedProcess(argv, log_path=log) as proc:
        wait_for_port("127.0.0.1", port)
        conn = _conn(f"127.0.0.1:{port}")
        assert _get(conn, "/")[0] == 200
        reported = json.loads(_get(conn, "/stats")[2])["scheduler"]
        # /stats tells the truth the kernel knows, and a refusal is never silent.
        assert reported == scheduler_name(proc.pid)
        if reported == "fifo":
            assert os.sched_getparam(proc.pid).sched_priority == 5
        else:
            assert "--realtime-priority 5 not applied" in log.read_text()
        proc.stop()
    if _realtime_allowed():
        assert reported == "fifo"


def _realtime_allowed() -> bool:
    """Whether this process could switch to SCHED_FIFO (tried in a child, so the test itself stays ordinary)."""
    probe = subprocess.run([sys.executable, "-c", "from knapsack_lb.lab.testbed.realtime import request_realtime as r; "
                            "import sys; sys.exit(1 if r(1) else 0)"], check=False, timeout=30)
    return probe.returncode == 0


@pytest.mark.parametrize("bad", ["0", "100", "high", "5.5"])
def test_a_bad_realtime_priority_is_refused_naming_the_flag(bad: str) -> None:
    argv = [sys.executable, "-m", "knapsack_lb.lab.testbed.emulator", "--name", "rt", "--realtime-priority", bad]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert f"--realtime-priority must be an integer in 1-99, got '{bad}'" in result.stderr


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="failure probability"):
        EmulatorConfig("x", failure_probability=1.5)
    with pytest.raises(ValueError, match="name"):
        EmulatorConfig("bad name")


def test_pipelined_requests_are_answered_in_order() -> None:
    import socket

    with EmulatorFleet([EmulatorConfig("dip", service_time=0.001, distribution="fixed", body=b"wk\n")]) as fleet:
        host, port = fleet.addresses["dip"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            requests = b"".join(
                f"GET /{'health' if i % 2 else 'work'}?n={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(2000)
            )
            sock.sendall(requests)
            received = b""
            while received.count(b"HTTP/1.1 200") < 2000:
                chunk = sock.recv(65536)
                assert chunk
                received += chunk
        bodies = [part.split(b"\r\n\r\n", 1)[1][:3] for part in received.split(b"HTTP/1.1 ")[1:]]
        assert bodies == [b"wk\n", b"ok\n"] * 1000  # work and health alternate, as sent
        stats = fleet.stats("dip")
        assert stats.successes == 1000 and stats.health_checks == 1000


@pytest.mark.parametrize(("mode", "expected"), [("ps", [0.1, 0.1]), ("fcfs", [0.05, 0.1])])
def test_concurrent_requests_share_or_queue_by_mode(mode: str, expected: list[float]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    config = EmulatorConfig("dip", mode=mode, service_time=0.05, distribution="fixed")  # type: ignore[arg-type]
    with EmulatorFleet([config]) as fleet:
        address = fleet.addresses["dip"]

        def one(_: int) -> float:
            return float(_get(_conn(address), "/")[1]["x-server-latency"])

        with ThreadPoolExecutor(2) as pool:
            latencies = sorted(pool.map(one, range(2)))
        # Arrivals are a little apart, so allow for the gap between them.
        assert latencies[0] == pytest.approx(expected[0], abs=0.03)
        assert latencies[1] == pytest.approx(expected[1], abs=0.03)
        assert fleet.stats("dip").busy_seconds == pytest.approx(0.1, abs=0.03)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
@pytest.mark.usefixtures("kernel_stamping")
async def test_service_starts_when_the_request_reaches_the_socket_not_when_it_is_read() -> None:
    """The emulator's loop is busy for 30 ms after a request arrives: the injected 50 ms still
    run from the request's arrival (kernel receive timestamp), and X-Server-Latency counts the wait."""
    import asyncio
    import socket
    import threading

    emulator = Emulator(EmulatorConfig("late", service_time=0.05, distribution="fixed"))
    port = await emulator.start("127.0.0.1", 0)
    go = threading.Event()
    result: dict[str, float] = {}

    def client() -> None:
        go.wait(5)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # the kernel accepts it
            start = time.perf_counter()
            sock.sendall(b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while not reply.endswith(b"ok\n"):
                reply += sock.recv(65536)
            result["elapsed"] = time.perf_counter() - start
            result["server"] = float(reply.split(b"X-Server-Latency: ")[1].split(b"\r\n")[0])

    thread = threading.Thread(target=client)
    thread.start()
    try:
        go.set()
        time.sleep(0.03)  # the emulator's loop is busy: the request arrives but is not read yet
        await asyncio.to_thread(thread.join, 5)
    finally:
        await emulator.stop()
    assert result["elapsed"] == pytest.approx(0.05, abs=0.015)  # not 0.05 + most of the 0.03
    assert 0.05 <= result["server"] <= result["elapsed"]


def test_a_light_probe_does_its_fixed_work_queues_behind_a_busy_worker_and_bad_work_is_refused() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with EmulatorFleet([EmulatorConfig("dip", service_time=0.1, distribution="fixed")]) as fleet:
        address = fleet.addresses["dip"]
        status, headers, body = _get(_conn(address), "/light?work=0.002")
        assert status == 200 and 0.002 <= float(headers["x-server-latency"]) < 0.05
        assert _get(_conn(address), "/light")[0] == 200  # default: 1 % of the mean, 1 ms here

        def busy(_: int) -> int:
            return _get(_conn(address), "/work")[0]

        with ThreadPoolExecutor(1) as pool:
            request = pool.submit(busy, 0)
            time.sleep(0.03)  # the request holds the only worker for 0.1 s
            _, headers, _ = _get(_conn(address), "/light?work=0.002")
            assert request.result() == 200
        assert float(headers["x-server-latency"]) >= 0.05  # it waited for the worker
        stats = fleet.stats("dip")
        assert stats.light_probes == 3 and stats.requests == 1 and stats.successes == 1
        assert stats.light_work_seconds == pytest.approx(0.005)
        for bad in ("-1", "2", "inf", "nan", "x%3Bid"):
            status, _, body = _get(_conn(address), f"/light?work={bad}")
            assert status == 400 and b"'work'" in body
