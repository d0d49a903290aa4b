"""The front's connections, bounded before a request reaches any ASGI code (docs/overload.md, "Connections and
headers", has the limits).

uvicorn's httptools protocol arms keep-alive only after a response, bounds neither the size nor the number of
headers, and counts connections only once headers are in (fastinfer/compat/uvicorn.py): the limits of
fastinfer/front/http.py come too late. :func:`install_front_protocol` makes :class:`FrontProtocol` uvicorn's
``"auto"`` protocol in the front; runners keep uvicorn's (their only client is the front). Trailers are held to the
header limits too (400) and dropped, never merged into the headers (RFC 9110 6.5.1); a request the parser refuses
after its headers reached the app is answered here, unless the app began an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import time
import weakref
from dataclasses import asdict, dataclass, fields, replace
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

import httptools
from prometheus_client import Counter

from fastinfer.common.errors import error_body
from fastinfer.compat.bentoml import in_dependency
from fastinfer.compat.uvicorn import HttpToolsProtocol, Protocol, use_http_protocol

if TYPE_CHECKING:
    from fastinfer.catalog.config import Settings

logger = logging.getLogger("fastinfer.connections")

LOG_INTERVAL_S = 10.0  # one summary line at most this often, however many events
# A refused request (431, 400) is answered this late: a client looping on oversized requests is slowed to
# one per second per connection (answered at once, 4 such clients sent ~900/s each).
REFUSAL_DELAY_S = 1.0
LINGER_S = 2.0  # an answer given here is followed by the close this much later (a client still sending reads it)
FD_RESERVE = 256  # descriptors kept for everything but client connections (runners, Redis, files)
# Output that cannot be written for this long closes the connection: a client that stops reading stays
# "busy" (never closed to make room), and 50 such sockets filled the cap.
SEND_TIMEOUT_S = 10.0
# Requests queued behind the one being handled on one connection (HTTP/1.1 pipelining): browsers and
# common clients send none; 300 pipelined GETs per socket starved the event loop.
MAX_PIPELINED = 8

EVENTS = Counter(
    "fastinfer_connection_events",
    "Front connections closed or refused before reaching the app, by why",
    ["event"],
)
# event → how the log line names it. Connections closed idle after a request are ordinary (counted,
# never logged); silent ones alone make an INFO line (browsers preconnect), anything else a WARNING.
_EVENT_TEXT = {
    "refused": "refused at the connection cap (503)",
    "evicted": "idle connections closed to make room at the cap",
    "headers_too_large": "requests with headers over the size limit (431)",
    "too_many_headers": "requests with too many header fields (431)",
    "header_timeout": "requests whose headers did not arrive in time (408)",
    "bad_request": "unparsable requests (400)",
    "trailers_too_large": "requests with too many or too large trailer fields (400)",
    "silent_closed": "connections closed without having sent a byte",
    "send_timeout": f"connections closed: their client read nothing for {SEND_TIMEOUT_S:g} s",
    "pipeline_flood": f"connections closed: more than {MAX_PIPELINED} requests pipelined",
}
_UNLOGGED = frozenset({"keepalive_closed"})
_QUIET = frozenset({"silent_closed"})
# event → the answer given here: status, message ({names}: ConnectionLimits' fields, and the parser's error).
_ANSWERS = {
    "refused": (
        503,
        "The server is at its limit of {max_connections} open connections (FASTINFER_MAX_CONNECTIONS), "
        "all of them busy; retry shortly.",
    ),
    "headers_too_large": (
        431,
        "The request line and headers exceed {max_header_bytes:,} bytes (FASTINFER_MAX_HEADER_BYTES).",
    ),
    "too_many_headers": (431, "The request has more than {max_headers} header fields (FASTINFER_MAX_HEADERS)."),
    "header_timeout": (
        408,
        "The request's headers did not arrive within {header_timeout_s:g} s (FASTINFER_HEADER_TIMEOUT_S).",
    ),
    # llhttp's reason is a fixed phrase ("Request has invalid `Transfer-Encoding`"), never input.
    "bad_request": (400, "The request is not valid HTTP/1.1: {error}."),
    "trailers_too_large": (
        400,
        "The request's trailer fields exceed {max_headers} fields or {max_header_bytes:,} bytes "
        "(FASTINFER_MAX_HEADERS, FASTINFER_MAX_HEADER_BYTES).",
    ),
}
_CODES = {
    400: "bad_request",
    408: "request_timeout",
    431: "request_header_fields_too_large",
    503: "too_many_connections",
}


@dataclass(frozen=True)
class ConnectionLimits:
    """The front's connection limits (fastinfer.catalog.config: FASTINFER_KEEPALIVE_S and the rest)."""

    keepalive_s: float = 5.0
    header_timeout_s: float = 10.0
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    max_connections: int = 1000


