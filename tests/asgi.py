"""The unit tests' way into an ASGI app in process.

``request``: one request as a client sends it, through httpx's own ASGI transport. ``raw``: the app called
with a scope and a receive of the test's own, for what a client library does not do on purpose: a body
that never comes, comes too slowly or is announced and not sent, a client that leaves mid-body, a HEAD's
body (httpx drops it), a WebSocket or lifespan scope. It returns the messages the app sent. ``FakeTransport``:
below ASGI, the connection a uvicorn protocol writes to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

Receive = Callable[[], Awaitable[dict[str, Any]]]


def request(app: Any, method: str = "GET", path: str = "/", **kwargs: Any) -> httpx.Response:
    """``method path`` sent to ``app``; ``kwargs`` as httpx's ``request`` takes them (content, headers...)."""

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send())


async def empty_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def araw(app: Any, scope: dict[str, Any], receive: Receive | None = None) -> list[dict[str, Any]]:
    """``app`` called with ``scope`` (an http one unless it says; no headers unless it has some) and
    ``receive`` (an empty body by default): the messages it sent."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "headers": [], **scope}, receive or empty_body, send)
    return sent


def raw(app: Any, scope: dict[str, Any], receive: Receive | None = None) -> list[dict[str, Any]]:
    """araw, run to its end."""
    return asyncio.run(araw(app, scope, receive))


class Recorder:
    """The app behind a middleware under test: records the path of each request that reaches it and
    answers it 200 ``reached``."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:
        self.paths.append(scope["path"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"reached"})


class FakeTransport(asyncio.Transport):
    """What the protocol writes and whether it closed; ``close`` reports the loss like a real one once
    ``protocol`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.eof = False
        self.reading = True
        self.protocol: asyncio.Protocol | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 3000)}.get(name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def status(self) -> int | None:
        if not self.written.startswith(b"HTTP/1.1 "):
            return None
        return int(self.written[9:12])

    def json(self) -> dict[str, Any]:
        return json.loads(self.written.split(b"\r\n\r\n", 1)[1])
