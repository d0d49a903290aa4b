"""One error shape for every failure a client can see: ``{"error": {"code", "message"}}``.

Domain code raises :class:`ApiError`; errors BentoML raises before our code runs are reshaped by
:mod:`fastinfer.front.http`, so a client never parses two formats.
"""

from __future__ import annotations

import os
import re
from typing import Any

from fastinfer.common.home import home_roots


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


class UnknownBackend(ApiError):
    status, code = 400, "unknown_backend"


class BackendUnavailable(ApiError):
    status, code = 503, "backend_unavailable"


class RequestTimeout(ApiError):
    """The request's deadline passed (the front's middleware answers the same, front/http.py)."""

    status, code = 504, "timeout"


class RunnerNotLoaded(BackendUnavailable):
    """The backend's runner is up but could not load its model (it says why; see runners/base.py)."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        # The runner already leaves its paths out; this front relays nothing that has one either way.
        super().__init__(without_paths(message), **kwargs)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def one_line(exc: BaseException, limit: int = 300, *, named: bool = True) -> str:
    """An exception as one short line (runtimes such as OpenVINO's C++ core raise pages of context); ``named``:
    after its type's name, which otherwise stands in only for an empty message."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text or '(no message)'}" if named else text or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# An absolute path of two or more parts (``/tmp/x/model.onnx``; not ``/readyz``, ``53/53`` or a URL's
# path, which follows a host name): as runtimes print them in their load errors.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])(?:/[^\s/'\"`,;:()<>\[\]{}]+){2,}/?")
# Where a stored model's files are: <store>/models/<name>/<version>/<file>, its name <family>-<backend>[-b<N>]
# of any family (BentoML's model names: a-z, 0-9, '_', '.', '-'); its version BentoML's, a-z and 0-9.
_STORED = re.compile(r"/models/([a-z0-9](?:[a-z0-9_.-]*[a-z0-9])?)/([a-z0-9]+)(/.*)?$")


def _private(match: re.Match[str]) -> str:
    path = match.group(0)
    end = len(path.rstrip("."))  # a sentence's full stop is not part of the path
    path, tail = path[:end], path[end:]
    if stored := _STORED.search(path):
        return f"{stored.group(1)}:{stored.group(2)}{stored.group(3) or ''}{tail}"
    return path.rstrip("/").rsplit("/", 1)[-1] + tail


def without_paths(text: str) -> str:
    """A message for clients, without this server's paths: a file in a stored model becomes ``<model tag>/<file>``,
    any other absolute path its file name (the log keeps the full message). BentoML's home goes first: it may
    hold a space, where a path's end is otherwise guessed."""
    for root in home_roots():
        text = text.replace(f"file://{root}/", "/").replace(f"{root}/", "/")
    return _ABSOLUTE_PATH.sub(_private, text)


def under_home(path: str | None) -> str | None:
    """A path under BentoML's home as ``$BENTOML_HOME/...`` (else its file name): what /backends shows
    clients, who need not learn where this server keeps its files."""
    if path is None:
        return None
    for root in home_roots():
        if path == root or path.startswith(root + "/"):
            return "$BENTOML_HOME" + path[len(root) :]
    return os.path.basename(path)
