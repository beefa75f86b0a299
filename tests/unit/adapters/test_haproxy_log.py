"""HAProxy's HTTP log lines as timed requests, without HAProxy (the real one: tests/integration)."""

from __future__ import annotations

import socket

import pytest

from adapters.access_log import AccessLogTimer
from adapters.base import make_adapter
from adapters.haproxy import HAProxyAdapter
from adapters.haproxy_log import haproxy_requests, parse_http_log_line
from knapsack_lb.errors import InvalidInputError

# HAProxy 2.6's `option httplog` line in RFC 3164 framing, as it sends it over UDP
LINE = ('<134>Dec  5 01:40:00 haproxy[123]: 127.0.0.1:45678 [05/Dec/2026:01:40:00.123] fe klb/{server} '
        '0/0/1/{tr}/{ta} {status} 215 - - ---- 2/2/1/1/0 0/0 "GET / HTTP/1.1"')


def line(server: str = "b1", tr: int = 20, status: int = 200) -> str:
    return LINE.format(server=server, tr=tr, ta=max(tr, 0) + 1, status=status)


def test_an_http_log_line_gives_the_server_its_response_time_and_status() -> None:
    request = parse_http_log_line(line("b2", 37, 200))
    assert request is not None
    assert (request.backend, request.server, request.response_time, request.status) == ("klb", "b2", 0.037, 200)
    assert not request.failed
    assert parse_http_log_line(line("b2", -1, -1)).failed  # type: ignore[union-attr]  # no response came
    assert parse_http_log_line(line("b2", 5, 503)).failed  # type: ignore[union-attr]  # the server answered 5xx
    rfc5424 = '<134>1 2026-12-05T01:40:00.123Z host haproxy 123 - - ' + line("b3", 4).split(": ", 1)[1]
    assert parse_http_log_line(rfc5424).server == "b3"  # type: ignore[union-attr]
    logasap = line("b1", 9).replace("/10 200", "/+10 200")
    assert parse_http_log_line(logasap).response_time == 0.009  # type: ignore[union-attr]


def test_lines_that_time_no_request_of_a_server_are_not_requests() -> None:
    assert parse_http_log_line(line("<NOSRV>", -1, 503)) is None
    tcp = ('<134>Dec  5 01:40:00 haproxy[123]: 127.0.0.1:45678 [05/Dec/2026:01:40:00.123] fe klb/b1 '
           '0/0/5012 215 -- 1/1/0/0/0 0/0')  # option tcplog: Tw/Tc/Tt, no status
    assert parse_http_log_line(tcp) is None
    assert parse_http_log_line("Proxy fe started.") is None


def test_the_timer_reads_haproxys_lines_of_its_backend_only() -> None:
    timer = AccessLogTimer("127.0.0.1", 0, "klb", haproxy_requests)
    timer.feed(line("b1", 10).encode())
    timer.feed(line("b1", 10).replace("klb/", "other/").encode())  # another backend
    timer.feed(line("<NOSRV>", -1, 503).encode())
    assert timer.ignored == 2
    assert {server: t.successes for server, t in timer.times.take().items()} == {"b1": 1}


def test_log_listen_is_an_address_and_without_it_nothing_is_timed() -> None:
    with pytest.raises(InvalidInputError, match="log_listen"):
        make_adapter("haproxy", {"socket": "/run/haproxy.sock", "backend": "klb", "log_listen": "0.0.0.0:1 ;x"})
    plain = make_adapter("haproxy", {"socket": "/run/haproxy.sock", "backend": "klb"})
    assert isinstance(plain, HAProxyAdapter) and plain.timings() is None


def test_a_port_that_cannot_be_bound_is_reported_and_tried_again() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        adapter = make_adapter("haproxy", {"socket": "/run/haproxy.sock", "backend": "klb",
                                           "log_listen": f"127.0.0.1:{port}", "servers": {"web-1": "b1"}})
        assert isinstance(adapter, HAProxyAdapter)
        assert adapter.timings() is None and f"127.0.0.1:{port}" in adapter.last_error
    try:
        assert adapter.timings() == {}  # the port is free now: receiving starts
        assert adapter._log_timer is not None
        adapter._log_timer.feed(line("b1", 8).encode())
        timed = adapter.timings()
        assert timed is not None and list(timed) == ["web-1"]  # by DIP, through the server mapping
        assert (timed["web-1"].successes, timed["web-1"].latency_mean) == (1, 0.008)
    finally:
        adapter.close()
