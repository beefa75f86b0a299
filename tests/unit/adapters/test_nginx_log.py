"""Nginx's access log lines in the adapter's format as timed requests, without Nginx (the real one:
tests/integration/test_nginx_adapter.py)."""

from __future__ import annotations

import socket

import pytest

from adapters.access_log import LoggedRequest, dips_by_address
from adapters.base import make_adapter
from adapters.nginx import NginxAdapter
from adapters.nginx_log import LOG_FORMAT, parse_nginx_log_line
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.lab.procs import free_port

# Nginx 1.22's access_log syslog:server=...,nohostname in LOG_FORMAT (RFC 3164 framing)
PREFIX = "<190>Dec  5 21:50:00 nginx: "


def line(addresses: str, times: str, statuses: str, upstream: str = "web") -> str:
    return f'{PREFIX}knapsack_lb {upstream} "{addresses}" "{times}" "{statuses}"'


def test_the_format_is_the_one_the_parser_reads() -> None:
    assert LOG_FORMAT == 'knapsack_lb $proxy_host "$upstream_addr" "$upstream_response_time" "$upstream_status"'


def test_one_request_to_one_server() -> None:
    assert parse_nginx_log_line(line("127.0.0.1:8081", "0.037", "200")) == (
        LoggedRequest("web", "127.0.0.1:8081", 0.037, 200),
    )
    assert parse_nginx_log_line(line("[::1]:8082", "0.004", "503"))[0].failed  # the server answered 5xx
    assert parse_nginx_log_line(line("10.0.0.3:80", "-", "-"))[0] == LoggedRequest("web", "10.0.0.3:80", None, -1)


def test_each_try_of_a_retried_request_counts_for_its_server() -> None:
    tries = parse_nginx_log_line(line("127.0.0.1:8081, 127.0.0.1:8082", "0.001, 0.020", "502, 200"))
    assert [(r.server, r.response_time, r.failed) for r in tries] == [
        ("127.0.0.1:8081", 0.001, True), ("127.0.0.1:8082", 0.020, False)]


def test_after_an_internal_redirect_only_the_last_group_counts() -> None:
    tries = parse_nginx_log_line(line("10.0.0.9:80 : 127.0.0.1:8081", "0.100 : 0.010", "404 : 200"))
    assert tries == (LoggedRequest("web", "127.0.0.1:8081", 0.010, 200),)


@pytest.mark.parametrize("text", [
    line("web", "-", "502"),  # no server could be chosen: the upstream's name
    line("unix:/run/app.sock", "0.002", "200"),
    line("127.0.0.1:8081, 127.0.0.1:8082", "0.001", "502, 200"),  # lists that do not line up
    line("127.0.0.1:8081", "inf", "200"),
    line("127.0.0.1:8081", "-0.5", "200"),
    line("127.0.0.1:8081", "soon", "200"),
    f'{PREFIX}127.0.0.1 - - [05/Dec/2026:21:50:00 +0000] "GET / HTTP/1.1" 200 5',  # the combined format
    "",
])
def test_lines_that_are_not_requests_to_a_server(text: str) -> None:
    assert parse_nginx_log_line(text) == ()


def test_dips_are_found_by_the_address_nginx_connected_to() -> None:
    dip_at = dips_by_address({"dip-1": "127.0.0.1:8081", "dip-2": "[::1]:8082", "dip-3": "localhost:8083"})
    assert dip_at["127.0.0.1:8081"] == "dip-1" and dip_at["[::1]:8082"] == "dip-2"
    assert dip_at["localhost:8083"] == dip_at["127.0.0.1:8083"] == "dip-3"  # a hostname, resolved


def test_the_adapter_times_its_dips_from_the_lines_of_its_upstream() -> None:
    settings = {"include_file": "/etc/nginx/klb/web.conf", "config": "/etc/nginx/nginx.conf", "upstream": "web",
                "servers": {"dip-1": "127.0.0.1:8081", "dip-2": "127.0.0.1:8082"}}
    plain = make_adapter("nginx", settings)
    assert isinstance(plain, NginxAdapter) and plain.timings() is None
    with pytest.raises(InvalidInputError, match="log_listen"):
        make_adapter("nginx", {**settings, "log_listen": "127.0.0.1:1 ;x"})
    adapter = make_adapter("nginx", {**settings, "log_listen": f"127.0.0.1:{free_port(kind=socket.SOCK_DGRAM)}"})
    assert isinstance(adapter, NginxAdapter)
    try:
        assert adapter.timings() == {}  # the first call starts the receiver
        assert adapter._log_timer is not None
        for text in (line("127.0.0.1:8081", "0.010", "200"), line("127.0.0.1:8081, 127.0.0.1:8082", "0.002, 0.030",
                     "502, 200"), line("127.0.0.1:8099", "0.010", "200"), line("127.0.0.1:8082", "0.5", "200", "api")):
            adapter._log_timer.feed(text.encode())
        timed = adapter.timings()
        assert timed is not None and set(timed) == {"dip-1", "dip-2"}  # 8099 is no DIP; "api" another upstream
        assert (timed["dip-1"].successes, timed["dip-1"].failures, timed["dip-1"].latency_mean) == (1, 1, 0.010)
        assert (timed["dip-2"].successes, timed["dip-2"].latency_mean) == (1, 0.030)
    finally:
        adapter.close()
