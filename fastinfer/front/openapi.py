"""The OpenAPI spec (``/docs.json``, Swagger UI at ``/``): BentoML's, with FastInfer's additions (docs/api.md) merged
over it by :func:`extend_spec` from the table :func:`operations`. :class:`DocumentedService` serves it;
``/schema.json`` stays BentoML's.

FastInfer's texts and example answers are api_spec.json's: the answers were recorded from a real ``bentoml serve``
(random-init weights: the labels mean nothing) and shortened; each error's body comes from the constructor the
server answers with (:func:`errors`; tests/unit/test_spec_examples.py compares).
"""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any, TypeVar

import bentoml
from pydantic.json_schema import models_json_schema

from fastinfer.catalog.choice import default_choice
from fastinfer.catalog.config import Settings, get_settings
from fastinfer.common.errors import BackendUnavailable, ImageTooLarge, InvalidImage
from fastinfer.common.schemas import TOP_K_MAX, BackendsResponse, ErrorResponse

# openapi_spec returns BentoML's own spec class: bento build yaml-dumps it by its type.
from fastinfer.compat.bentoml import APP_TAG, INFRA_TAG, OpenAPISpecification, openapi_spec
from fastinfer.front import api_page, http, image_api
from fastinfer.front.access import ANALYZE_ROUTE, NO_KEY, analyze_guard, rate_limited, unauthorized
from fastinfer.front.analysis import GroqFailed, GroqTimeout, GroqUnavailable
from fastinfer.front.api_models import CacheStatsResponse, LiveStatsResponse
from fastinfer.front.image_routes import BATCH_FIELD, ROUTES, ImageRoute
from fastinfer.front.paths import is_open
from fastinfer.serving.preprocess import NOT_AN_IMAGE

T = TypeVar("T")
REF = "#/components/schemas/{model}"
DROP: Any = object()  # in the table: the key goes
BASE_URL = "http://127.0.0.1:3000"
# FastInfer's texts (tags, each error, the GET routes, BentoML's probes and /metrics) and example answers.
SPEC: dict[str, Any] = json.loads(Path(__file__).with_name("api_spec.json").read_text(encoding="utf-8"))
ANSWERS: dict[str, Any] = SPEC["answers"]  # route → the answer its 200 carries (an image route: /classify's)
ANALYZE_REQUEST: dict[str, Any] = SPEC["analyze_request"]
TEXTS: dict[str, str] = SPEC["texts"]
STATUS_TAG = "Status"
# BentoML's two tags keep their names (its operations name them), with what they hold here.
TAGS = {APP_TAG.name: SPEC["tags"]["apis"], INFRA_TAG.name: SPEC["tags"]["infra"], STATUS_TAG: SPEC["tags"]["status"]}
SECURITY_SCHEME = {"type": "http", "scheme": "bearer", "description": TEXTS["api_key"]}
# The GET routes beside the typed APIs (BentoML's are POST only) → their answer; their texts: api_spec.json.
STATUS_ROUTES = {"/backends": BackendsResponse, "/cache/stats": CacheStatsResponse, "/stats/live": LiveStatsResponse}


# The store tags of the models that answered (the batch-1 model for CoreML), for routes with a fixed backend.
MODELS = {r["backend"]: r["model"] for r in ANSWERS["/compare"]["results"]} | dict.fromkeys(
    ("coreml", "coreml-batched"), "resnet50-coreml-b1:2svviehoxoptuax4"
)


def example_answer(route: str, backend: str | None = None) -> dict[str, Any]:
    """The example answer of a JSON API; an image route with a fixed ``backend`` answers as /classify."""
    if route in ANSWERS:
        return ANSWERS[route]
    classify = ANSWERS["/classify"]
    return {**classify, "backend": backend, "model": MODELS[backend]} if backend in MODELS else classify


