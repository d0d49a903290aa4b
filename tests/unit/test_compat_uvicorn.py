"""Each assumption fastinfer/compat/uvicorn.py makes about uvicorn (its docstring numbers them), checked against
the installed uvicorn with its real protocol on a real event loop: an upgrade that breaks one fails here, naming it."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import textwrap
from collections import deque
from typing import Any

import httptools
import pytest
import uvicorn
import uvicorn.config
from _bentoml_impl.worker import service as bentoml_worker
from uvicorn.server import ServerState

from fastinfer.compat.uvicorn import HttpToolsProtocol, Protocol, use_http_protocol
from fastinfer.front.connections import FrontProtocol
from tests.asgi import FakeTransport

pytestmark = pytest.mark.anyio
GET = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"


async def connect(app: Any = None, cls: type[Protocol] = Protocol) -> tuple[Protocol, FakeTransport, ServerState]:
    async def answer(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app=app or answer, log_config=None, lifespan="off", interface="asgi3", ws="none")
    config.load()
    state = ServerState()
    protocol = cls(config=config, server_state=state, app_state={})
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport, state


def test_1_http_auto_loads_the_class_http_protocols_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(uvicorn.config.HTTP_PROTOCOLS, "auto", uvicorn.config.HTTP_PROTOCOLS["auto"])
    use_http_protocol("fastinfer.compat.uvicorn:Protocol")
    config = uvicorn.Config(app=lambda *a: None, log_config=None, lifespan="off", interface="asgi3")
    config.load()
    assert config.http_protocol_class is Protocol, (
        'assumption 1: Config(http="auto").load() imports the class uvicorn.config.HTTP_PROTOCOLS["auto"] names'
    )
    call = inspect.getsource(bentoml_worker).split("uvicorn.Config(", 1)[1].split("uvicorn.Server(", 1)[0]
    assert "http=" not in call, (
        'assumption 1: BentoML\'s worker builds its uvicorn.Config without http=, so http="auto"'
    )
    assert inspect.signature(uvicorn.Config).parameters["http"].default == "auto", (
        'assumption 1: uvicorn.Config\'s http defaults to "auto"'
    )


async def test_2_the_protocol_is_the_parsers_callback_object() -> None:
    assert issubclass(HttpToolsProtocol, asyncio.Protocol), "assumption 2: HttpToolsProtocol is an asyncio.Protocol"
    assert list(inspect.signature(HttpToolsProtocol).parameters)[:3] == ["config", "server_state", "app_state"], (
        "assumption 2: HttpToolsProtocol takes (config, server_state, app_state)"
    )
    wanted = ["on_message_begin", "on_url", "on_header", "on_headers_complete", "on_message_complete"]
    seen: list[str] = []

    def watch(name: str) -> Any:
        def callback(self: Protocol, *args: Any) -> None:
            seen.append(name)
            getattr(super(Watching, self), name)(*args)

        return callback

    Watching = type("Watching", (Protocol,), {name: watch(name) for name in wanted})

    protocol, transport, state = await connect(cls=Watching)
    assert (protocol.loop, protocol.transport, protocol.server_state) == (
        asyncio.get_running_loop(),
        transport,
        state,
    ), "assumption 2: the protocol keeps its loop, transport and server_state"
    protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na")
    assert list(dict.fromkeys(seen)) == wanted, (
        "assumption 2: data_received feeds self.parser, which calls on_message_begin, on_url, on_header, "
        "on_headers_complete and on_message_complete on the protocol"
    )


async def test_3_the_keepalive_timer_is_armed_after_a_response_and_disarmed_by_name() -> None:
    protocol, transport, _ = await connect()
    protocol.timeout_keep_alive = 30.0
    protocol.data_received(GET)
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200")
    timer = protocol.timeout_keep_alive_task
    assert isinstance(timer, asyncio.TimerHandle) and round(timer.when() - protocol.loop.time()) == 30, (
        "assumption 3: after a response uvicorn arms timeout_keep_alive_task for timeout_keep_alive seconds"
    )
    assert timer._callback == protocol.timeout_keep_alive_handler, (
        "assumption 3: the keep-alive timer calls timeout_keep_alive_handler"
    )
    protocol.disarm_keepalive()
    assert protocol.timeout_keep_alive_task is None and timer.cancelled(), (
        "assumption 3: _unset_keepalive_if_required() cancels the keep-alive timer"
    )
    protocol.arm_keepalive()
    assert protocol.timeout_keep_alive_task is not None
    protocol.timeout_keep_alive_handler()
    assert transport.closed, "assumption 3: timeout_keep_alive_handler closes the connection"


async def test_4_connections_is_the_servers_set_of_open_connections() -> None:
    protocol, _, state = await connect()
    assert protocol.connections is state.connections and protocol in state.connections, (
        "assumption 4: connection_made adds the protocol to connections (server_state.connections)"
    )
    protocol.connection_lost(None)
    assert protocol not in state.connections, "assumption 4: connection_lost discards it from connections"


async def test_5_the_cycle_pipeline_and_flow() -> None:
    release = asyncio.Event()

    async def held(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport, _ = await connect(held)
    protocol.data_received(GET)
    await asyncio.sleep(0)
    first = protocol.cycle
    assert (first.response_started, first.response_complete) == (False, False), (
        "assumption 5: cycle is the request being answered, with response_started and response_complete"
    )
    protocol.data_received(GET)
    assert isinstance(protocol.pipeline, deque) and [c for c, _ in protocol.pipeline] == [protocol.cycle], (
        "assumption 5: a request behind the one being answered is queued in pipeline (and is the cycle)"
    )
    first.disconnected = True
    first.message_event.set()
    release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert transport.written == b"", "assumption 5: a cycle marked disconnected drops what the app sends"
    protocol.flow.resume_reading()  # paused by the pipelined request
    assert transport.reading
    protocol.flow.pause_reading()
    assert not transport.reading, "assumption 5: flow.pause_reading() stops reading the transport"


async def test_6_an_upgrade_is_handled_by_the_named_steps(caplog: pytest.LogCaptureFixture) -> None:
    for step in ("_should_upgrade", "handle_websocket_upgrade", "_unsupported_upgrade_warning"):
        assert callable(getattr(HttpToolsProtocol, step, None)), f"assumption 6: HttpToolsProtocol has {step}()"

    protocol, _, _ = await connect()
    upgrade = b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    with pytest.raises(httptools.HttpParserUpgrade):
        httptools.HttpRequestParser(protocol).feed_data(upgrade)
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        protocol.feed(upgrade)  # no websocket library configured: warned, not raised
    assert "Unsupported upgrade request." in caplog.text, (
        "assumption 6: an upgrade stops the parser (HttpParserUpgrade) and, unsupported, is only warned about"
    )


def _calls(function: Any) -> set[str]:
    """The calls a function's source makes, as written (``self.parser.feed_data``), and the errors it catches."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    caught = {f"except {ast.unparse(node.type)}" for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler)}
    return calls | caught


