"""The probe HTTP client against canned responses from a real loopback socket server."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator

import pytest

from probes.http_client import KeepAliveClient, ProbeConnectionError, ProbeTimeout


class CannedServer:
    """Answers each request (up to the blank line) with the next canned reply; ``None`` = stay silent."""

    def __init__(self, replies: list[bytes | None], close_after: bool = False) -> None:
        self.replies = replies
        self.close_after = close_after
        self.requests: list[bytes] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                reply = self.replies.pop(0)
                if reply is None:
                    await asyncio.sleep(5)
                    return
                for i in range(0, len(reply), 7):  # dribble the bytes in small pieces
                    writer.write(reply[i : i + 7])
                    await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    servers: list[asyncio.Server] = []

    async def start(canned: CannedServer) -> int:
        server = await asyncio.start_server(canned.handle, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()


async def test_content_length_chunked_and_interim_responses_on_one_connection(serve: object) -> None:
    canned = CannedServer([
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;x=1\r\ndefg\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n",
    ])
    port = await serve(canned)  # type: ignore[operator]
    client = KeepAliveClient("127.0.0.1", port, path="/p?q=1", headers={"X-Probe": "1"})
    statuses = [(await client.request()).status for _ in range(3)]
    assert statuses == [200, 200, 503]
    assert canned.connections == 1 and client.connects == 1
    assert canned.requests[0].startswith(b"GET /p?q=1 HTTP/1.1\r\n") and b"X-Probe: 1" in canned.requests[0]
    client.close()


async def test_body_until_close_and_connection_close_reconnect(serve: object) -> None:
    canned = CannedServer([b"HTTP/1.0 200 OK\r\n\r\nuntil close", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"],
                          close_after=True)
    port = await serve(canned)  # type: ignore[operator]
    client = KeepAliveClient("127.0.0.1", port)
    assert (await client.request()).status == 200
    assert (await client.request()).status == 200
    assert client.connects == 2


async def test_timeout_garbage_and_mid_response_close(serve: object) -> None:
    port = await serve(CannedServer([None]))  # type: ignore[operator]
    client = KeepAliveClient("127.0.0.1", port, timeout=0.1)
    with pytest.raises(ProbeTimeout):
        await client.request()
    port = await serve(CannedServer([b"SSH-2.0-OpenSSH\r\n\r\n"]))  # type: ignore[operator]
    with pytest.raises(ProbeConnectionError, match="not an HTTP"):
        await KeepAliveClient("127.0.0.1", port).request()
    port = await serve(CannedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort"], close_after=True))  # type: ignore[operator]
    with pytest.raises(ProbeConnectionError, match="mid-response"):
        await KeepAliveClient("127.0.0.1", port).request()


async def test_head_requests_expect_no_body(serve: object) -> None:
    port = await serve(CannedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"] * 2))  # type: ignore[operator]
    client = KeepAliveClient("127.0.0.1", port, method="HEAD")
    assert [(await client.request()).status for _ in range(2)] == [200, 200]
    assert client.connects == 1


class _ThreadServer:
    """A blocking socket server on a thread: answers each request at once, whatever the test's loop does."""

    REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            buffer = b""
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
                while b"\r\n\r\n" in buffer:
                    _, buffer = buffer.split(b"\r\n\r\n", 1)
                    conn.sendall(self.REPLY)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
@pytest.mark.parametrize("kernel_timestamps", [True, False])
@pytest.mark.usefixtures("kernel_stamping")
async def test_the_probes_own_wake_up_delay_is_left_out_with_kernel_timestamps(kernel_timestamps: bool) -> None:
    """The response is in the socket at once; the probe's loop is busy for 50 ms before it reads it.
    With the kernel's receive timestamp the latency is the round trip, not the probe's delay."""
    server = _ThreadServer()
    client = KeepAliveClient("127.0.0.1", server.port, kernel_timestamps=kernel_timestamps)
    try:
        await client.request()  # connect
        before = (client.timestamped, client.responses, client.read_delay_sum)
        task = asyncio.ensure_future(client.request())
        await asyncio.sleep(0)  # the request is written; the task waits for the response
        time.sleep(0.05)  # the probe process is busy (or asleep, not yet woken) meanwhile
        response = await task
    finally:
        client.close()
        server.close()
    if kernel_timestamps:
        assert response.latency < 0.025 and response.read_delay > 0.025
        assert (client.timestamped, client.responses) == (before[0] + 1, before[1] + 1)
        assert client.read_delay_sum >= before[2] + response.read_delay
    else:
        assert response.latency >= 0.05 and response.read_delay == 0.0 and client.timestamped == 0