def curl(route: str, method: str, key: bool) -> str:
    """A working curl command for one operation (``key``: the server needs an API key). A POST's arguments are
    api_spec.json's ``curl``: /predict's for each /predict route (the original API's field ``file``)."""
    auth = ' -H "Authorization: Bearer $FASTINFER_API_KEY"' if key else ""
    args = "" if method == "get" else SPEC["curl"].get(route, SPEC["curl"]["/predict"])
    return " ".join(part for part in ("curl" + auth, args, BASE_URL + route) if part)


def error_bodies(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """(status, case) → the body the server answers, from the constructor it answers with. Messages written
    in place elsewhere are copied here; tests/unit/test_spec_examples.py compares."""
    limit = settings.max_batch_images
    batch = next(route for route in ROUTES.values() if route.kind == "batch")
    return {
        ("400", "invalid_field"): http.validation_error(
            [{"loc": ["question"], "msg": "String should have at most 500 characters"}]
        ),
        ("400", "invalid_image"): InvalidImage(NOT_AN_IMAGE).body(),
        ("400", "too_many_images"): image_api.too_many_images(limit + 1, limit).body(),
        ("401", "no_key"): unauthorized(NO_KEY).body,
        ("408", "slow_body"): http.slow_body(settings.body_idle_s, settings.request_timeout_s),
        ("413", "too_large"): http.too_large(25_000_000, settings.max_bytes),
        ("413", "get_body"): http.no_body("GET", "/backends"),
        ("413", "image_too_large"): ImageTooLarge(
            f"The image holds a picture of 120,000,000 pixels; the limit is {settings.max_pixels:,} "
            "(FASTINFER_MAX_PIXELS). It was not decoded."
        ).body(),
        ("415", "unsupported"): image_api.unsupported("text/csv", ROUTES["/classify"]).body(),
        ("415", "unsupported_batch"): image_api.unsupported("text/csv", batch).body(),
        ("429", "overloaded"): http.overloaded(settings.max_concurrency, settings.max_uploads),
        ("429", "rate_limited"): rate_limited(analyze_guard(settings), ANALYZE_ROUTE, 42).body,
        ("500", "failed"): http.normalise_error(500, b""),  # BentoML's 500, reshaped
        ("500", "image_failed"): image_api.FAILED,
        ("502", "groq_failed"): GroqFailed("Groq answered HTTP 500; try again later.").body(),
        ("503", "unavailable"): http.UNAVAILABLE,
        ("503", "backend_unavailable"): BackendUnavailable(ANSWERS["/backends"]["backends"][1]["reason"]).body(),
        ("503", "groq_unavailable"): GroqUnavailable(
            "AI analysis is off: set GROQ_API_KEY or GROQ_API_KEY_FILE (and restart the service) to enable it."
        ).body(),
        ("504", "timeout"): http.timed_out(settings.request_timeout_s),
        ("504", "groq_timeout"): GroqTimeout(f"Groq did not answer within {settings.groq.timeout_s:g} s.").body(),
    }


def error_cases(max_images: int) -> dict[str, tuple[str, str]]:
    """case → (status, description): every error a route documents; its body is error_bodies' case."""
    return {
        case: (status, said.format(max_images=max_images, top_k_max=TOP_K_MAX))
        for case, (status, said) in SPEC["errors"].items()
    }


# Each route's errors, by case; a later case of the same status replaces an earlier one.
API_ERRORS = ("invalid_field", "slow_body", "too_large", "overloaded", "failed", "unavailable", "timeout")
IMAGE_ERRORS = (*API_ERRORS, "invalid_image", "image_too_large", "unsupported", "image_failed", "backend_unavailable")
BATCH_ERRORS = (*IMAGE_ERRORS, "too_many_images", "unsupported_batch")
ANALYZE_ERRORS = (*API_ERRORS, "groq_failed", "groq_unavailable", "groq_timeout", "rate_limited")
GET_ERRORS = ("get_body", "overloaded", "timeout")


class DocumentedService(bentoml.Service[T]):
    """A BentoML service whose OpenAPI spec tells the whole FastInfer API (see :func:`extend_spec`)."""

    __slots__ = ()  # BentoML's Service is a slotted attrs class: add no instance __dict__

    @property
    def openapi_spec(self) -> OpenAPISpecification:
        # Built once per service, settings and serving, not per /docs.json request (~40 ms, open without a key).
        key = (self, get_settings(), api_page.serving())
        if not _BUILT or any(a is not b for a, b in zip(_BUILT[0], key, strict=True)):
            spec = super().openapi_spec
            _BUILT[:] = [key, openapi_spec(extend_spec(json.loads(json.dumps(spec.asdict())), self))]
        return _BUILT[1]


_BUILT: list[Any] = []  # [key, spec] of the last spec built


def extend_spec(doc: dict[str, Any], svc: bentoml.Service[Any]) -> dict[str, Any]:
    """BentoML's spec as JSON → the same with what FastInfer adds (:func:`operations`) merged over it."""
    settings = get_settings()
    models = [ErrorResponse, *STATUS_ROUTES.values()]  # beyond BentoML's
    schemas = models_json_schema([(model, "serialization") for model in models], ref_template=REF)[1]["$defs"]
    patch = {"paths": operations(settings, svc), "components": {"schemas": schemas}}
    if settings.api_keys:
        patch["components"]["securitySchemes"] = {"apiKey": SECURITY_SCHEME}
    doc = merge(doc, patch)
    doc["components"]["schemas"] = binary_files(doc["components"]["schemas"])
    # BentoML's info is its placeholder (title "fastinfer", version None, "Contact BentoML Team"): replaced.
    return doc | {
        "openapi": "3.1.0",
        "info": {**doc["info"], **api_page.info(settings, svc)},
        "tags": [{"name": n, "description": d} for n, d in TAGS.items()],
    }


def merge(target: Any, patch: Any) -> Any:
    """``patch`` merged over ``target`` (a copy): objects key by key, anything else replaced; DROP removes a key.
    (RFC 7396's merge patch, but that null stays a value: pydantic's defaults and the examples hold nulls.)"""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)  # not shared: a YAML dump would alias it
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is DROP:
            merged.pop(key, None)
        else:
            merged[key] = merge(merged.get(key), value)
    return merged


