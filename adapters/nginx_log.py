"""Nginx's access log lines as timed requests (received by :class:`adapters.access_log.AccessLogTimer`).

Nginx times every request it proxies: ``$upstream_response_time`` is the time from choosing the
server until its whole response was read, in seconds with millisecond resolution, and
``$upstream_status`` what the server answered. Open-source Nginx exposes neither per server
anywhere but in its access log, which it can send to a syslog server over UDP. The line format
the adapter reads is :data:`LOG_FORMAT`, declared once in ``http {}`` and logged where the
upstream is used::

    log_format knapsack_lb 'knapsack_lb $proxy_host "$upstream_addr" "$upstream_response_time" "$upstream_status"';
    access_log syslog:server=127.0.0.1:5141,nohostname knapsack_lb;

``$proxy_host`` names the upstream of ``proxy_pass http://<upstream>``, so one receiver can take
the lines of several upstreams and count only its own. Nginx retries a request on the next
server (``proxy_next_upstream``): the three lists then hold one entry per server tried, separated
by commas, and each try counts for its server (a try that failed is a failure of that server).
After an internal redirect to another location (``error_page``, ``X-Accel-Redirect``) the lists
hold one group per location, separated by `` : ``; only the last group is counted, the one
``$proxy_host`` names. Servers are named by the address Nginx connected to (``host:port``, IPv6
in brackets); a line where no server could be chosen (the upstream's name in
``$upstream_addr``) or whose lists do not line up is not a request. Layer 4 (``stream {}``) logs
sessions, not requests, and is not read.
"""

from __future__ import annotations

import math
import re

from adapters.access_log import LoggedRequest
from knapsack_lb.errors import InvalidInputError
from knapsack_lb.names import format_address, parse_address

LOG_FORMAT_NAME = "knapsack_lb"
LOG_FORMAT = f'{LOG_FORMAT_NAME} $proxy_host "$upstream_addr" "$upstream_response_time" "$upstream_status"'
ACCESS_LOG = re.compile(
    rf'{LOG_FORMAT_NAME} (?P<upstream>\S+) "(?P<addresses>[^"]*)" "(?P<times>[^"]*)" "(?P<statuses>[^"]*)"'
)


def _last_group(values: str) -> list[str]:
    return [value.strip() for value in values.split(" : ")[-1].split(",")]


def _address(value: str) -> str | None:
    try:
        return format_address(*parse_address("upstream_addr", value))
    except InvalidInputError:
        return None  # the upstream's name (no server could be chosen) or a UNIX socket


def parse_nginx_log_line(line: str) -> tuple[LoggedRequest, ...]:
    """Every try of one access log line in :data:`LOG_FORMAT` (empty when the line is not one)."""
    match = ACCESS_LOG.search(line)
    if match is None:
        return ()
    addresses, times, statuses = (_last_group(match[part]) for part in ("addresses", "times", "statuses"))
    if not len(addresses) == len(times) == len(statuses):
        return ()
    requests = []
    for address, seconds, status in zip(addresses, times, statuses, strict=True):
        server = _address(address)
        if server is None:
            return ()
        try:
            response_time = None if seconds == "-" else float(seconds)
        except ValueError:
            return ()
        if response_time is not None and not 0 <= response_time < math.inf:
            return ()
        code = int(status) if status.isdigit() else -1
        requests.append(LoggedRequest(match["upstream"], server, response_time, code))
    return tuple(requests)
