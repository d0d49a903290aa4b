"""The front's connection limits (fastinfer/front/connections.py) through uvicorn's real protocol machinery
(httptools parser, timers on a real event loop) over a fake transport: idle connections closed, headers bounded in
time, size and count (408/431 in our JSON shape), a cap on open connections."""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn
import uvicorn.config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from fastinfer.catalog.config import Settings
from fastinfer.front import connections
from fastinfer.front.connections import ConnectionLimits, FrontProtocol, install_front_protocol
from tests.asgi import FakeTransport
from tests.settings import settings_with

pytestmark = pytest.mark.anyio
FAST = ConnectionLimits(keepalive_s=0.2, header_timeout_s=0.3, max_header_bytes=4096, max_headers=20, max_connections=3)
GET = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"


class Server:
    """One front worker's worth of protocol state, with an app that answers 200 or waits to be released."""

    def __init__(self, limits: ConnectionLimits = FAST) -> None:
        self.release = asyncio.Event()
        self.app_calls = 0
        self.hold = False
        self.seen: list[tuple[list[Any], bytes]] = []  # each request's headers and body, as the app saw them
        self.config = uvicorn.Config(app=self.app, log_config=None, lifespan="off", interface="asgi3")
        self.config.load()
        self.state = ServerState()
        FrontProtocol.limits = limits

    async def app(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        self.app_calls += 1
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.seen.append((list(scope["headers"]), body))
        if self.hold:
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    def connect(self) -> tuple[FrontProtocol, FakeTransport]:
        protocol = FrontProtocol(config=self.config, server_state=self.state, app_state={})
        transport = FakeTransport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        return protocol, transport


@pytest.fixture(autouse=True)
def _front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FrontProtocol, "limits", FAST)
    monkeypatch.setattr(connections, "LINGER_S", 0.05)
    monkeypatch.setattr(connections, "REFUSAL_DELAY_S", 0.0)


async def test_a_request_that_starts_and_stalls_gets_408_and_the_connection_closes() -> None:
    """One byte cancels uvicorn's keep-alive timer: the header timeout must close the connection."""
    server = Server()
    protocol, transport = server.connect()
    protocol.data_received(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.5)
    assert transport.status() == 408
    assert transport.json()["error"]["code"] == "request_timeout"
    assert "FASTINFER_HEADER_TIMEOUT_S" in transport.json()["error"]["message"]
    await asyncio.sleep(0.1)
    assert transport.closed
    assert server.app_calls == 0


async def test_blank_lines_do_not_keep_a_connection_open() -> None:
    protocol, transport = Server().connect()
    for _ in range(10):  # one every 0.1 s: the keep-alive timer alone would never fire
        if transport.closed:
            break
        protocol.data_received(b"\r\n")  # llhttp skips these without starting a request
        await asyncio.sleep(0.1)
    assert transport.closed
    assert transport.written == b""  # no request began: closed as idle, not answered 408


async def test_a_connection_between_requests_closes_after_the_keepalive() -> None:
    server = Server()
    protocol, transport = server.connect()
    protocol.data_received(GET)
    await asyncio.sleep(0.05)
    assert transport.status() == 200
    await asyncio.sleep(0.1)
    protocol.data_received(GET)  # a second request on the same connection is served
    await asyncio.sleep(0.05)
    assert transport.written.count(b"HTTP/1.1 200") == 2
    await asyncio.sleep(0.3)
    assert transport.closed


BIG_HEADER = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
TOO_BIG = "4,096 bytes (FASTINFER_MAX_HEADER_BYTES)"