def binary_files(node: Any) -> Any:
    """BentoML's input components write an upload as ``type: file``, which JSON Schema lacks: a binary string."""
    if isinstance(node, dict):
        return {k: binary_files(v) for k, v in node.items()} | (
            {"type": "string"} if node.get("type") == "file" else {}
        )
    return [binary_files(item) for item in node] if isinstance(node, list) else node


def operations(settings: Settings, svc: bentoml.Service[Any]) -> dict[str, dict[str, Any]]:
    """path → method → what FastInfer says of the operation beyond BentoML: the table :func:`extend_spec` merges."""
    cases, examples = error_cases(settings.max_batch_images), error_bodies(settings)
    table: dict[str, dict[str, Any]] = {}

    def add(path: str, method: str, description: str, errors: tuple[str, ...] = (), **more: Any) -> None:
        locked = bool(settings.api_keys) and not is_open(path)
        example = (
            "Open [the dashboard](./dashboard/) in a browser."
            if path == "/dashboard/"
            else f"```bash\n{curl(path, method, locked)}\n```"
        )
        responses = dict(more.pop("responses", {}))
        for case in (*errors, *(("no_key",) if locked else ())):
            status, said = cases[case]
            body = {"schema": {"$ref": REF.format(model=ErrorResponse.__name__)}, "example": examples[status, case]}
            responses[status] = {"description": said, "content": {"application/json": body}}
        table.setdefault(path, {})[method] = {
            "description": f"{description}\n\nExample:\n\n{example}".lstrip(),
            "responses": responses,
            **({"security": [{"apiKey": []}]} if locked else {}),
            **more,
        }

    for api in svc.apis.values():
        route = ROUTES.get(api.route)
        text = inspect.cleandoc(api.doc or "")
        text += f"\n\n{TEXTS['original']}" if route is not None and route.original else ""
        errors = API_ERRORS if route is None else BATCH_ERRORS if route.kind == "batch" else IMAGE_ERRORS
        more: dict[str, Any] = image_inputs(api, route) if route is not None else {}
        if route is not None and route.kind == "batch":
            text += "\n\n" + TEXTS["batch"].format(field=BATCH_FIELD, max_images=settings.max_batch_images)
        if api.route == ANALYZE_ROUTE:
            errors = ANALYZE_ERRORS
            more["requestBody"] = {"content": {"application/json": {"example": ANALYZE_REQUEST}}}
        answer = example_answer(api.route, route.backend if route is not None else None)
        ok = {"200": {"content": {"application/json": {"example": answer}}}}
        if route is not None and route.kind == "batch":
            ok["200"]["description"] = TEXTS["batch_ok"]
        # BentoML's own error responses go: no client ever sees that shape.
        responses = ok | dict.fromkeys(("400", "404", "500"), DROP)
        add(api.route, "post", text.strip(), errors, summary=first_sentence(api.doc) or api.name, responses=responses)
        table[api.route]["post"] |= more
    for path, model in STATUS_ROUTES.items():
        body = {"schema": {"$ref": REF.format(model=model.__name__)}, "example": example_answer(path)}
        ok = {"200": {"description": "Successful Response", "content": {"application/json": body}}}
        summary, description = SPEC["status_routes"][path]
        operation_id = f"{svc.name}__{path.strip('/').replace('/', '_')}"
        add(path, "get", description, GET_ERRORS, summary=summary, tags=[STATUS_TAG], operationId=operation_id,
            responses=ok)  # fmt: skip
    html = {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}}
    dashboard = SPEC["dashboard"]
    add("/dashboard/", "get", dashboard["description"], summary=dashboard["summary"], tags=[STATUS_TAG], responses=html)
    for path, doc in SPEC["infra"].items():  # BentoML's own text speaks of Kubernetes, in HTML
        add(path, "get", doc["description"], summary=doc["summary"], responses=doc["responses"])
    return table


