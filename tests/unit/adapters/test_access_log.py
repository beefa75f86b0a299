"""The access log receiver: what it keeps of each server's requests, over a real UDP socket."""

from __future__ import annotations

import socket
import time

import pytest

from adapters.access_log import AccessLogTimer, LoggedRequest


def _requests(line: str) -> tuple[LoggedRequest, ...]:
    """A line format of the tests' own: ``backend server milliseconds|- status`` per request, ``;`` between."""
    requests = []
    for part in line.split(";"):
        if len(part.split()) != 4:
            return ()
        backend, server, ms, status = part.split()
        requests.append(LoggedRequest(backend, server, None if ms == "-" else int(ms) / 1000.0, int(status)))
    return tuple(requests)


def test_the_timer_keeps_each_servers_count_mean_spread_and_failures_until_taken() -> None:
    timer = AccessLogTimer("127.0.0.1", 0, "klb", _requests)
    try:
        for ms in (10, 20, 30):
            timer.feed(f"klb b1 {ms} 200".encode())
        timer.feed(b"klb b2 5 502;klb b2 40 200")  # a retry: each try counts for its server
        timer.feed(b"klb b2 - -1")  # no response came
        timer.feed(b"other b1 10 200")  # another backend
        timer.feed(b"\xff garbage")
        assert timer.ignored == 2
        taken = timer.take()
        assert set(taken) == {"b1", "b2"}
        b1, b2 = taken["b1"], taken["b2"]
        assert (b1.successes, b1.failures) == (3, 0)
        assert b1.latency_mean == pytest.approx(0.020) and b1.latency_std == pytest.approx(0.010)
        assert (b2.successes, b2.failures, b2.latency_mean, b2.latency_std) == (1, 2, 0.040, None)
        assert timer.take() == {}  # each take counts from the one before
    finally:
        timer.close()


def test_the_timer_receives_datagrams_on_its_port_and_stops() -> None:
    timer = AccessLogTimer("127.0.0.1", 0, "klb", _requests).start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for _ in range(5):
                sender.sendto(b"klb b1 12 200", ("127.0.0.1", timer.port))
            sender.sendto(b"\xff not a line", ("127.0.0.1", timer.port))  # never ends the receiver
            sender.sendto(b"klb b1 12 200", ("127.0.0.1", timer.port))
        deadline, received = time.monotonic() + 5.0, 0
        while received < 6 and time.monotonic() < deadline:
            received += sum(t.successes for t in timer.take().values())
            time.sleep(0.02)
        assert received == 6
    finally:
        timer.close()
    assert not timer.running


def test_a_port_that_cannot_be_bound_is_an_error_naming_it_and_the_next_poll_tries_again() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        timer = AccessLogTimer("127.0.0.1", port, "klb", _requests, lb="Nginx")
        assert timer.poll(str) is None
        assert timer.error.startswith(f"cannot receive Nginx's logs on log_listen 127.0.0.1:{port}: ")
    try:
        assert timer.poll(str) == {} and timer.running
        timer.feed(b"klb b1 12 200")
        timer.feed(b"klb b9 12 200")
        assert list(timer.poll({"b1": "dip-1"}.get) or {}) == ["dip-1"]  # servers of no DIP are left out
    finally:
        timer.close()