UVICORN_DATA_RECEIVED = {
    "self._unset_keepalive_if_required",  # disarm the keep-alive timer
    "self.parser.feed_data",  # feed the parser
    "except httptools.HttpParserError",  # a parse error: warned, answered 400
    "self.logger.warning",
    "self.send_400_response",
    "except httptools.HttpParserUpgrade",  # an upgrade (assumption 6)
    "self._should_upgrade",
    "self.handle_websocket_upgrade",
    "self._unsupported_upgrade_warning",
}


def test_7_data_received_does_only_what_the_front_does_in_its_stead() -> None:
    seen = _calls(HttpToolsProtocol.data_received)
    assert seen == UVICORN_DATA_RECEIVED, (
        "assumption 7: HttpToolsProtocol.data_received does only _unset_keepalive_if_required(), feed the parser, "
        "answer a parse error with a warning and send_400_response, handle an upgrade; the front's data_received "
        f"replaces it without calling it, so what uvicorn does there now must be done there too: {sorted(seen)}"
    )
    done_in_its_stead = _calls(Protocol.feed) | _calls(Protocol.disarm_keepalive)
    error_answer = {"except httptools.HttpParserError", "self.logger.warning", "self.send_400_response"}
    assert UVICORN_DATA_RECEIVED - error_answer <= done_in_its_stead, "Protocol.feed and disarm_keepalive do the rest"
    front_calls = _calls(FrontProtocol.data_received)
    assert "except httptools.HttpParserError" in front_calls and "super().data_received" not in front_calls
