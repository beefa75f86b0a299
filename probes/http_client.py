"""A minimal HTTP/1.1 keep-alive client for probes, on a non-blocking socket and the event loop.

KnapsackLB section 6.7 reports 4,500 probe requests per second on one core; a general
client (httpx) spends most of that budget on its own machinery. This one does only what
a probe needs: one request at a time on one kept-alive connection, the response's status
and the time from just before the request is written to the arrival of the last byte of
the body (``time.perf_counter``, monotonic).

**When the last byte arrived.** The probe process is asleep while it waits; the kernel
wakes it when the response comes, and on a virtual machine that wake-up alone took
0.02-0.15 ms when idle (longer after a longer sleep) and up to milliseconds on a loaded
machine. That delay is the probe's, not the DIP's. So the socket asks the kernel for a
receive timestamp (Linux ``SO_TIMESTAMPNS``: the time the segment reached the socket, on
the real-time clock) and the read that completes the body subtracts how long the bytes
waited in the socket (``read_delay`` = real-time now - kernel timestamp, both read within
microseconds of each other, so a clock step or slew between them is negligible and an
implausible value, negative or longer than the request, is ignored) from the monotonic
reading. Without kernel timestamps (another OS, or ``kernel_timestamps=False``) the time is
the monotonic clock when the read happened, as before; so are the first responses after the
first socket on the machine asked for stamps (Linux switches stamping on from a work queue,
and data that arrives before carries none).

It understands ``Content-Length`` bodies, ``Transfer-Encoding: chunked``, bodies ended by
the server closing (no length), ``HEAD`` (no body), interim 1xx responses (skipped) and
``Connection: close`` (the next request reconnects). The connection set-up is not part of
a request's time (as on a kept-alive connection); a failed connect is, and counts as an
error. A timeout aborts the connection, because a late response would otherwise be read
as the answer to the next request. The socket is read with ``recvmsg`` from a
``loop.add_reader`` callback (asyncio's transports read with ``recv``, which drops the
timestamp) and written with ``send``; ``TCP_NODELAY`` is set.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass

from knapsack_lb.names import format_address
from knapsack_lb.socket_timestamps import enable_timestamps, receive_with_timestamp, seconds_since

_READ_BYTES = 65536


class ProbeTimeout(Exception):
    """No complete response within the timeout."""


class ProbeConnectionError(Exception):
    """Connect failed, or the server closed or reset the connection mid-response, or sent garbage."""


@dataclass(frozen=True)
class ProbeResponse:
    """One response: status, latency (seconds, send to last byte) and how long the last bytes
    waited in the socket before the probe read them (``read_delay``, already left out of
    ``latency``; 0 without kernel timestamps)."""

    status: int
    latency: float
    read_delay: float = 0.0


class _Connection:
    """One connected socket: reads on the loop, parses one response at a time."""

    def __init__(self, sock: socket.socket, head_request: bool, timestamps: bool) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.head_request = head_request
        self.timestamps = timestamps
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, float, float]] | None = None
        self.closed = False
        self.keep_alive = True
        self._until_close_status: int | None = None
        self._kernel_ns = 0  # kernel receive time of the last read (real-time clock, ns); 0 = none
        self.loop.add_reader(sock.fileno(), self._on_readable)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _on_readable(self) -> None:
        try:
            data, kernel_ns = receive_with_timestamp(self.sock, _READ_BYTES, self.timestamps)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._lost(error)
            return
        self._kernel_ns = kernel_ns
        if not data:
            self._lost(None)
            return
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            if waiter is None:
                self.buffer.clear()  # unsolicited bytes between requests
            return
        try:
            self._parse(waiter)
        except ProbeConnectionError as bad:
            waiter.set_exception(bad)
            self.close()

    def _lost(self, exc: Exception | None) -> None:
        waiter = self.waiter
        self.close()
        if waiter is not None and not waiter.done():
            if self._until_close_status is not None:
                waiter.set_result((self._until_close_status, time.perf_counter(), 0.0))
            else:
                waiter.set_exception(ProbeConnectionError(f"connection closed mid-response ({exc or 'EOF'})"))

    def _arrival(self) -> tuple[float, float]:
        """Monotonic time the bytes just read reached the socket, and how long they waited there."""
        return time.perf_counter(), seconds_since(self._kernel_ns)

    def _parse(self, waiter: asyncio.Future[tuple[int, float, float]]) -> None:
        while True:
            if self._until_close_status is not None:
                self.buffer.clear()
                return
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > 65536:
                    raise ProbeConnectionError("response headers longer than 64 KiB")
                return
            head = bytes(self.buffer[:end]).lower()
            if not head.startswith(b"http/1.") or len(head) < 12 or not head[9:12].isdigit():
                raise ProbeConnectionError(f"not an HTTP/1.x response: {bytes(self.buffer[:40])!r}")
            status = int(head[9:12])
            body_start = end + 4
            if 100 <= status < 200:
                del self.buffer[:body_start]
                continue
            self.keep_alive = not head.startswith(b"http/1.0") and b"\r\nconnection: close" not in head
            if self.head_request or status in (204, 304):
                length = 0
            elif b"\r\ntransfer-encoding: chunked" in head:
                consumed = _chunked_length(self.buffer, body_start)
                if consumed is None:
                    return
                length = consumed - body_start
            else:
                at = head.find(b"\r\ncontent-length:")
                if at < 0:
                    self.keep_alive = False
                    self._until_close_status = status  # body ends when the server closes
                    self.buffer.clear()
                    return
                stop = head.find(b"\r\n", at + 2)
                text = head[at + 17 : stop if stop >= 0 else len(head)].strip()
                if not text.isdigit():
                    raise ProbeConnectionError(f"bad Content-Length {text!r}")
                length = int(text)
            if len(self.buffer) < body_start + length:
                return
            done_at, waited = self._arrival()
            del self.buffer[: body_start + length]
            waiter.set_result((status, done_at, waited))
            return


def _chunked_length(buffer: bytearray, start: int) -> int | None:
    """Offset just past a complete chunked body starting at ``start``; None if incomplete."""
    pos = start
    while True:
        line_end = buffer.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size_text = bytes(buffer[pos:line_end]).split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProbeConnectionError(f"bad chunk size {size_text!r}") from None
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", line_end)
            if trailer_end == line_end:  # no trailers: "0\r\n\r\n"
                return line_end + 4
            return None if trailer_end < 0 else trailer_end + 4
        pos = line_end + 2 + size + 2
        if len(buffer) < pos:
            return None


def request_head(method: str, path: str, host: str, port: int, headers: dict[str, str]) -> bytes:
    """The request's head, sent as is on every probe. A user ``Host`` or ``User-Agent`` header
    replaces the default rather than being sent twice (a second ``Host`` makes servers answer 400);
    headers are ASCII by the configuration's rules (:class:`knapsack_lb.model.ProbeSpec`)."""
    given = {name.lower() for name in headers}
    lines = [f"{method} {path} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {format_address(host, port)}")
    if "user-agent" not in given:
        lines.append("User-Agent: klb-probe")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if method == "POST" and "content-length" not in given:
        lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


