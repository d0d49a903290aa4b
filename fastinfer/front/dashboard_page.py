"""The dashboard's Content-Security-Policy: its files (dashboard/, served by Starlette's StaticFiles)
go out with a policy that holds the page to this server, as the API page's does.

The page's only script is ``app.js`` (no inline script, so none is allowed), its only stylesheet
``style.css`` (no inline styles either: bar widths are set through ``element.style``, which a policy
does not restrict), and its only images not from here are the photo being classified, previewed from
a ``blob:`` URL, and its empty ``data:`` icon (which spares a /favicon.ico request). So a value that
reached the page as markup would still not run, nor load anything from elsewhere.

service.py mounts :func:`files` at /dashboard.
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
            # StaticFiles raises its 404 and 405; answered here, as Starlette would answer them further
            # out, so that they carry the policy too.
            answer = PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
            await answer(scope, receive, send_with_policy)


def files(directory: str | Path) -> DashboardPage:
    """The dashboard's files (``index.html`` for the folder itself), each answer with the policy."""
    return DashboardPage(StaticFiles(directory=directory, html=True))