@pytest.mark.parametrize(
    ("sent", "pieces", "said"),
    [
        (BIG_HEADER, 1, TOO_BIG),  # in one read: judged as parsed
        (BIG_HEADER, 8, TOO_BIG),  # spread over many: judged as they arrive, before httptools holds them whole
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 1, TOO_BIG),  # the request line counts
        (
            b"GET /livez HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(21)) + b"\r\n",
            1,
            "more than 20 header fields (FASTINFER_MAX_HEADERS)",
        ),
    ],
    ids=["large header", "large header in pieces", "long request line", "too many fields"],
)
async def test_headers_over_the_limits_get_431_in_our_shape(sent: bytes, pieces: int, said: str) -> None:
    """431, the connection closing, and the app never called."""
    server = Server()
    protocol, transport = server.connect()
    size = len(sent) // pieces + 1
    for start in range(0, len(sent), size):
        protocol.data_received(sent[start : start + size])
    assert transport.status() == 431
    error = transport.json()["error"]
    assert error["code"] == "request_header_fields_too_large"
    assert said in error["message"]
    assert b"connection: close" in transport.written
    assert transport.eof and not transport.reading  # lingers without reading, then closes
    await asyncio.sleep(0.1)
    assert transport.closed
    assert server.app_calls == 0


async def test_headers_within_the_limits_pass_even_with_a_large_body_in_the_same_read() -> None:
    """The raw byte count must not take the body for headers."""
    server = Server()
    protocol, transport = server.connect()
    fields = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(19))
    body = b"x" * 100_000
    protocol.data_received(b"POST /classify HTTP/1.1\r\nContent-Length: 100000\r\n" + fields + b"\r\n" + body)
    await asyncio.sleep(0.05)
    assert transport.status() == 200
    assert server.app_calls == 1


async def test_at_the_cap_a_new_connection_closes_the_longest_idle_one() -> None:
    server = Server()
    (_, oldest), (busy, busy_transport), (_, newer) = (server.connect() for _ in range(3))
    server.hold = True
    busy.data_received(GET)  # a request being handled: never closed to make room
    await asyncio.sleep(0.01)
    protocol, transport = server.connect()  # the 4th, over the cap of 3
    assert oldest.closed and not newer.closed and not busy_transport.closed
    protocol.data_received(GET)
    server.release.set()
    await asyncio.sleep(0.05)
    assert transport.status() == 200
    assert busy_transport.status() == 200


async def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503() -> None:
    server = Server()
    server.hold = True
    busy = [server.connect() for _ in range(3)]
    for protocol, _ in busy:
        protocol.data_received(GET)
    await asyncio.sleep(0.01)
    _, refused = server.connect()
    assert refused.status() == 503
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert b"retry-after: 1" in refused.written
    assert all(not t.closed for _, t in busy)
    server.release.set()
    await asyncio.sleep(0.1)
    assert refused.closed
    assert all(t.status() == 200 for _, t in busy)
    _, accepted = server.connect()  # the busy ones are idle again: room is made
    assert not accepted.closed


