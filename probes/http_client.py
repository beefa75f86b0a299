"""A minimal HTTP/1.1 keep-alive client for probes, on ``asyncio.Protocol``.

KnapsackLB section 6.7 reports 4,500 probe requests per second on one core; a general
client (httpx) spends most of that budget on its own machinery. This one does only what
a probe needs: one request at a time on one kept-alive connection, the response's status
and the time from just before the request is written to the arrival of the last byte of
the body (``time.perf_counter``, monotonic), measured inside ``data_received`` so event
loop scheduling after the response does not inflate it.

It understands ``Content-Length`` bodies, ``Transfer-Encoding: chunked``, bodies ended by
the server closing (no length), ``HEAD`` (no body), interim 1xx responses (skipped) and
``Connection: close`` (the next request reconnects). The connection set-up is not part of
a request's time (as on a kept-alive connection); a failed connect is, and counts as an
error. A timeout aborts the connection, because a late response would otherwise be read
as the answer to the next request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from knapsack_lb.names import format_address


class ProbeTimeout(Exception):
    """No complete response within the timeout."""


class ProbeConnectionError(Exception):
    """Connect failed, or the server closed or reset the connection mid-response, or sent garbage."""


@dataclass(frozen=True)
class ProbeResponse:
    status: int
    latency: float


class _ResponseProtocol(asyncio.Protocol):
    def __init__(self, head_request: bool) -> None:
        self.transport: asyncio.Transport | None = None
        self.head_request = head_request
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, float]] | None = None
        self.closed = False
        self.keep_alive = True
        self._until_close_status: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self._until_close_status is not None:
                waiter.set_result((self._until_close_status, time.perf_counter()))
            else:
                waiter.set_exception(ProbeConnectionError(f"connection closed mid-response ({exc or 'EOF'})"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost settles the waiter

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.waiter is None or self.waiter.done():
            if not self.waiter:
                self.buffer.clear()  # unsolicited bytes between requests
            return
        try:
            self._parse()
        except ProbeConnectionError as bad:
            self.waiter.set_exception(bad)
            if self.transport is not None:
                self.transport.abort()

    def _parse(self) -> None:
        assert self.waiter is not None
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
            done_at = time.perf_counter()
            del self.buffer[: body_start + length]
            self.waiter.set_result((status, done_at))
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


class KeepAliveClient:
    """One kept-alive HTTP/1.1 connection to one DIP, one request at a time.

    ``request()`` returns a :class:`ProbeResponse` or raises :class:`ProbeTimeout` /
    :class:`ProbeConnectionError`; after either it reconnects on the next call.
    """

    def __init__(
        self, host: str, port: int, *, method: str = "GET", path: str = "/",
        headers: dict[str, str] | None = None, timeout: float = 1.0,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.head_request = method == "HEAD"
        lines = [f"{method} {path} HTTP/1.1", f"Host: {format_address(host, port)}", "User-Agent: klb-probe"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if method == "POST" and not any(k.lower() == "content-length" for k in headers or {}):
            lines.append("Content-Length: 0")
        self._request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._protocol: _ResponseProtocol | None = None
        self.connects = 0

    async def _connect(self) -> _ResponseProtocol:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ResponseProtocol(self.head_request), self.host, self.port),
                timeout=self.timeout,
            )
        except TimeoutError:
            raise ProbeTimeout(f"connect to {format_address(self.host, self.port)} timed out") from None
        except OSError as error:
            raise ProbeConnectionError(f"connect to {format_address(self.host, self.port)}: {error}") from None
        self.connects += 1
        return protocol

    async def request(self) -> ProbeResponse:
        protocol = self._protocol
        if protocol is None or protocol.closed or not protocol.keep_alive:
            self.close()
            protocol = self._protocol = await self._connect()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[int, float]] = loop.create_future()
        protocol.waiter = waiter
        protocol.buffer.clear()
        timer = loop.call_later(self.timeout, _expire, waiter)
        assert protocol.transport is not None
        started = time.perf_counter()
        protocol.transport.write(self._request)
        try:
            status, done_at = await waiter
        except (ProbeTimeout, ProbeConnectionError):
            self.close()
            raise
        finally:
            timer.cancel()
            protocol.waiter = None
        if not protocol.keep_alive:
            self.close()
        return ProbeResponse(status, done_at - started)

    def close(self) -> None:
        if self._protocol is not None:
            if self._protocol.transport is not None:
                self._protocol.transport.abort()
            self._protocol = None


def _expire(waiter: asyncio.Future[tuple[int, float]]) -> None:
    if not waiter.done():
        waiter.set_exception(ProbeTimeout("no complete response within the timeout"))
