"""ASGI middleware for the front: admission (429), body limits (413, 408), deadlines (504), access (401, the
/analyze guard), one error shape for every 4xx/5xx, request metrics and ``/readyz``; docs/overload.md has the rules.

The image routes (``lanes``) are answered from the body held in memory (fastinfer/front/image_api.py); other requests
go on to the app with it replayed. Connection-level limits come first, in fastinfer/front/connections.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from tempfile import TemporaryFile
from typing import IO, TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastinfer.common.errors import error_body
from fastinfer.front.access import ANALYZE_ROUTE, Access, ApiKeys, analyze_guard
from fastinfer.front.paths import UNLIMITED_PATHS, is_open
from fastinfer.serving import deadlines
from fastinfer.serving.metrics import REQUESTS

if TYPE_CHECKING:
    from fastinfer.catalog.config import Settings
    from fastinfer.front.image_routes import ImageRoute

logger = logging.getLogger("fastinfer.http")

# pydantic field name → our error code, so a bad backend reads as such rather than "invalid".
_FIELD_CODES = {"backend": "unknown_backend", "top_k": "invalid_top_k", "image": "invalid_image"}
_STATUS_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "overloaded",
    500: "internal_error",
    501: "not_implemented",
    503: "unavailable",
    504: "timeout",
}


def normalise_error(status: int, body: bytes) -> dict[str, Any]:
    """Whatever error body a framework produced → our shape (kept as-is if already ours)."""
    try:
        data: Any = json.loads(body) if body else None
    except ValueError:
        data = None
    if isinstance(data, list) and len(data) == 1:  # BentoML wraps some errors in a list
        data = data[0]
    message = None
    if isinstance(data, dict):
        error, detail = data.get("error"), data.get("detail")
        if isinstance(error, dict) and {"code", "message"} <= error.keys():
            return data
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            return validation_error(detail)
        message = error if isinstance(error, str) else detail if isinstance(detail, str) else None
    if status >= 500:
        message = "The server failed to handle this request; it has been logged."
    if not message:
        message = body.decode("utf-8", "replace").strip()[:500] or f"HTTP {status}"
    return error_body(_STATUS_CODES.get(status, "error"), message)


def validation_error(detail: list[dict[str, Any]]) -> dict[str, Any]:
    parts, code = [], "invalid_request"
    for err in detail:
        loc = [str(p) for p in err.get("loc", []) if p not in ("body", "query")]
        field = loc[-1] if loc else ""
        if field in _FIELD_CODES and code == "invalid_request":
            code = _FIELD_CODES[field]
        parts.append(f"{'.'.join(loc) or 'request'}: {err.get('msg', 'invalid')}")
    return error_body(code, "; ".join(parts))


# The bodies of the front's own refusals, also the spec's examples of them (fastinfer/front/openapi.py).
def overloaded(max_concurrency: int, max_uploads: int) -> dict[str, Any]:
    return error_body(
        "overloaded",
        f"The server is at its limit of {max_concurrency} concurrent requests "
        f"(FASTINFER_MAX_CONCURRENCY) or {max_uploads} uploads; retry shortly.",
    )


def too_large(length: int | None, max_bytes: int) -> dict[str, Any]:
    size = f"{length:,} bytes" if length is not None else "larger than the limit"
    return error_body(
        "payload_too_large", f"The request body is {size}; the limit is {max_bytes:,} bytes (FASTINFER_MAX_BYTES)."
    )


def slow_body(body_idle_s: float, timeout_s: float) -> dict[str, Any]:
    return error_body(
        "request_timeout",
        f"The request body stalled for {body_idle_s:g} s or did not arrive within "
        f"{timeout_s:g} s (FASTINFER_BODY_IDLE_S, FASTINFER_TIMEOUT_S).",
    )


def timed_out(timeout_s: float) -> dict[str, Any]:
    return error_body("timeout", f"The request did not finish within {timeout_s:g} s (FASTINFER_TIMEOUT_S).")


def no_body(method: str, path: str) -> dict[str, Any]:
    return error_body("payload_too_large", f"{method} {path} takes no request body.")


UNAVAILABLE = error_body("unavailable", "The server could not take this request now (logged); retry shortly.")
DISK_FULL = error_body("unavailable", "The server's disk is full and this request needs it (logged); retry later.")
RETRY_SHORTLY = [(b"retry-after", b"1")]  # the overloaded answer's headers
CLOSE = [(b"connection", b"close")]  # answered before the body was read: the rest is not read either

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MEMORY_FOR_BODIES = 256 * 1024 * 1024  # all bodies held in memory at once, per front worker
REPLAY_CHUNK = 64 * 1024  # a body read back from its temporary file, in pieces of this size
SMALL_BODY = 64 * 1024  # an unread body up to this size is left for the server to drain
DISK_FULL_LOG_S = 60.0
CLIENT_CLOSED = 499  # nginx's "client closed request": what the access log and request metrics say
# A probe is answered within this, whatever a runner does: a load balancer's probe gives up after a few
# seconds anyway (Kubernetes: timeoutSeconds), and an unanswered probe holds a busy connection meanwhile.
READY_TIMEOUT_S = 2.0

Lane = Callable[[Scope, bytes, Send], Awaitable[None]]
"""Answers a request whose whole body is in hand (an image route); sends an ASGI response."""
Readiness = Callable[[], Mapping[str, Awaitable[bool]]]
"""What /readyz asks now, by the name its 503 gives: each awaitable says whether that part is ready."""


def front_options(
    settings: Settings,
    image_routes: Mapping[str, ImageRoute],
    lane: Lane,
    degraded: Callable[[], str | None] | None = None,
    readiness: Readiness | None = None,
) -> dict[str, Any]:
    """FrontMiddleware's keyword arguments, as service.py wires it: the limits and the access check (the API
    keys, the /analyze guard) from ``settings``; ``lane`` answers each image route."""
    return {
        "max_bytes": settings.max_bytes,
        "max_concurrency": settings.max_concurrency,
        "timeout_s": settings.request_timeout_s,
        # Route → the request metric's backend label when a request fails before it names one.
        "route_backends": {**{path: route.metric_label for path, route in image_routes.items()}, ANALYZE_ROUTE: "none"},
        "max_uploads": settings.max_uploads,
        "body_idle_s": settings.body_idle_s,
        "lanes": dict.fromkeys(image_routes, lane),
        "access": Access(ApiKeys(settings.api_keys), {ANALYZE_ROUTE: analyze_guard(settings)}),
        "degraded": degraded,
        "readiness": readiness,
    }


@dataclass(eq=False)
class FrontMiddleware:
    app: ASGIApp
    max_bytes: int
    max_concurrency: int
    timeout_s: float
    route_backends: Mapping[str, str]  # API route → backend label when the handler sets none
    max_uploads: int
    body_idle_s: float
    lanes: Mapping[str, Lane] = field(default_factory=dict)  # POST route → its handler over the body in memory
    access: Access | None = None
    degraded: Callable[[], str | None] | None = None  # why the server cannot be ready now (a full disk): 503
    readiness: Readiness | None = None  # /readyz's checks (None: none but ``degraded``)

    def __post_init__(self) -> None:
        self.ready_check: asyncio.Future[str | None] | None = None  # one at a time, shared by the probes
        self.in_flight = 0  # requests being handled (their body is in)
        self.uploading = 0  # requests whose body is still arriving
        self.memory_limit = MEMORY_FOR_BODIES  # bytes of bodies held in memory at once; beyond, in files
        self.memory_used = 0
        self.disk_full_logged = -DISK_FULL_LOG_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket" and self.access is not None and self.access.check(scope):
                await send({"type": "websocket.close", "code": 1008})  # before accept: refused (403)
                return
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        refused = _unwanted_body(scope)
        if refused is not None:  # on every route, probes included: the server would read it all
            await send_json(send, *refused, CLOSE)
            return
        if path == "/readyz" and scope["method"] in ("GET", "HEAD"):  # another method: the app's 405
            await self._ready(send)
            return
        if path in UNLIMITED_PATHS:
            await self.app(scope, receive, _ErrorRewriter(send))
            return
        state = scope.setdefault("state", {})  # created here, so that copies of the scope share it
        recorder = _Recorder(send)
        try:
            refusal = self.access.check(scope) if self.access is not None else None
            if refusal is not None:  # before the body: an unknown caller's upload is never read
                await send_json(recorder, refusal.status, refusal.body, [*refusal.headers, *_unread_body(scope)])
                return
            await self._admit(scope, receive, recorder)
        except Exception as exc:
            if recorder.status is not None:  # already answering: nothing else can be said
                raise
            # E.g. no disk left to spool a body; unanswered, BentoML would give a plain-text 500 much later.
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # Said once a minute (fastinfer/serving/disk.py logs it too), not per request.
                if (now := time.monotonic()) - self.disk_full_logged >= DISK_FULL_LOG_S:
                    self.disk_full_logged = now
                    logger.error(
                        "front: %s answered 503: no space left on the disk (%s); said once a minute", path, exc
                    )
                await send_json(recorder, 503, DISK_FULL)
            else:
                logger.exception("front: failed before answering %s", path)
                await send_json(recorder, 503, UNAVAILABLE)
        finally:
            if path in self.route_backends and recorder.status is not None:
                backend = state.get("fastinfer_backend") or self.route_backends[path]
                REQUESTS.labels(route=path, backend=backend, status=str(recorder.status)).inc()

    async def _admit(self, scope: Scope, receive: Receive, send: _Recorder) -> None:
        # One deadline for the whole request, the body included: ours answers before BentoML's.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body: _Body | None = None
        app: ASGIApp = self.app
        try:
            if scope.get("method") in BODY_METHODS:
                # Before a handling slot is taken: a slow upload holds an upload slot, not one others need.
                body = await self._receive_body(scope, receive, send, deadline)
                if body is None:  # answered (413, 408, 429), or the client has gone
                    return
            if self.in_flight >= self.max_concurrency:
                await send_json(send, 429, overloaded(self.max_concurrency, self.max_uploads), RETRY_SHORTLY)
                return
            if body is not None:
                lane = self.lanes.get(scope["path"]) if scope.get("method") == "POST" else None
                if lane is not None:
                    data = body.read()  # admitted: only handled requests hold a body read back from disk
                    app = lambda s, _r, snd: lane(s, data, snd)  # noqa: E731 (the body is already in hand)
                else:
                    receive = _replay(body, receive)
            self.in_flight += 1
            try:
                await self._handle(app, scope, receive, send, deadline)
            finally:
                self.in_flight -= 1
        finally:
            if body is not None:
                body.close()

    async def _receive_body(self, scope: Scope, receive: Receive, send: _Recorder, deadline: float) -> _Body | None:
        """The whole body, or None once answered (413, 408, 429) or the client has gone. Answers before the
        body is in close the connection, but a 429 to a body of known length."""
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await send_json(send, 413, too_large(length, self.max_bytes), CLOSE)
            return None
        if self.uploading >= self.max_uploads:
            # A body of known, allowed length is left for the server to drain (bounded), so that the
            # client, still sending, reads its 429 instead of a reset connection; any other is cut off.
            close = [] if length is not None else CLOSE
            await send_json(send, 429, overloaded(self.max_concurrency, self.max_uploads), [*RETRY_SHORTLY, *close])
            return None
        self.uploading += 1
        loop = asyncio.get_running_loop()
        body = _Body(self)
        complete = False
        try:
            while True:
                try:  # asyncio.timeout: no task per chunk, unlike wait_for
                    async with asyncio.timeout(max(0.0, min(self.body_idle_s, deadline - loop.time()))):
                        message = await receive()
                except TimeoutError:
                    await send_json(send, 408, slow_body(self.body_idle_s, self.timeout_s), CLOSE)
                    break
                if message["type"] == "http.disconnect":
                    # The client left: a response all the same (uvicorn drops it), or BentoML's timeout
                    # middleware, outside, holds the request (and a shutdown) for FASTINFER_TIMEOUT_S + 5 s.
                    with contextlib.suppress(OSError):  # ASGI lets a server refuse output to a closed connection
                        await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
                        await send({"type": "http.response.body", "body": b""})
                    break
                chunk = message.get("body", b"")
                if body.size + len(chunk) > self.max_bytes:
                    await send_json(send, 413, too_large(length, self.max_bytes), CLOSE)
                    break
                body.write(chunk)
                if not message.get("more_body", False):
                    complete = True
                    return body
        finally:
            self.uploading -= 1
            if not complete:  # refused, abandoned or cancelled: its memory (or file) goes now
                body.close()
        return None

    async def _handle(self, app: ASGIApp, scope: Scope, receive: Receive, send: _Recorder, deadline: float) -> None:
        gate = _Recorder(send)
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        deadlines.set_within(remaining)  # the handler's task inherits it: runners drop work answered 504
        task = asyncio.ensure_future(app(scope, receive, _ErrorRewriter(gate)))
        done, _ = await asyncio.wait({task}, timeout=remaining)
        if task in done:
            task.result()
            return
        if send.status is not None:  # already answering: let it finish
            await task
            return
        # Answer now; whatever the handler sends later is dropped. Its CPU work is bounded by the
        # front's pool (fastinfer.serving.cpu), so nothing waits for it here.
        gate.open = False
        task.cancel()
        task.add_done_callback(_retrieve)
        await send_json(send, 504, timed_out(self.timeout_s))

    async def _ready(self, send: Send) -> None:
        """/readyz: 503 with the reason (a full disk, a runner not ready or not answering), else 200."""
        if self.degraded is not None and (reason := self.degraded()) is not None:
            await send_json(send, 503, error_body("degraded", f"Not ready: {reason}."))
            return
        if self.readiness is not None:
            # Probes share a running check: a flood asks each runner once at a time, a wedged one holds one request.
            if self.ready_check is None or self.ready_check.done():
                self.ready_check = asyncio.ensure_future(_check_ready(self.readiness))
            if (reason := await asyncio.shield(self.ready_check)) is not None:
                await send_json(send, 503, error_body("not_ready", f"Not ready: {reason}."))
                return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"\n"})  # what BentoML's probe answers


async def _check_ready(readiness: Readiness) -> str | None:
    """Every check at once, each given READY_TIMEOUT_S: why not ready (naming each part that is not, or did not
    answer in time), or None."""
    try:
        checks = {name: asyncio.ensure_future(check) for name, check in readiness().items()}
    except Exception as exc:  # a bug in wiring the checks: said, never a hung probe
        logger.exception("front: the readiness checks could not start")
        return f"the readiness checks could not start ({type(exc).__name__})"
    if not checks:
        return None
    _, late = await asyncio.wait(checks.values(), timeout=READY_TIMEOUT_S)
    problems = []
    for name, check in checks.items():
        if check in late:
            check.cancel()
            check.add_done_callback(_retrieve)
            problems.append(f"{name} did not answer within {READY_TIMEOUT_S:g} s")
        elif (exc := check.exception()) is not None:
            problems.append(f"{name} did not answer ({type(exc).__name__})")
        elif not check.result():
            problems.append(f"{name} is not ready")
    return "; ".join(problems) or None


class _Recorder:
    """Wraps ``send``: remembers the status the response started with; once closed (we answered for the
    handler), drops what is sent."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status: int | None = None
        self.open = True

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        if self.open:
            await self.send(message)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Collect an abandoned task's outcome, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class _ErrorRewriter:
    """Wraps ``send``: JSON or plain-text error responses not already in our shape are buffered and reshaped."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            headers = {k.lower(): v for k, v in message.get("headers", [])}
            if headers.get(b"content-type", b"text/plain").startswith((b"application/json", b"text/plain")):
                self.start = message
                return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            status = self.start["status"]
            replaced = (b"content-length", b"content-type")
            extra = [(k, v) for k, v in self.start.get("headers", []) if k.lower() not in replaced]
            self.start = None
            await send_json(self.send, status, normalise_error(status, b"".join(self.chunks)), extra)


def _content_length(scope: Scope) -> int | None:
    value = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _unwanted_body(scope: Scope) -> tuple[int, dict[str, Any]] | None:
    """A body where none is taken, or a transfer coding not implemented: refused before a byte (uvicorn reads and
    discards an unread body without limit: 50 GB into POST /livez). Content-Length with Transfer-Encoding never
    gets here: the parser refuses it (400, fastinfer/front/connections.py)."""
    chunked = any(k == b"transfer-encoding" for k, _ in scope.get("headers", []))
    codings = b",".join(v for k, v in scope.get("headers", []) if k == b"transfer-encoding")
    if chunked and [c.strip() for c in codings.lower().split(b",")] != [b"chunked"]:
        # RFC 9112 6.1: a transfer coding not implemented (gzip before chunked) SHOULD get 501. (One not
        # ending in chunked has no readable length: connections.py answers it 400.)
        said = codings.decode("latin-1")[:100]
        return 501, error_body("not_implemented", f"Transfer-Encoding {said!r} is not supported; only chunked is.")
    # The open paths too: a caller without a key must not hold upload slots with bodies nobody reads.
    if (chunked or _content_length(scope)) and (scope.get("method") not in BODY_METHODS or is_open(scope["path"])):
        return 413, no_body(str(scope.get("method")), scope["path"])
    return None


def _unread_body(scope: Scope) -> list[tuple[bytes, bytes]]:
    """Headers for an answer given before the body was read: a small body of known length is left for the
    server to drain (the client reads the answer, not a reset); any other closes the connection."""
    headers = dict(scope.get("headers", []))
    length = _content_length(scope)
    has_body = b"transfer-encoding" in headers or bool(length)
    # Expect: 100-continue: the client waits to be asked for the body; it is not asked, so close.
    unread = length is None or length > SMALL_BODY or b"expect" in headers
    return CLOSE if has_body and unread else []


class _Body:
    """A request body as it arrives: in memory while its worker's budget allows, else moved to a temporary file."""

    def __init__(self, budget: FrontMiddleware) -> None:
        self.budget = budget
        self.chunks: list[bytes] = []
        self.held = 0  # bytes of this body counted in the budget
        self.file: IO[bytes] | None = None
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.file is None and self.budget.memory_used + len(chunk) > self.budget.memory_limit:
            self.file = TemporaryFile()  # noqa: SIM115 (closed in close())
            self.file.writelines(self.chunks)
            self._release()
        if self.file is not None:
            self.file.write(chunk)
            return
        self.chunks.append(chunk)
        self.held += len(chunk)
        self.budget.memory_used += len(chunk)

    def read(self) -> bytes:
        """The whole body as one bytes object."""
        if self.file is not None:
            self.file.seek(0)
            return self.file.read()
        self.chunks = [b"".join(self.chunks)]  # one copy, kept: the budget still counts it once
        return self.chunks[0]

    def pieces(self) -> Iterator[bytes]:
        """The body as it arrived, or from its file in pieces of REPLAY_CHUNK bytes."""
        if self.file is None:
            yield from self.chunks
            return
        self.file.seek(0)
        while chunk := self.file.read(REPLAY_CHUNK):
            yield chunk

    def close(self) -> None:
        self._release()
        if self.file is not None:
            self.file.close()

    def _release(self) -> None:
        self.budget.memory_used -= self.held
        self.held = 0
        self.chunks = []


def _replay(body: _Body, original: Receive) -> Receive:
    """The body just received (then an empty last message), then the real channel (a real disconnect)."""
    messages = chain(
        ({"type": "http.request", "body": chunk, "more_body": True} for chunk in body.pieces()),
        [{"type": "http.request", "body": b"", "more_body": False}],
    )

    async def receive() -> Message:
        return next(messages, None) or await original()

    return receive


async def send_json(
    send: Send, status: int, payload: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(payload).encode()
    length = (b"content-length", str(len(body)).encode())
    start_headers = [*(headers or []), (b"content-type", b"application/json"), length]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body})