async def test_refusals_are_logged_as_one_summary_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fastinfer.connections"):
        server = Server()
        for _ in range(50):
            protocol, _ = server.connect()
            protocol.data_received(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n")
    lines = [r for r in caplog.records if r.name == "fastinfer.connections"]
    assert len(lines) == 1  # the first at once; the other 49 wait for the interval
    assert lines[0].levelno == logging.WARNING
    assert "431" in lines[0].getMessage()


async def test_the_runners_keep_uvicorns_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runners import the same service module; their only client is the front."""
    from bentoml._internal.context import server_context

    monkeypatch.setattr(server_context, "service_type", "service")
    server = Server()
    protocol = FrontProtocol(config=server.config, server_state=server.state, app_state={})
    assert type(protocol) is HttpToolsProtocol


@pytest.mark.parametrize(
    ("rlimit", "requested", "raised", "allowed"),
    [
        ((65536, 65536), 500, [], 500),  # whatever this machine's ulimit
        ((1024, 65536), 1000, [(2 * 1000 + connections.FD_RESERVE, 65536)], 1000),  # the soft limit raised
        ((1024, 1024), 5000, [(1024, 1024)], (1024 - connections.FD_RESERVE) // 2),  # the cap fitted to it
    ],
)
def test_install_makes_uvicorns_auto_protocol_ours_with_descriptors_for_its_cap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, rlimit, requested: int, raised, allowed: int
) -> None:
    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setattr(FrontProtocol, "limits", FrontProtocol.limits)
    monkeypatch.setattr(resource, "getrlimit", lambda _: rlimit)
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: calls.append(value))
    with caplog.at_level(logging.WARNING, logger="fastinfer.connections"):
        limits = install_front_protocol(Settings(max_connections=requested))
    config = uvicorn.Config(app=lambda *a: None, log_config=None)  # what BentoML's worker builds: http="auto"
    config.load()
    assert config.http_protocol_class is FrontProtocol
    assert FrontProtocol.limits == limits
    assert (calls, limits.max_connections) == (raised, allowed)
    assert ("ulimit -n" in caplog.text) is (allowed < requested)


def test_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert connections.limits_from(Settings()) == ConnectionLimits(5, 10, 32 * 1024, 100, 1000)  # the defaults
    settings = settings_with(
        monkeypatch,
        FASTINFER_KEEPALIVE_S="75",
        FASTINFER_HEADER_TIMEOUT_S="20",
        FASTINFER_MAX_HEADER_BYTES="16384",
        FASTINFER_MAX_HEADERS="50",
        FASTINFER_MAX_CONNECTIONS="200",
        FASTINFER_MIN_FREE_DISK_MB="0",
    )
    assert connections.limits_from(settings) == ConnectionLimits(75, 20, 16384, 50, 200)
    assert settings.min_free_disk_mb == 0
    with pytest.raises(ValueError, match="FASTINFER_MAX_HEADER_BYTES must be at least 1"):
        settings_with(monkeypatch, FASTINFER_MAX_HEADER_BYTES="0")


async def test_a_silent_connection_is_closed_after_the_keepalive_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn arms its keep-alive timer only after a response: silent connections stayed open. A keep-alive
    expiring after a request is ordinary: counted, never logged."""
    with caplog.at_level(logging.INFO, logger="fastinfer.connections"):
        server = Server()
        protocol, _ = server.connect()
        protocol.data_received(GET)
        await asyncio.sleep(0.35)  # served, then idle past the keep-alive
        assert not caplog.records
        _, transport = server.connect()  # never sends a byte
        await asyncio.sleep(0.1)
        assert not transport.closed
        await asyncio.sleep(0.25)
        assert transport.closed
        assert transport.written == b""  # nothing was asked: nothing is answered
    (line,) = [r for r in caplog.records if r.name == "fastinfer.connections"]
    assert line.levelno == logging.INFO
    assert "1 connections closed without having sent a byte" in line.getMessage()


async def test_blank_lines_after_a_body_do_not_cut_short_a_slow_answer() -> None:
    """Some clients send CRLF after a POST body; the answer taking longer than the header timeout is
    still delivered, and only then does the idle connection close."""
    server = Server()
    server.hold = True
    protocol, transport = server.connect()
    protocol.data_received(b"POST /classify HTTP/1.1\r\nContent-Length: 2\r\n\r\nab\r\n")
    await asyncio.sleep(0.5)  # past the header timeout
    assert transport.written == b"" and not transport.closed
    server.release.set()
    await asyncio.sleep(0.05)
    assert transport.status() == 200
    await asyncio.sleep(0.3)
    assert transport.closed


async def test_a_refused_request_is_answered_late_so_a_looping_client_is_slowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client looping on oversized headers, answered at once, sends hundreds of requests a second."""
    monkeypatch.setattr(connections, "REFUSAL_DELAY_S", 0.2)
    monkeypatch.setattr(connections, "LINGER_S", 0.2)
    protocol, transport = Server().connect()
    protocol.data_received(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n")
    assert transport.written == b"" and not transport.reading  # held, unread
    await asyncio.sleep(0.3)
    assert transport.status() == 431 and transport.eof and not transport.closed
    await asyncio.sleep(0.2)
    assert transport.closed


async def test_a_client_that_reads_nothing_is_cut_off_after_the_send_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Busy connections are never closed to make room: sockets that pipeline requests and never read their
    answers would hold the whole cap."""
    monkeypatch.setattr(connections, "SEND_TIMEOUT_S", 0.1)
    server = Server()
    stuck, stuck_transport = server.connect()
    slow, slow_transport = server.connect()
    for protocol in (stuck, slow):
        protocol.data_received(GET)
        protocol.pause_writing()  # the client's window is full
    await asyncio.sleep(0.05)
    slow.resume_writing()  # this one reads, late but within the limit
    await asyncio.sleep(0.15)
    assert stuck_transport.closed and not slow_transport.closed


async def test_more_than_a_few_pipelined_requests_close_the_connection() -> None:
    server = Server()
    server.hold = True
    few, few_transport = server.connect()
    few.data_received(GET * 3)
    flood, flood_transport = server.connect()
    flood.data_received(GET * (connections.MAX_PIPELINED + 2))
    await asyncio.sleep(0.01)
    assert flood_transport.closed and not few_transport.closed
    server.release.set()
    await asyncio.sleep(0.1)
    assert few_transport.written.count(b"HTTP/1.1 200") == 3


CHUNKED_POST = b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (b"\x16\x03\x01 not http\r\n\r\n", "not valid HTTP/1.1"),  # e.g. TLS sent to the plain port
        # Framing a proxy could read differently.
        (b"POST /classify HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "Content-Length"),
        # RFC 9112 6.3: no readable length. llhttp refuses it only after the headers are complete, when the
        # request has reached the app: its own answer is dropped.
        (b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", "Transfer-Encoding"),
    ],
    ids=["not http", "length and chunked", "transfer coding not ending in chunked"],
)
async def test_an_unparsable_request_gets_400_in_our_shape_not_a_silent_close(sent: bytes, said: str) -> None:
    protocol, transport = Server().connect()
    protocol.data_received(sent)
    await asyncio.sleep(0.1)
    assert transport.status() == 400, transport.written
    assert transport.json()["error"]["code"] == "bad_request"
    assert said in transport.json()["error"]["message"]
    assert transport.written.count(b"HTTP/1.1 ") == 1
    assert transport.closed


async def test_trailer_fields_are_bounded_and_never_reach_the_apps_headers() -> None:
    server = Server()
    protocol, transport = server.connect()
    protocol.data_received(CHUNKED_POST + b"X-Trailer: sneaked\r\n\r\n")
    await asyncio.sleep(0.05)
    assert transport.status() == 200
    ((headers, body),) = server.seen
    assert body == b"abc" and b"x-trailer" not in dict(headers)  # RFC 9110 6.5.1: not merged

    many = b"".join(b"X-T-%d: v\r\n" % i for i in range(FAST.max_headers + 1))
    protocol, transport = server.connect()
    protocol.data_received(CHUNKED_POST + many + b"\r\n")
    await asyncio.sleep(0.1)
    assert transport.status() == 400, transport.written  # answered, not closed silently
    assert transport.json()["error"]["code"] == "bad_request"
    assert "trailer fields" in transport.json()["error"]["message"]
    assert transport.written.count(b"HTTP/1.1 ") == 1

    big = b"X-Big: " + b"a" * FAST.max_header_bytes + b"\r\n"
    protocol, transport = server.connect()
    protocol.data_received(CHUNKED_POST + big + b"\r\n")
    await asyncio.sleep(0.1)
    assert transport.status() == 400


async def test_a_refusal_after_the_app_began_answering_closes_without_a_second_answer() -> None:
    server = Server()
    protocol, transport = server.connect()
    protocol.data_received(b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    await asyncio.sleep(0.05)
    assert server.app_calls == 1 and not transport.written  # the app waits for the rest of the body
    assert protocol.cycle is not None
    protocol.cycle.response_started = True  # as if the app had begun its answer
    protocol.data_received(b"0\r\n" + b"".join(b"X-T-%d: v\r\n" % i for i in range(FAST.max_headers + 1)) + b"\r\n")
    await asyncio.sleep(0.05)
    assert transport.closed and b"HTTP/1.1 400" not in transport.written
