"""FrontMiddleware's deadline: our answer comes on time and in our shape, late output is dropped,
a slow client gets a 4xx, and the work behind timed-out requests stays bounded."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable
from typing import Any
from unittest.mock import ANY

import pytest

from fastinfer.front import http
from fastinfer.front.http import FrontMiddleware
from fastinfer.serving.cpu import CpuPool
from tests.asgi import araw, raw, request

pytestmark = pytest.mark.anyio
TIMEOUT_S = 0.2


def scope(method: str = "POST", body_length: int | None = 0) -> dict[str, Any]:
    headers = [] if body_length is None else [(b"content-length", str(body_length).encode())]
    return {"type": "http", "path": "/classify", "method": method, "headers": headers}


def middleware_for(app, **limits: Any) -> FrontMiddleware:
    options = {"max_bytes": 10_000, "max_concurrency": 100, "max_uploads": 200, "body_idle_s": 10}
    options.update({"timeout_s": TIMEOUT_S, **limits})
    return FrontMiddleware(app, route_backends={}, **options)


async def call(
    app, request_scope: dict[str, Any], receive=None, middleware: FrontMiddleware | None = None
) -> tuple[list[dict[str, Any]], float]:
    """The middleware over ``app``, called raw (tests/asgi.py): what is tested here is bodies that stall,
    trickle, never come or are cut off, which no client sends on purpose. (Messages sent, seconds taken.)"""
    started = time.perf_counter()
    sent = await araw(middleware or middleware_for(app), request_scope, receive)
    return sent, time.perf_counter() - started


def answer(sent: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    return sent[0]["status"], json.loads(sent[1]["body"])


class BlockingWork:
    """An app whose handler does 1 s of uninterruptible CPU work (like a decode) on a pool."""

    def __init__(self, pool: CpuPool) -> None:
        self.pool = pool
        self.running = 0
        self.peak = 0
        self.finished = 0
        self.lock = threading.Lock()

    def work(self) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(1.0)
        with self.lock:
            self.running -= 1
            self.finished += 1

    async def __call__(self, scope, receive, send) -> None:
        await receive()
        await self.pool.run(self.work)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})


async def test_stuck_handlers_get_our_504_on_time_and_their_work_stays_within_the_pool() -> None:
    """Their late answers are dropped. The pool keeps a started job's thread and drops jobs that never started
    (anyio's to_thread released its limiter on cancel: 6 decodes at once on a limit of 2)."""
    pool = CpuPool(2)
    app = BlockingWork(pool)
    answers = []
    for _ in range(3):
        answers += await asyncio.gather(*(call(app, scope()) for _ in range(5)))
    await asyncio.sleep(1.3)  # the abandoned work ends meanwhile and tries to answer
    for sent, seconds in answers:
        status, body = answer(sent)
        assert status == 504 and body["error"]["code"] == "timeout", body
        assert seconds < TIMEOUT_S + 0.5  # not after the 1 s of work: nothing waits for it
        assert len(sent) == 2, sent  # the handler's own late 200 never reached the client
    assert app.peak <= 2, app.peak
    assert app.finished == 2  # the first wave's two started jobs ran to their end; the others never started
    pool.close()


async def never_arrives() -> dict[str, Any]:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def ok_app(scope, receive, send) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def trickle() -> dict[str, Any]:
    await asyncio.sleep(0.15)
    return {"type": "http.request", "body": b"x", "more_body": True}


@pytest.mark.parametrize(
    ("length", "receive", "limits", "within_s"),
    [
        (None, trickle, {}, TIMEOUT_S + 0.5),  # each byte in time, the whole too late
        (5_000, trickle, {}, TIMEOUT_S + 0.5),
        (5_000, never_arrives, {"timeout_s": 30, "body_idle_s": 0.2}, 2),  # the idle limit, not the deadline
    ],
    ids=["chunked trickle", "sized trickle", "stalled"],
)
async def test_a_client_too_slow_to_send_its_body_gets_a_408(length, receive, limits, within_s: float) -> None:
    sent, seconds = await call(ok_app, scope(body_length=length), receive, middleware_for(ok_app, **limits))
    status, body = answer(sent)
    assert status == 408 and body["error"]["code"] == "request_timeout", body
    assert seconds < within_s
    # The rest of the body is never read, so the connection must not be reused for another request.
    assert (b"connection", b"close") in sent[0]["headers"]


async def test_stalled_uploads_take_no_handling_slot() -> None:
    """Sockets that send headers and nothing more must not make every other request a 429."""
    middleware = middleware_for(ok_app, max_concurrency=2, timeout_s=5, body_idle_s=5)
    stalled = [asyncio.ensure_future(call(ok_app, scope(body_length=5_000), never_arrives, middleware))]
    stalled += [asyncio.ensure_future(call(ok_app, scope(body_length=5_000), never_arrives, middleware))]
    await asyncio.sleep(0.05)
    uploading = middleware.uploading
    sent, _ = await call(ok_app, scope(), None, middleware)
    for task in stalled:
        task.cancel()
    assert uploading == 2
    assert sent[0]["status"] == 200, sent


@pytest.mark.parametrize("length", [None, 5_000], ids=["chunked", "known length"])
async def test_uploads_beyond_their_limit_are_refused_at_once(length: int | None) -> None:
    """429 at once. An unknown length is cut off (connection: close); a known length within the limit is
    left to drain, as closing while the client still sends made it see a reset, not its 429."""
    middleware = middleware_for(ok_app, max_uploads=1, body_idle_s=5, timeout_s=5)
    first = asyncio.ensure_future(call(ok_app, scope(body_length=5_000), never_arrives, middleware))
    await asyncio.sleep(0.05)
    sent, _ = await call(ok_app, scope(body_length=length), never_arrives, middleware)
    first.cancel()
    status, body = answer(sent)
    assert status == 429 and body["error"]["code"] == "overloaded"
    assert ((b"connection", b"close") in sent[0]["headers"]) is (length is None)


async def test_a_client_leaving_mid_upload_reaches_no_handler() -> None:
    called = []

    async def app(scope, receive, send) -> None:
        called.append(True)

    messages = iter([{"type": "http.request", "body": b"half", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    sent, _ = await call(app, scope(body_length=5_000), receive)
    assert called == []
    # A response is started all the same (uvicorn drops it: the connection is gone), so that BentoML's
    # timeout middleware, which waits for one, lets go at once: it held the request 35 s, and a
    # SIGTERM's shutdown with it (measured: the front exited 34 s after SIGTERM, not 0.1 s).
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 499


def test_a_fast_request_is_untouched() -> None:
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"fine"})

    response = request(middleware_for(app), "GET", "/classify")
    assert response.status_code == 200 and response.content == b"fine"
    chunked = scope(body_length=None)
    chunked["headers"].append((b"transfer-encoding", b"Chunked"))  # the one coding taken, in any case
    assert raw(middleware_for(ok_app), chunked)[0]["status"] == 200


def chunks_then_stall(total: int, chunk: int = 64 * 1024):
    """A receive() that delivers ``total`` bytes in chunks, then never sends the rest."""
    sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent >= total:
            await asyncio.sleep(3600)
        sent += chunk
        return {"type": "http.request", "body": b"x" * chunk, "more_body": True}

    return receive


async def test_pending_uploads_beyond_the_memory_budget_wait_on_disk() -> None:
    """Bodies are held in memory only within MEMORY_FOR_BODIES (here 8 MB), the rest go to disk: holding
    every pending upload in memory cost the front 1.4 GB."""
    import tracemalloc

    middleware = middleware_for(ok_app, max_bytes=50_000_000, timeout_s=30, body_idle_s=30)
    middleware.memory_limit = 8 * 2**20
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    uploads = [
        asyncio.ensure_future(call(ok_app, scope(body_length=20_000_000), chunks_then_stall(4_000_000), middleware))
        for _ in range(10)
    ]
    while middleware.uploading < 10:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # every upload has delivered its 4 MB
    held = tracemalloc.get_traced_memory()[0] - before
    assert middleware.memory_used <= middleware.memory_limit
    tracemalloc.stop()
    for upload in uploads:
        upload.cancel()
    await asyncio.gather(*uploads, return_exceptions=True)
    assert middleware.memory_used == 0  # every body released its share
    assert held < 8 * 2**20 + 4 * 2**20, f"{held / 2**20:.0f} MB held for 10 pending uploads of 4 MB"


@pytest.mark.parametrize(
    ("lane", "budget"),
    [(True, 64 * 2**20), (False, 64 * 2**20), (False, 1_000_000)],
    ids=["image lane", "replayed to the app", "moved to disk midway"],
)
async def test_a_multi_chunk_body_reaches_the_handler_whole(monkeypatch, lane: bool, budget: int) -> None:
    """Within the budget a body never touches the disk (BentoML's typed Path input wrote every upload to a file)."""
    if budget > 3_000_000:
        monkeypatch.setattr(http, "TemporaryFile", lambda: pytest.fail("a temporary file was created"))
    received = bytearray()

    async def app(scope, receive, send) -> None:
        while True:
            message = await receive()
            received.extend(message.get("body", b""))
            if not message.get("more_body"):
                break
        await http.send_json(send, 200, {"ok": True})

    async def image_lane(_scope, body: bytes, send) -> None:
        received.extend(body)
        await http.send_json(send, 200, {"ok": True})

    payload = bytes(range(256)) * 12_000  # 3 MB
    parts = [payload[i : i + 100_000] for i in range(0, len(payload), 100_000)]
    messages = iter({"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts))

    async def receive() -> dict[str, Any]:
        return next(messages)

    middleware = middleware_for(app, max_bytes=10_000_000, lanes={"/classify": image_lane} if lane else {})
    middleware.memory_limit = budget
    sent, _ = await call(app, scope(body_length=len(payload)), receive, middleware)
    assert sent[0]["status"] == 200 and bytes(received) == payload
    assert middleware.memory_used == 0


def length(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(n).encode())]


CHUNKED = [(b"transfer-encoding", b"chunked")]


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        # A body where none is taken: uvicorn would read and discard it, without limit.
        ("POST", "/livez", length(10**12), 413),
        ("POST", "/metrics", length(10**12), 413),
        ("GET", "/cache/stats", length(10**12), 413),
        ("DELETE", "/classify", length(10**12), 413),
        # RFC 9112 6.1: a coding this server does not implement (gzip before chunked) is 501, not ignored.
        ("POST", "/classify", [(b"transfer-encoding", b"gzip, chunked")], 501),
        ("POST", "/classify", [(b"transfer-encoding", b"gzip"), *CHUNKED], 501),
        ("POST", "/classify", [(b"transfer-encoding", b"chunked, chunked")], 501),
    ],
)
async def test_a_body_refused_by_its_headers_is_refused_before_a_byte_is_read(method, path, headers, status) -> None:
    called = []

    async def app(scope, receive, send) -> None:
        called.append(scope["path"])

    request = {"type": "http", "path": path, "method": method, "headers": headers}
    sent, _ = await call(app, request, never_arrives)
    code = {413: "payload_too_large", 501: "not_implemented"}[status]
    assert answer(sent) == (status, {"error": {"code": code, "message": ANY}})
    assert (b"connection", b"close") in sent[0]["headers"]
    assert called == []


async def test_a_failure_before_answering_is_our_503_at_once() -> None:
    """No space left to spool a body: our 503 at once, not BentoML's plain-text 500 after its outer timeout."""

    async def disk_full() -> dict[str, Any]:
        raise OSError(28, "No space left on device")

    sent, seconds = await call(ok_app, scope(body_length=5_000), disk_full)
    status, body = answer(sent)
    assert status == 503 and body["error"]["code"] == "unavailable"
    assert seconds < 1


async def test_probe_routes_answer_errors_in_our_shape() -> None:
    async def app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 405, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"Method Not Allowed"})

    request = {**scope(method="POST", body_length=0), "path": "/livez"}
    status, body = answer((await call(app, request))[0])
    assert status == 405 and body["error"]["code"] == "method_not_allowed"


