"""The image APIs over HTTP in every form docs/api.md lists (multipart ``image`` or ``file``, ``images`` repeated for
a batch; or the image as the whole body, ``image/*`` or application/octet-stream, options in the query), read from
the body the front holds in memory (fastinfer/front/http.py) and answered as JSON in a single write.

Not BentoML's ``Path`` input (image_routes.py declares the same APIs to it, for the spec and the client): it
writes every upload to a temporary file, costing more than our whole cache-hit path (docs/architecture.md).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.datastructures import Headers
from starlette.types import Send

from fastinfer.common.errors import ApiError, BadRequest, UnsupportedMediaType, error_body
from fastinfer.common.schemas import TOP_K_MAX
from fastinfer.front.http import send_json
from fastinfer.front.image_routes import BATCH_FIELD, ROUTES, CacheUse, ImageRoute, run
from fastinfer.serving.pipeline import Image, Pipeline

logger = logging.getLogger("fastinfer.image_api")

RAW_TYPES = ("image/", "application/octet-stream")  # a prefix where it ends in "/", else the exact type
MAX_TEXT_FIELD = 1024  # bytes; backend names and top_k are short
FAILED = error_body("internal_error", "The server failed to handle this request (logged).")  # a bug, not the client


@dataclass
class Form:
    """What a request carries once parsed: its images (bytes, in memory) and its text fields."""

    images: list[Image] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FormRules:
    default_backend: str
    max_batch_images: int


QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')  # a quoted-string directive value: its commas split nothing


def _directives(scope: dict[str, Any], name: str) -> set[str] | None:
    """The directive names (lower case) of every ``name`` header in the request; None if it has none."""
    values = Headers(raw=scope.get("headers", [])).getlist(name)
    if not values:
        return None
    return {item.split("=", 1)[0].strip().lower() for value in values for item in QUOTED.sub('""', value).split(",")}


def cache_use(scope: dict[str, Any]) -> CacheUse:
    """``Cache-Control: no-cache``: neither read nor stored (we cannot revalidate). ``no-store``: not stored, still
    read (RFC 9111 §5.2.1.5). ``Pragma: no-cache`` counts only without a Cache-Control header (§5.4)."""
    control = _directives(scope, "cache-control")
    if control is None:
        no_cache = "no-cache" in (_directives(scope, "pragma") or set())
        return CacheUse(read=not no_cache, store=not no_cache)
    no_cache = "no-cache" in control
    return CacheUse(read=not no_cache, store=not no_cache and "no-store" not in control)


def parse(scope: dict[str, Any], body: bytes, route: ImageRoute, rules: FormRules) -> Form:
    """The request's images and fields, or the 4xx that says what is wrong with it."""
    ctype, options = parse_options_header(Headers(raw=scope.get("headers", [])).get("content-type", ""))
    form = Form()
    query = _query(scope, route)
    if ctype == b"multipart/form-data":
        boundary = options.get(b"boundary")
        if not boundary:
            raise BadRequest("The multipart body has no boundary in its Content-Type header.")
        _parse_multipart(body, boundary, route, rules, form)
    elif _is_raw(ctype.decode("latin-1")):
        if route.kind == "batch":
            raise BadRequest(f"A batch is sent as multipart/form-data, one '{BATCH_FIELD}' part per image.")
        form.images.append(Image(body))
    elif not body or ctype in (b"", b"application/json", b"application/x-www-form-urlencoded", b"text/plain"):
        raise BadRequest(_how_to_send(route))
    else:
        raise unsupported(ctype.decode("latin-1"), route)
    for name, value in query.items():
        if name in form.fields:
            raise BadRequest(f"'{name}' is given both as a form field and as a query parameter.")
        form.fields[name] = value
    if not form.images:
        raise ApiError(_how_to_send(route), code="invalid_image")
    return form


def _is_raw(ctype: str) -> bool:
    """A media type this API reads as the image itself (RAW_TYPES)."""
    return any(ctype.startswith(t) if t.endswith("/") else ctype == t for t in RAW_TYPES)


def unsupported(ctype: str, route: ImageRoute) -> UnsupportedMediaType:
    return UnsupportedMediaType(f"Content-Type {ctype!r} is not taken here. {_how_to_send(route)}")


def too_many_images(count: int, limit: int) -> BadRequest:
    return BadRequest(f"The batch has {count} images; the limit is {limit} (FASTINFER_MAX_BATCH_IMAGES).")


def _how_to_send(route: ImageRoute) -> str:
    if route.kind == "batch":
        return f"Send the images as multipart/form-data, one '{BATCH_FIELD}' part per image."
    return (
        "Send the image as multipart/form-data in the field 'image' (or 'file'), or as the whole body "
        "with Content-Type: image/* (e.g. image/jpeg)."
    )


def _query(scope: dict[str, Any], route: ImageRoute) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    values: dict[str, str] = {}
    for name, value in parse_qsl(raw, keep_blank_values=True):
        if name not in route.text_fields:
            raise BadRequest(f"Unknown query parameter {name[:100]!r}; this API takes {', '.join(route.text_fields)}.")
        if name in values:
            raise BadRequest(f"The query parameter {name!r} is given twice.")
        values[name] = value
    return values


