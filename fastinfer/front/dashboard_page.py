"""The dashboard's files (dashboard/, mounted at /dashboard) under a Content-Security-Policy that holds the
page to this server: no inline script or style (bar widths go through ``element.style``, which a policy
does not restrict); images from here, the ``blob:`` preview of the photo and the ``data:`` icon.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from fastinfer.front.api_page import content_security_policy

CONTENT_SECURITY_POLICY = content_security_policy(images=["data:", "blob:"])
_HEADER = b"content-security-policy"


class DashboardFiles(StaticFiles):
    """The dashboard's files (``index.html`` for the folder itself), every answer with the policy: its 404s and
    405s (which StaticFiles raises, answered here as Starlette would), 304s, and the 400s and 416s of a bad
    ``Range``, which the file response makes only as it is sent."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _HEADER]
                message = {**message, "headers": [*headers, (_HEADER, CONTENT_SECURITY_POLICY.encode())]}
            await send(message)

        try:
            await super().__call__(scope, receive, send_with_policy)
        except HTTPException as exc:
            answer = PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
            await answer(scope, receive, send_with_policy)