READYZ = {"type": "http", "path": "/readyz", "method": "GET", "headers": []}


async def wedged() -> bool:
    await asyncio.Event().wait()  # a runner that accepted the connection and never answers
    return True


async def refused() -> bool:
    raise ConnectionRefusedError


async def test_readyz_answers_503_within_its_bound_naming_what_did_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wedged runner must not hold the probe (and its connection) until BentoML's outer timeout."""
    monkeypatch.setattr(http, "READY_TIMEOUT_S", 0.3)

    def checks() -> dict[str, Awaitable[bool]]:  # asyncio.sleep(0, x): a check answering x at once
        return {"runner-a": asyncio.sleep(0, True), "runner-wedged": wedged(), "runner-b": asyncio.sleep(0, False),
                "runner-c": refused()}  # fmt: skip

    middleware = middleware_for(ok_app, readiness=checks)
    sent, seconds = await asyncio.wait_for(call(ok_app, READYZ, middleware=middleware), 5)
    status, body = answer(sent)
    assert status == 503 and body["error"]["code"] == "not_ready", body
    message = body["error"]["message"]
    assert "runner-wedged did not answer within 0.3 s" in message
    assert "runner-b is not ready" in message and "runner-c did not answer (ConnectionRefusedError)" in message
    assert "runner-a" not in message
    assert seconds < 1
    everyone_ready = middleware_for(
        ok_app, readiness=lambda: {"a": asyncio.sleep(0, True), "b": asyncio.sleep(0, True)}
    )
    sent, _ = await call(ok_app, READYZ, middleware=everyone_ready)
    assert sent[0]["status"] == 200


async def test_probes_at_once_share_one_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of probes (an open path) asks each runner once at a time, not once per probe."""
    monkeypatch.setattr(http, "READY_TIMEOUT_S", 0.2)
    asked = []

    def checks() -> dict[str, Awaitable[bool]]:
        asked.append(1)
        return {"runner-wedged": wedged()}

    middleware = middleware_for(ok_app, readiness=checks)

    async def probes() -> list[list[dict[str, Any]]]:
        return [
            sent for sent, _ in await asyncio.gather(*(call(ok_app, READYZ, middleware=middleware) for _ in range(20)))
        ]

    answers = await asyncio.wait_for(probes(), 5)
    assert [sent[0]["status"] for sent in answers] == [503] * 20
    assert len(asked) == 1
    await asyncio.wait_for(probes(), 5)  # a later probe checks again
    assert len(asked) == 2