def limits_from(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(**{field.name: getattr(settings, field.name) for field in fields(ConnectionLimits)})


def install_front_protocol(settings: Settings) -> ConnectionLimits:
    """Make :class:`FrontProtocol` uvicorn's ``http="auto"`` protocol in this process; returns the limits in force.
    The descriptor soft limit is raised towards the hard one; where that is short, ``max_connections`` is lowered."""
    limits = limits_from(settings)
    needed = 2 * limits.max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        with contextlib.suppress(ValueError, OSError):  # not allowed here: the cap is fitted to what there is
            raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft != resource.RLIM_INFINITY and soft < needed:
        allowed = max(1, (soft - FD_RESERVE) // 2)
        logger.warning(
            "FASTINFER_MAX_CONNECTIONS=%d needs %d file descriptors; this process may have %d (ulimit -n): using %d",
            limits.max_connections,
            needed,
            soft,
            allowed,
        )
        limits = replace(limits, max_connections=allowed)
    FrontProtocol.limits = limits
    use_http_protocol(f"{__name__}:FrontProtocol")
    return limits


class _Refusal(Exception):
    """Raised inside a parser callback to stop parsing: the request is answered here."""


class _Shared:
    """What the connections of one server (one front worker) share: who is idle, who lingers, and the events
    counted for the next summary line (at most one per LOG_INTERVAL_S, the first at once: a flood gives one line)."""

    def __init__(self) -> None:
        # Connections with no request being handled, oldest idle first (re-entered after each response):
        # the ones a new connection at the cap may close.
        self.idle: dict[FrontProtocol, None] = {}
        self.lingering = 0  # answered here, closing: not counted against the cap, but bounded
        self.counts: dict[str, int] = {}
        self.last_log = -LOG_INTERVAL_S
        self.flush_pending = False

    def add(self, event: str, loop: asyncio.AbstractEventLoop, limits: ConnectionLimits) -> None:
        EVENTS.labels(event=event).inc()
        if event in _UNLOGGED:
            return
        self.counts[event] = self.counts.get(event, 0) + 1
        if time.monotonic() - self.last_log >= LOG_INTERVAL_S:
            self.flush(limits)
        elif not self.flush_pending:
            self.flush_pending = True  # what arrives until then is told in one line
            loop.call_later(self.last_log + LOG_INTERVAL_S - time.monotonic(), self.flush, limits)

    def flush(self, limits: ConnectionLimits) -> None:
        self.flush_pending = False
        counts, self.counts = self.counts, {}
        if not counts:
            return
        self.last_log = time.monotonic()
        logger.log(
            logging.INFO if counts.keys() <= _QUIET else logging.WARNING,
            "front connections: %s (limits: keep-alive %gs, headers within %gs, %d header bytes, %d header "
            "fields, %d connections per worker; FASTINFER_KEEPALIVE_S, FASTINFER_HEADER_TIMEOUT_S, "
            "FASTINFER_MAX_HEADER_BYTES, FASTINFER_MAX_HEADERS, FASTINFER_MAX_CONNECTIONS)",
            ", ".join(f"{n} {_EVENT_TEXT.get(event, event)}" for event, n in counts.items()),
            limits.keepalive_s,
            limits.header_timeout_s,
            limits.max_header_bytes,
            limits.max_headers,
            limits.max_connections,
        )


_SHARED: weakref.WeakKeyDictionary[Any, _Shared] = weakref.WeakKeyDictionary()


class FrontProtocol(Protocol):
    """uvicorn's httptools protocol with the front's limits (see the module docstring)."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __new__(cls, *args: Any, **kwargs: Any) -> HttpToolsProtocol:
        # A runner (BentoML marks its processes before uvicorn starts): uvicorn's own protocol, untouched.
        if in_dependency():
            return HttpToolsProtocol(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn's keep-alive timer (armed after each response) now also runs from the connection's start.
        self.timeout_keep_alive = self.limits.keepalive_s
        if (shared := _SHARED.get(self.server_state)) is None:  # once per worker, not one per connection
            shared = _SHARED[self.server_state] = _Shared()
        self.shared = shared
        self.head_bytes = 0  # bytes read since the current request's head began (raw, as they arrive)
        self.head_size = 0  # its request target and header fields (then its trailer fields), as parsed
        self.header_count = 0
        self.in_head = True  # the next bytes belong to a request line or headers
        self.begun = False  # a request line has begun (not just blank lines), its headers not complete
        self.head_timer: asyncio.TimerHandle | None = None
        self.refusal: str | None = None  # the event (an _ANSWERS key) once a parser callback refused
        self.answered = False  # answered here: anything still read is dropped until the connection closes
        self.served = False  # a request of this connection reached the app
        self.send_timer: asyncio.TimerHandle | None = None  # armed while the client reads nothing

    # Connection life

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            self._answer("refused")
            return
        self._become_idle()
        self.arm_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.idle.pop(self, None)
        self._cancel_head_timer()
        if self.send_timer is not None:
            self.send_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # read before the pause took effect: dropped
        self.disarm_keepalive()
        if self.in_head:
            # Counted as it arrives: httptools buffers a header whole before handing it over. A read
            # that ends one request and starts the next is counted for neither (one read at most).
            self.head_bytes += len(data)
            self._arm_head_timer()  # any byte, even the blank lines llhttp skips between requests
        try:
            self.feed(data)
        except httptools.HttpParserError as exc:
            self._answer(self.refusal or "bad_request", delay=REFUSAL_DELAY_S, error=exc)
            return
        # Still in the head after this read: every byte of it was head (a read that completes the
        # head may carry body bytes too, so that case is judged on the parsed size instead).
        if self.in_head and self.head_bytes > self.limits.max_header_bytes:
            self._answer("headers_too_large", delay=REFUSAL_DELAY_S)

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.begun = True
        self.head_size = self.header_count = 0
        self._arm_head_timer()  # a pipelined request may begin in a read that began in a body

    def on_url(self, url: bytes) -> None:
        self.head_size += len(url)
        if self.head_size > self.limits.max_header_bytes:
            self._refuse("headers_too_large")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        self.head_size += len(name) + len(value) + 4  # "name: value\r\n"
        limits = self.limits
        if not self.in_head:  # a trailer field, after a chunked body: bounded, then dropped (uvicorn would
            # append it to the headers the app already holds)
            if self.header_count > limits.max_headers or self.head_size > limits.max_header_bytes:
                self._refuse("trailers_too_large")
            return
        if self.header_count > limits.max_headers:
            self._refuse("too_many_headers")
        if self.head_size > limits.max_header_bytes:
            self._refuse("headers_too_large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        self.in_head = self.begun = False
        self.served = True
        self.head_bytes = 0
        self.header_count = self.head_size = 0  # from here on they count trailer fields
        self.shared.idle.pop(self, None)  # a request is being handled: never closed to make room
        super().on_headers_complete()
        if len(self.pipeline) > MAX_PIPELINED and not self.answered:  # no answer fits ahead of the queue: cut
            self.answered = True  # what is still read or parsed is dropped
            self._count("pipeline_flood")
            self.transport.abort()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.in_head = True  # what follows is the next request's head

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.timeout_keep_alive_task is not None:
            self._become_idle()  # uvicorn armed the keep-alive timer: nothing queued behind it

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timer is None:
            self.send_timer = self.loop.call_later(SEND_TIMEOUT_S, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    # Timers and closing

    def _send_timed_out(self) -> None:
        self.send_timer = None
        if not self.transport.is_closing():
            self._count("send_timeout")
            self.transport.abort()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self._count("keepalive_closed" if self.served else "silent_closed")
        super().timeout_keep_alive_handler()

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if not self.in_head or self.transport.is_closing():
            return
        if self.begun:  # part of a request's head came, not all of it
            self._answer("header_timeout")
        elif self.cycle is None or self.cycle.response_complete:  # blank lines only: idle, as HTTP goes
            self._count("keepalive_closed" if self.served else "silent_closed")
            self.transport.close()
        # else: blank lines after a request still being handled; FASTINFER_TIMEOUT_S bounds it, and
        # the keep-alive timer follows its response.

    def _refuse(self, event: str) -> NoReturn:
        self.refusal = event
        raise _Refusal

    def _count(self, event: str) -> None:
        self.shared.add(event, self.loop, self.limits)

    def _arm_head_timer(self) -> None:
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _become_idle(self) -> None:
        self.shared.idle.pop(self, None)
        self.shared.idle[self] = None

    def _evict_one(self) -> bool:
        """Close the connection idle the longest to make room; False when every one is busy."""
        idle = self.shared.idle
        while idle:
            victim = next(iter(idle))
            del idle[victim]
            if victim.transport.is_closing():
                continue
            victim.connections.discard(victim)  # gone now for the count; uvicorn's own discard follows
            victim._cancel_head_timer()
            victim.transport.close()
            self._count("evicted")
            return True
        return False

    def _answer(self, event: str, delay: float = 0.0, **extra: Any) -> None:
        """Answer ``event`` (an _ANSWERS key) in the JSON error shape, ``delay`` seconds from now, and close
        LINGER_S after it. Nothing more is read meanwhile: a client still sending reads this answer rather than
        a reset."""
        if self.answered:
            return
        self.answered = True
        self._cancel_head_timer()
        self.disarm_keepalive()
        self.shared.idle.pop(self, None)
        self.connections.discard(self)  # not counted against the cap while it lingers
        self._count(event)
        # Refused after its headers, so the request has reached the app (its body, trailers or framing):
        # unless queued behind another (pipelined) one.
        handled = self.cycle is not None and not self.in_head and not self.pipeline
        if handled and not self.cycle.response_started:
            # The app has not answered: this answer is the request's; the app sees a disconnect, and
            # uvicorn drops what it sends.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        elif self.cycle is not None and (handled or not self.cycle.response_complete):
            # An answer now would follow or cut the app's, or precede a pipelined one's: close instead.
            self.transport.close()
            return
        status, message = _ANSWERS[event]
        body = json.dumps(error_body(_CODES[status], message.format(**asdict(self.limits), **extra))).encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        head += [b"content-type: application/json\r\n", b"connection: close\r\n"]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        answer = b"".join(head) + body
        if self.shared.lingering >= self.limits.max_connections:  # bounded: beyond it, no wait at all
            self.transport.write(answer)
            self.transport.close()
            return
        self.flow.pause_reading()
        self.shared.lingering += 1
        if delay > 0:
            self.loop.call_later(delay, self._send_and_linger, answer)
        else:
            self._send_and_linger(answer)

    def _send_and_linger(self, answer: bytes) -> None:
        if self.transport.is_closing():  # the client gave up waiting
            self.shared.lingering -= 1
            return
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client sees the end of the answer now
        self.loop.call_later(LINGER_S, self._end_linger)

    def _end_linger(self) -> None:
        self.shared.lingering -= 1
        self.transport.close()