def _parse_multipart(body: bytes, boundary: bytes, route: ImageRoute, rules: FormRules, form: Form) -> None:
    """Parts straight from the body in memory (python-multipart's parser: what Starlette uses)."""
    max_files = rules.max_batch_images if route.kind == "batch" else 1
    parts: list[tuple[dict[bytes, bytes], list[bytes | memoryview]]] = []
    header: list[bytes] = [b"", b""]  # the header being read: name, value
    ended = False

    def on_part_begin() -> None:
        if len(parts) >= max_files + len(route.text_fields) + 1:
            raise BadRequest(f"Too many parts in the multipart body (more than {max_files} image(s) and the fields).")
        parts.append(({}, []))

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header[0] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header[1] += data[start:end]

    def on_header_end() -> None:
        parts[-1][0][header[0].lower()] = header[1]
        header[0], header[1] = b"", b""

    view = memoryview(body)

    def on_part_data(data: bytes, start: int, end: int) -> None:
        # A view into the body, not a copy: the parser is given the whole body at once (data is body).
        parts[-1][1].append(view[start:end] if data is body else data[start:end])

    def on_end() -> None:
        nonlocal ended
        ended = True

    callbacks: dict[str, Callable[..., None]] = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_part_data": on_part_data,
        "on_end": on_end,
    }
    try:
        parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
        parser.write(body)
        parser.finalize()
    except ApiError:
        raise
    except Exception as exc:  # the parser's errors are about the body
        raise BadRequest(f"The multipart body is malformed: {exc}") from exc
    if not ended:
        raise BadRequest("The multipart body is malformed: it ends before its closing boundary.")
    unknown: list[str] = []
    for headers, chunks in parts:
        disposition, options = parse_options_header(headers.get(b"content-disposition", b""))
        if disposition != b"form-data" or b"name" not in options:
            raise BadRequest("A multipart part has no Content-Disposition: form-data; name=...")
        name = options[b"name"].decode("utf-8", "replace")
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if name in route.file_fields:
            if b"filename" not in options:
                raise ApiError(f"'{name}' must be a file upload, not a text field", code="invalid_image")
            form.images.append(Image(data, options[b"filename"].decode("utf-8", "replace")))
        elif name in route.text_fields:
            if name in form.fields:
                raise BadRequest(f"The field {name!r} is given twice.")
            form.fields[name] = _text(name, data)
        else:
            unknown.append(name)
    if unknown:
        takes = ", ".join((*route.file_fields, *route.text_fields))
        named = ", ".join(repr(name[:100]) for name in sorted(set(unknown))[:10])
        raise BadRequest(f"Unknown form field(s) {named}; this API takes {takes}.")
    if route.kind != "batch" and len(form.images) > 1:
        raise BadRequest("Send one image per request ('image' or 'file', once); several go to POST /classify/batch.")
    if len(form.images) > max_files:
        raise too_many_images(len(form.images), max_files)


def _text(name: str, data: bytes | memoryview) -> str:
    if len(data) > MAX_TEXT_FIELD:
        raise BadRequest(f"The field {name!r} is too long ({len(data)} bytes).")
    try:
        value = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"The field {name!r} is not UTF-8 text.") from exc
    if value.startswith('"'):  # bentoml.SyncHTTPClient sends text fields JSON-encoded
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else value
    return value


def top_k(form: Form, pipeline: Pipeline | None = None) -> int | None:
    """The request's ``top_k`` (1..TOP_K_MAX), or None (the pipeline ranks its default); refused in the words
    of ``pipeline``, which names its family's class count where that is less."""
    if "top_k" not in form.fields:
        return None
    raw = form.fields["top_k"].strip()
    k = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 3 else 0  # plain digits, as the spec says
    if not 1 <= k <= TOP_K_MAX:
        raise Pipeline.top_k_refused(raw, pipeline.models.values() if pipeline else ())
    return k


async def answer(
    pipeline: Pipeline, route: ImageRoute, scope: dict[str, Any], body: bytes, rules: FormRules
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body for one image-route request (never raises for a client's mistake)."""
    state = scope.setdefault("state", {})
    started = time.perf_counter()
    try:
        form = parse(scope, body, route, rules)
        k = top_k(form, pipeline)
        backend = route.backend or form.fields.get("backend", rules.default_backend).strip()
        if route.kind != "compare":
            # The request metric's label (fastinfer.front.http): never a name the client made up, or every
            # made-up name would become a time series of its own.
            state["fastinfer_backend"] = backend if backend in pipeline.backends else "unknown"
        return 200, await run(pipeline, route, form.images, backend, k, cache_use(scope), started)
    except ApiError as exc:
        return exc.status, exc.body()


async def serve(pipeline: Pipeline, scope: dict[str, Any], body: bytes, send: Send, rules: FormRules) -> None:
    """Answer one image-route request on ``send`` (FrontMiddleware's lane)."""
    try:
        status, payload = await answer(pipeline, ROUTES[scope["path"]], scope, body, rules)
    except Exception:  # a bug or a runtime failure, not the client's doing: logged, said plainly
        logger.exception("%s failed", scope["path"])
        status, payload = 500, FAILED
    await send_json(send, status, payload)
