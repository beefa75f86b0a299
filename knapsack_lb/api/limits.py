"""Request size limits in front of every route (a pure ASGI middleware).

A body larger than ``api.max_body_bytes`` is refused with 413 before it is read whole (by its
``Content-Length``, or by counting a chunked body as it arrives); request headers larger than
``api.max_header_bytes`` in total get 431. So a huge request cannot make the API parse or store
megabytes, and a slow one cannot hold memory.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    pass


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RequestLimits:
    """413 for bodies over ``max_body``, 431 for headers over ``max_headers`` (bytes)."""

    def __init__(self, app: ASGIApp, max_body: int, max_headers: int) -> None:
        self.app = app
        self.max_body = max_body
        self.max_headers = max_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if sum(len(k) + len(v) + 4 for k, v in headers) > self.max_headers:
            await _refuse(send, 431, f"request headers larger than {self.max_headers} bytes (api.max_header_bytes)")
            return
        for key, value in headers:
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _refuse(send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_body:
                    await _refuse(send, 413, f"request body larger than {self.max_body} bytes (api.max_body_bytes)")
                    return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if not started:
                await _refuse(send, 413, f"request body larger than {self.max_body} bytes (api.max_body_bytes)")


