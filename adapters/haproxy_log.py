"""HAProxy's HTTP log lines as timed requests (received by :class:`adapters.access_log.AccessLogTimer`).

A layer-7 HAProxy times every request it forwards: ``Tr`` in its HTTP log line (``option
httplog``) is the time from sending the request to the server until the server's response
headers came back, in milliseconds. The runtime API has only ``rtime``, a mean over a server's
last 1024 requests that lags a weight change by thousands of requests; the log has each request.
With ``log <host:port> local0`` and ``option httplog`` in the operator's configuration, the
adapter receives the lines on ``log_listen``.

The line format is HAProxy's HTTP log (``option httplog``, HAProxy 1.9 and later): after the
date, ``frontend backend/server TR/Tw/Tc/Tr/Ta status ...``, in any syslog framing (RFC 3164 or
5424). A TCP log line (layer 4, ``option tcplog``) has three timers and no status and is not
counted: at layer 4 HAProxy times no request.
"""

from __future__ import annotations

import re

from adapters.access_log import LoggedRequest

HTTP_LOG = re.compile(
    r" (?P<backend>[^\s/]+)/(?P<server>[^\s/]+)"
    r" (?P<TR>-?\d+)/(?P<Tw>-?\d+)/(?P<Tc>-?\d+)/(?P<Tr>-?\d+)/\+?(?P<Ta>-?\d+) (?P<status>-?\d+) "
)


def parse_http_log_line(line: str) -> LoggedRequest | None:
    """The request of one HTTP log line, or ``None`` when the line is not one (a TCP log line, a
    request no server took: ``<NOSRV>``)."""
    match = HTTP_LOG.search(line)
    if match is None or match["server"] == "<NOSRV>":
        return None
    tr = int(match["Tr"])
    return LoggedRequest(match["backend"], match["server"], None if tr < 0 else tr / 1000.0, int(match["status"]))


def haproxy_requests(line: str) -> tuple[LoggedRequest, ...]:
    """The request of one HAProxy log line, as :class:`~adapters.access_log.AccessLogTimer` reads lines."""
    request = parse_http_log_line(line)
    return () if request is None else (request,)
