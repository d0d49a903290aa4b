"""The dashboard's files (dashboard/, mounted at /dashboard) under a Content-Security-Policy that holds the
page to this server: no inline script or style (bar widths go through ``element.style``, which a policy
does not restrict); images from here, the ``blob:`` preview of the photo and the ``data:`` icon.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from fastinfer.front.api_page import content_security_policy

CONTENT_SECURITY_POLICY = content_security_policy(images=["data:", "blob:"])


class DashboardFiles(StaticFiles):
    """The dashboard's files (``index.html`` for the folder itself), every answer with the policy: its 404s,
    405s (which StaticFiles raises, answered here as Starlette would) and 304s too."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        try:
            response = await super().get_response(path, scope)
        except HTTPException as exc:
            response = PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)
        response.headers["content-security-policy"] = CONTENT_SECURITY_POLICY
        return response
