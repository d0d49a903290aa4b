"""What FastInfer uses of uvicorn beyond its public API. Written against uvicorn==0.55.0.

The front's connection limits (fastinfer/front/connections.py) must act before a request has headers, which no
public ``Config`` setting does (BentoML's worker builds the ``Config`` and passes on ``timeout_keep_alive`` alone),
and answer in the project's JSON error shape wherever the bento runs, with no reverse proxy in front. So the front
subclasses uvicorn's httptools protocol through :class:`Protocol`, which names the private methods it uses.
Assumptions, one test each (tests/unit/test_compat_uvicorn.py):

1. BentoML's worker leaves ``http="auto"``, and ``Config.load()`` imports the class that
   ``uvicorn.config.HTTP_PROTOCOLS["auto"]`` names then: :func:`use_http_protocol` replaces it.
2. ``HttpToolsProtocol(config, server_state, app_state)`` is an ``asyncio.Protocol`` that keeps its ``loop``,
   ``transport`` and ``server_state``, and the callback object of its ``parser`` (httptools), which
   ``data_received`` feeds: ``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``,
   ``on_message_complete``.
3. The keep-alive timer is ``timeout_keep_alive_task``, armed after each response in
   ``on_response_complete`` for ``timeout_keep_alive`` seconds to call ``timeout_keep_alive_handler``, and
   disarmed by ``_unset_keepalive_if_required()``.
4. ``connections`` is the server's set of open connections (``server_state.connections``): added to in
   ``connection_made``, discarded in ``connection_lost``.
5. ``cycle`` is the request being answered (``response_started``, ``response_complete``, ``disconnected``,
   ``message_event``), ``pipeline`` the requests queued behind it; a cycle marked disconnected drops what the
   app sends. ``flow.pause_reading()`` stops reading the transport.
6. An upgrade request stops the parser with ``httptools.HttpParserUpgrade``, handled by
   ``_should_upgrade()``, ``handle_websocket_upgrade()`` and ``_unsupported_upgrade_warning()``.
7. ``HttpToolsProtocol.data_received(data)`` does only this: ``_unset_keepalive_if_required()``, feed the parser,
   answer a parse error with a warning and ``send_400_response``, handle an upgrade (6). The front's
   ``data_received`` replaces it without calling it (:meth:`Protocol.disarm_keepalive`, :meth:`Protocol.feed`,
   its own 400): work uvicorn adds there would be skipped.
"""

from __future__ import annotations

import httptools
import uvicorn.config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HttpToolsProtocol", "Protocol", "use_http_protocol"]


def use_http_protocol(class_path: str) -> None:
    """Make ``"module:Class"`` the protocol that uvicorn's ``http="auto"`` loads in this process."""
    uvicorn.config.HTTP_PROTOCOLS["auto"] = class_path


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with its private steps that a subclass needs under public names."""

    def feed(self, data: bytes) -> None:
        """Parse ``data`` as ``data_received`` does, but raise ``httptools.HttpParserError`` instead of answering."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def arm_keepalive(self) -> None:
        """Start the keep-alive timer, as uvicorn does after a response."""
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def disarm_keepalive(self) -> None:
        self._unset_keepalive_if_required()