def image_inputs(api: Any, route: ImageRoute) -> dict[str, Any]:
    """An image route's request: its form as Swagger UI should send it, the same options as query parameters,
    and (but for the batch) the raw image as the whole body."""
    fields = api.input_spec.model_json_schema(mode="serialization")["properties"]
    options = {name: schema for name, schema in fields.items() if name in route.text_fields}
    # Text fields as plain text parts (BentoML marks them application/json), and the server's default backend
    # preselected (else Swagger UI sends an empty one).
    form: dict[str, Any] = {"encoding": {name: DROP for name, s in options.items() if s.get("type") == "string"}}
    if "backend" in options:
        options["backend"]["default"] = default_choice().backend
        form["schema"] = {"properties": {"backend": {"default": options["backend"]["default"]}}}
    inputs: dict[str, Any] = {"parameters": [query_parameter(name, schema) for name, schema in options.items()]}
    inputs["requestBody"] = {"content": {"multipart/form-data": form}}
    if route.kind != "batch":
        raw = {"schema": {"type": "string", "format": "binary", "description": TEXTS["raw_image"]}}
        form.setdefault("schema", {})["description"] = TEXTS["image_form"]
        inputs["requestBody"] |= {"required": True, "description": TEXTS["image_body"]}
        inputs["requestBody"]["content"] |= {t + "*" if t.endswith("/") else t: raw for t in image_api.RAW_TYPES}
    return inputs


def query_parameter(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A form field as a query parameter too (image_api.py reads both). No ``default``: Swagger UI would send it
    beside the form field, and a value given both ways is refused."""
    said = [(schema.get("description") or schema.get("title") or name).rstrip(".")]
    said += [f"default {schema['default']}"] if "default" in schema else []
    text = "; ".join([*said, TEXTS["query_parameter"]])
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": text[:1].upper() + text[1:] + ".",
        "schema": {k: v for k, v in schema.items() if k not in ("title", "description", "default")},
    }


def first_sentence(text: str | None) -> str | None:
    """A docstring's first sentence, unwrapped: an operation's summary."""
    paragraph = " ".join((text or "").strip().split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "." if paragraph else None