class KeepAliveClient:
    """One kept-alive HTTP/1.1 connection to one DIP, one request at a time.

    ``request()`` returns a :class:`ProbeResponse` or raises :class:`ProbeTimeout` /
    :class:`ProbeConnectionError`; after either it reconnects on the next call.
    ``kernel_timestamps=False`` times with the monotonic clock at the read only (the module
    docstring says why the default is better). Counters: ``connects``, ``responses``,
    ``timestamped`` (responses timed with a kernel timestamp) and ``read_delay_sum``
    (seconds left out of their latencies).
    """

    def __init__(
        self, host: str, port: int, *, method: str = "GET", path: str = "/",
        headers: dict[str, str] | None = None, timeout: float = 1.0, kernel_timestamps: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.head_request = method == "HEAD"
        self.kernel_timestamps = kernel_timestamps
        self._request = request_head(method, path, host, port, headers or {})
        self._connection: _Connection | None = None
        self.connects = 0
        self.responses = 0
        self.timestamped = 0
        self.read_delay_sum = 0.0

    async def _addresses(self) -> list[tuple[int, tuple[str, int] | tuple[str, int, int, int]]]:
        try:
            literal = ipaddress.ip_address(self.host)
        except ValueError:
            infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            return [(family, address) for family, _, _, _, address in infos]  # type: ignore[misc]
        family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
        return [(family, (self.host, self.port))]

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        where = format_address(self.host, self.port)
        error: Exception | None = None
        try:
            async with asyncio.timeout(self.timeout):
                for family, address in await self._addresses():
                    sock = socket.socket(family, socket.SOCK_STREAM)
                    try:
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        timestamps = self.kernel_timestamps and enable_timestamps(sock)
                        await loop.sock_connect(sock, address)
                    except BaseException as failed:
                        sock.close()
                        if not isinstance(failed, OSError):
                            raise
                        error = failed
                        continue
                    self.connects += 1
                    return _Connection(sock, self.head_request, timestamps)
        except TimeoutError:
            raise ProbeTimeout(f"connect to {where} timed out") from None
        except OSError as failed:  # name resolution
            error = failed
        raise ProbeConnectionError(f"connect to {where}: {error}")

    async def request(self) -> ProbeResponse:
        connection = self._connection
        if connection is None or connection.closed or not connection.keep_alive:
            self.close()
            connection = self._connection = await self._connect()
        loop = connection.loop
        waiter: asyncio.Future[tuple[int, float, float]] = loop.create_future()
        connection.waiter = waiter
        connection.buffer.clear()
        timer = loop.call_later(self.timeout, _expire, waiter)
        request = self._request
        started = time.perf_counter()
        try:
            try:
                sent = connection.sock.send(request)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as error:
                raise ProbeConnectionError(f"send to {format_address(self.host, self.port)}: {error}") from None
            if sent < len(request):
                try:
                    await loop.sock_sendall(connection.sock, request[sent:])
                except OSError as error:
                    raise ProbeConnectionError(f"send to {format_address(self.host, self.port)}: {error}") from None
            status, done_at, waited = await waiter
        except (ProbeTimeout, ProbeConnectionError):
            self.close()
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        elapsed = done_at - started
        if 0.0 < waited < elapsed:  # plausible: the bytes waited that long in the socket
            elapsed -= waited
            self.timestamped += 1
            self.read_delay_sum += waited
        else:
            waited = 0.0
        self.responses += 1
        if not connection.keep_alive:
            self.close()
        return ProbeResponse(status, elapsed, waited)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _expire(waiter: asyncio.Future[tuple[int, float, float]]) -> None:
    if not waiter.done():
        waiter.set_exception(ProbeTimeout("no complete response within the timeout"))
