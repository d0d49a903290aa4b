"""The dashboard's files (dashboard/, mounted at /dashboard) under a Content-Security-Policy that holds the
page to this server: no inline script or style (bar widths go through ``element.style``, which a policy
does not restrict); images from here, the ``blob:`` preview of the photo and the ``data:`` icon.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastinfer.front.api_page import content_security_policy

CONTENT_SECURITY_POLICY = content_security_policy(images=["data:", "blob:"])
_HEADER = b"content-security-policy"


class DashboardPage:
    """ASGI wrapper: every response of the wrapped app (the dashboard's files, and its 404s and 304s)
    carries the dashboard's Content-Security-Policy, in place of any the app set."""

    def __init__(self, app: ASGIApp, policy: str = CONTENT_SECURITY_POLICY) -> None:
        self.app = app
        self.policy = policy.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _HEADER]
                message = {**message, "headers": [*headers, (_HEADER, self.policy)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_policy)
        except HTTPException as exc:
            # StaticFiles raises its 404 and 405: answered here, as Starlette would, to carry the policy too.
            answer = PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
            await answer(scope, receive, send_with_policy)


def files(directory: str | Path) -> DashboardPage:
    """The dashboard's files (``index.html`` for the folder itself), each answer with the policy."""
    return DashboardPage(StaticFiles(directory=directory, html=True))
