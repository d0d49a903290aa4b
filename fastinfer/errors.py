"""One error shape for every failure a client can see: ``{"error": {"code", "message"}}``.

Domain code raises :class:`ApiError`; the service turns it into JSON with the right status.
Errors BentoML raises before our code runs (validation, content type) are reshaped by
:mod:`fastinfer.http` so that a client never has to parse two formats.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error with an HTTP status, a machine-readable code and a human message."""

    status: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message)


class BadRequest(ApiError):
    status, code = 400, "invalid_request"


class UnsupportedMediaType(ApiError):
    status, code = 415, "unsupported_media_type"


class InvalidImage(ApiError):
    status, code = 400, "invalid_image"


class ImageTooLarge(ApiError):
    status, code = 413, "image_too_large"


class PayloadTooLarge(ApiError):
    status, code = 413, "payload_too_large"


class UnknownBackend(ApiError):
    status, code = 400, "unknown_backend"


class BackendUnavailable(ApiError):
    status, code = 503, "backend_unavailable"


class RunnerNotLoaded(BackendUnavailable):
    """The backend's runner is up but could not load its model (it says why; see runners/base.py)."""


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}
