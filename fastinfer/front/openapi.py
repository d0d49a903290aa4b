"""The OpenAPI spec (``/docs.json``, Swagger UI at ``/``) made to tell the whole API.

BentoML's ``Service.openapi_spec`` documents the typed ``@bentoml.api`` methods and mounted FastAPI apps
only: not the mounted Starlette GET routes, the other forms of the image routes (field ``file``, a raw
``image/*`` body with query parameters), the batch route's query parameters and answer, nor the error
shape. :class:`DocumentedService` (``@bentoml.service(service_class=...)``) overrides ``openapi_spec``
only, so ``/docs.json`` and ``bentoml build``'s copy agree, and ``/schema.json`` (what
``bentoml.SyncHTTPClient`` reads) is left alone. :func:`extend_spec` is the whole change.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from typing import Any, TypeVar

import attrs
import bentoml
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.routing import Route

from fastinfer.catalog.choice import default_choice
from fastinfer.catalog.config import Settings, get_settings
from fastinfer.common.errors import (
    ApiError,
    BackendUnavailable,
    BadRequest,
    ImageTooLarge,
    InvalidImage,
    PayloadTooLarge,
    UnknownBackend,
    UnsupportedMediaType,
)
from fastinfer.common.schemas import TOP_K_MAX, BackendsResponse, BatchResponse, ErrorResponse

# The spec's own classes: openapi_spec must return one (bento build yaml-dumps it by its type).
from fastinfer.compat.bentoml import APP_TAG, INFRA_TAG, Contact, OpenAPISpecification, PathItem, Tag
from fastinfer.front import api_examples, api_page
from fastinfer.front.access import ANALYZE_ROUTE
from fastinfer.front.api_models import CacheStatsResponse, LiveStatsResponse
from fastinfer.front.image_api import RAW_TYPES
from fastinfer.front.image_routes import BATCH_FIELD, FILE_FIELDS, ROUTES
from fastinfer.front.paths import is_open

T = TypeVar("T")
REF = "#/components/schemas/{model}"
STATUS_TAG = Tag(name="Status", description="What the service knows about itself: backends, cache, live traffic.")
# BentoML's tags keep their names (its operations refer to them); their descriptions say what ours are.
TAG_DESCRIPTIONS = {
    APP_TAG.name: "Classify, compare and explain: images in, labels and per-stage timings out.",
    INFRA_TAG.name: "Probes and Prometheus metrics (open without a key, never refused for load).",
    STATUS_TAG.name: STATUS_TAG.description,
}
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# What fastinfer/front/image_api.py reads as a raw image body, as media types (its "image/" is a prefix).
RAW_MEDIA_TYPES = tuple(t + "*" if t.endswith("/") else t for t in RAW_TYPES)

ORIGINAL_NOTE = (
    "A route of the original FastInfer API (its FastAPI release), kept so that its clients work unchanged: "
    "the field `file` is accepted, and the answer has its keys `class`, `confidence`, `latency_ms` and `model` "
    "among FastInfer's."
)

# status → (description, its example's case in api_examples.errors): what FrontMiddleware answers on every typed API.
ERRORS: dict[str, tuple[str, str]] = {
    "400": (
        f"The request could not be parsed or a field is invalid (`{BadRequest.code}`, `{ApiError.code}`).",
        "invalid_field",
    ),
    "408": (
        "`request_timeout`: the body stalled for FASTINFER_BODY_IDLE_S or did not arrive within FASTINFER_TIMEOUT_S.",
        "slow_body",
    ),
    "413": (
        "`payload_too_large`: the body is over FASTINFER_MAX_BYTES (refused from Content-Length before it is read).",
        "too_large",
    ),
    "429": (
        "`overloaded`: the server is at FASTINFER_MAX_CONCURRENCY requests or FASTINFER_MAX_UPLOADS uploads; "
        "retry after the `Retry-After` header's seconds.",
        "overloaded",
    ),
    "500": ("`internal_error`: a server fault (logged); never caused by what a client sends.", "failed"),
    "503": (
        "`unavailable`: the server could not take the request now (e.g. no disk left to hold an upload).",
        "unavailable",
    ),
    "504": ("`timeout`: no answer within FASTINFER_TIMEOUT_S.", "timeout"),
}

# What the image routes add to (or say more precisely than) ERRORS.
IMAGE_ERRORS: dict[str, tuple[str, str]] = {
    "400": (
        f"`{InvalidImage.code}`: not an image, truncated or empty; `{UnknownBackend.code}`: the message lists the "
        f"valid backends; `invalid_top_k`: outside 1..{TOP_K_MAX}, or more than the classes of the model family "
        f"served (the message names their count); `{BadRequest.code}` / `{ApiError.code}`: a "
        "malformed body, an unknown form field, or a text value where the file belongs (URLs are never fetched).",
        "invalid_image",
    ),
    "413": (
        f"`{PayloadTooLarge.code}`: the body is over FASTINFER_MAX_BYTES; `{ImageTooLarge.code}`: the image has more "
        "pixels than FASTINFER_MAX_PIXELS (read from its header, never decoded).",
        "image_too_large",
    ),
    "415": (
        f"`{UnsupportedMediaType.code}`: the body is neither multipart/form-data nor an image "
        "(`Content-Type: image/*`).",
        "unsupported",
    ),
    "500": (ERRORS["500"][0], "image_failed"),
    "503": (
        f"`{BackendUnavailable.code}`: the backend cannot run here or its runner is down, with the reason "
        "(see GET /backends); `unavailable`: the server could not take the request now.",
        "backend_unavailable",
    ),
}

# Errors of one route beyond the shared ones (its handler raises them: fastinfer/front/analysis.py).
ROUTE_ERRORS: dict[str, dict[str, tuple[str, str]]] = {
    ANALYZE_ROUTE: {
        "502": ("`analysis_failed`: Groq answered with an error.", "groq_failed"),
        "503": (
            "`analysis_unavailable`: no Groq API key is configured (GROQ_API_KEY or GROQ_API_KEY_FILE).",
            "groq_unavailable",
        ),
        "504": ("`analysis_timeout`: Groq did not answer in time.", "groq_timeout"),
        "429": (
            "`rate_limited`: over FASTINFER_ANALYZE_PER_MINUTE calls from this client or "
            "FASTINFER_ANALYZE_TOTAL_PER_MINUTE from all clients in the last 60 s (each call spends the operator's "
            "Groq quota); `overloaded`: as on every API. Retry after the `Retry-After` header's seconds.",
            "rate_limited",
        ),
    },
}
UNAUTHORIZED = (
    "`unauthorized`: this server sets FASTINFER_API_KEYS and the request has no `Authorization: Bearer <key>` "
    "header, a malformed one, or a key it does not accept.",
    "no_key",
)
SECURITY_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API key from FASTINFER_API_KEYS, sent as `Authorization: Bearer <key>`. Open without one: "
    "the probes, /metrics, this page and the dashboard's files.",
}

# The GET routes beside the typed APIs (BentoML APIs are POST-only): path → summary, description, body.
STATUS_ROUTES: dict[str, tuple[str, str, type[BaseModel]]] = {
    "/backends": (
        "Backends: which can run here, where, and why not",
        "Each backend: available or why not, its models and weights, where it runs (device or execution "
        "providers with node placement and fallbacks; OpenVINO's runtime precision per layer), batching; "
        "the machine (OS, CPU, ISA, Apple chip, Neural Engine, CUDA, MPS) and the backend recommended here, "
        "with why.",
        BackendsResponse,
    ),
    "/cache/stats": (
        "Response cache statistics",
        "Cache mode and health, hits, misses, invalid entries, errors, bypasses, hit rate, key count and since "
        "when. Counts are this front worker's.",
        CacheStatsResponse,
    ),
    "/stats/live": (
        "Live traffic (the dashboard's live panel)",
        "Requests served, how many from the cache, median latency per backend over recent requests, and the "
        "cache statistics. Counts are this front worker's.",
        LiveStatsResponse,
    ),
}
STATUS_ERRORS: dict[str, tuple[str, str]] = {  # FrontMiddleware's, on a GET route
    "413": ("`payload_too_large`: a GET takes no request body (refused before a byte is read).", "get_body"),
    "429": ERRORS["429"],
    "504": ERRORS["504"],
}
# BentoML's probes and /metrics: path → summary, description (BentoML's own speak of Kubernetes in HTML).
INFRA_DOCS = {
    "/healthz": (
        "Liveness probe (deprecated alias of /livez)",
        "200 while the server process is alive; open without a key, never refused for load.",
    ),
    "/livez": ("Liveness probe", "200 while the server process is alive; open without a key, never refused for load."),
    "/readyz": (
        "Readiness probe: 200 once every runner has loaded its model and warmed up",
        "200 once every runner that can run here has loaded its model and run a warm-up inference; 503 before, "
        "while a runner could not load its model (GET /backends says why), and `degraded` while the disk under "
        "the model store is full. Answered within 2 s: a runner that does not answer by then makes it 503 "
        "`not_ready`, naming the runner. "
        "Open without a key, never refused for load.",
    ),
    "/metrics": (
        "Prometheus metrics: FastInfer's beside BentoML's",
        "Prometheus text format: `fastinfer_requests_total{route,backend,status}`, cache, batch sizes and stage "
        "timings beside BentoML's own. Open without a key.",
    ),
}


class DocumentedService(bentoml.Service[T]):
    """A BentoML service whose OpenAPI spec tells the whole FastInfer API (see :func:`extend_spec`)."""

    __slots__ = ()  # BentoML's Service is a slotted attrs class: add no instance __dict__

    @property
    def openapi_spec(self) -> OpenAPISpecification:
        # Built once per (service, settings, serving), not per /docs.json request (~40 ms, open without a key).
        settings, serving = get_settings(), api_page.serving()
        built = _BUILT.get(id(self))
        if built is None or built[0] is not self or built[1] is not settings or built[2] != serving:
            spec = super().openapi_spec
            built = _BUILT[id(self)] = (self, settings, serving, rebuild(spec, extend_spec(spec.asdict(), self)))
        return built[3]


_BUILT: dict[int, tuple[bentoml.Service[Any], Settings, bool, OpenAPISpecification]] = {}


def rebuild(spec: OpenAPISpecification, doc: dict[str, Any]) -> OpenAPISpecification:
    """The spec object again, from its JSON form (operations stay plain dicts, as BentoML's own do)."""
    contact = Contact(**doc["info"]["contact"]) if doc["info"].get("contact") else None
    return attrs.evolve(
        spec,
        info=attrs.evolve(spec.info, **{**doc["info"], "contact": contact}),
        tags=[Tag(**tag) for tag in doc.get("tags", [])],
        paths={path: PathItem(**item) for path, item in doc["paths"].items()},
        components=doc.get("components"),
    )


def extend_spec(doc: dict[str, Any], svc: bentoml.Service[Any]) -> dict[str, Any]:
    """BentoML's spec as JSON → the same with everything FastInfer serves. Only BentoML's error responses
    on the typed APIs are removed (no client ever sees that shape)."""
    doc = copy.deepcopy(doc)
    paths: dict[str, dict[str, Any]] = doc.setdefault("paths", {})
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for item in paths.values():  # asdict keeps BentoML's int status keys; JSON would then hold "400" twice
        for method in METHODS:
            if isinstance(item.get(method), dict) and "responses" in item[method]:
                item[method]["responses"] = {str(k): v for k, v in item[method]["responses"].items()}
    for name, schema in schemas.items():  # BentoML's own components are not all valid 3.0 (see openapi30)
        schemas[name] = openapi30(schema)
    for model in (ErrorResponse, BatchResponse, CacheStatsResponse, LiveStatsResponse, BackendsResponse):
        add_component(schemas, model)
    max_images = get_settings().max_batch_images
    examples = api_examples.errors(get_settings())

    for api in svc.apis.values():
        op = paths.get(api.route, {}).get("post")
        if op is None:
            continue
        op.setdefault("summary", first_sentence(api.doc) or api.name)  # the docstring's, not what is added below
        # BentoML keeps the docstring's indentation: Markdown would show an indented paragraph as code.
        op["description"] = inspect.cleandoc(op.get("description") or "")
        errors = {**ERRORS, **ROUTE_ERRORS.get(api.route, {})}
        if (route := ROUTES.get(api.route)) is not None and route.original and ORIGINAL_NOTE not in op["description"]:
            op["description"] = (op["description"].rstrip() + "\n\n" + ORIGINAL_NOTE).lstrip()
        fields = getattr(api.input_spec, "model_fields", {})
        if FILE_FIELDS[0] in fields:
            errors.update(IMAGE_ERRORS)
            document_image_route(op)
        elif BATCH_FIELD in fields:
            errors.update({**IMAGE_ERRORS, **batch_errors(max_images)})
            document_batch_route(op, max_images)
        op["responses"] = {"200": op["responses"]["200"], **error_responses(errors, examples)}

    for path, (summary, description, model) in STATUS_ROUTES.items():
        if "get" not in paths.get(path, {}):
            paths.setdefault(path, {})["get"] = status_operation(svc.name, path, summary, description, model, examples)
    for path, method, route in mounted_routes(svc):  # anything else mounted: at least listed
        if method not in paths.get(path, {}):
            paths.setdefault(path, {})[method] = {
                "tags": [STATUS_TAG.name if method == "get" else APP_TAG.name],
                "summary": first_sentence(inspect.getdoc(route.endpoint)) or route.name,
                "description": inspect.getdoc(route.endpoint) or "",
                "responses": {"200": {"description": "Successful Response"}},
            }
    if "get" not in paths.get("/dashboard/", {}) and any(name == "dashboard" for _, _, name in svc.mount_apps):
        paths.setdefault("/dashboard/", {})["get"] = {
            "tags": [STATUS_TAG.name],
            "summary": "The dashboard (a web page)",
            "description": "Backends, a live panel, an upload to classify or compare, the benchmark results.",
            "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
        }
    document_infra(paths)
    if get_settings().api_keys:
        require_key(doc, examples)

    if STATUS_TAG.name not in {tag["name"] for tag in doc.setdefault("tags", [])}:
        doc["tags"].append({"name": STATUS_TAG.name})
    for tag in doc["tags"]:
        tag["description"] = TAG_DESCRIPTIONS.get(tag["name"], tag.get("description"))
    add_examples(doc["paths"], bool(get_settings().api_keys))
    # BentoML's info is its placeholder (title "fastinfer", version None, "Contact BentoML Team"): replaced.
    doc["info"] = {**doc.get("info", {}), **api_page.info(get_settings(), svc)}
    return doc


def add_examples(paths: dict[str, dict[str, Any]], key: bool) -> None:
    """Every operation's example: a curl command in its description, and its answer (and request body)
    where it speaks JSON, from fastinfer/front/api_examples.py. ``key``: the server needs an API key."""
    for path, item in paths.items():
        for method in METHODS:
            if not isinstance(op := item.get(method), dict):
                continue
            route = ROUTES.get(path)
            if path == "/dashboard/":
                example = "Open [the dashboard](./dashboard/) in a browser."
            else:
                command = api_examples.curl(path, method, route is not None, key and not is_open(path))
                example = f"```bash\n{command}\n```"
            if example not in (description := op.get("description") or ""):
                op["description"] = f"{description.rstrip()}\n\nExample:\n\n{example}".lstrip()
            if path == ANALYZE_ROUTE and method == "post":
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                if body is not None:
                    body["example"] = api_examples.ANALYZE_REQUEST
            ok = op.get("responses", {}).get("200", {}).get("content", {})
            if "application/json" in ok and (path in ROUTES or path in api_examples.ANSWERS):
                backend = route.backend if route is not None else None
                ok["application/json"]["example"] = api_examples.answer(path, backend)
            elif "text/plain" in ok and path == "/metrics":
                ok["text/plain"]["example"] = api_examples.METRICS


def require_key(doc: dict[str, Any], examples: dict[tuple[str, str], Any]) -> None:
    """Keys are on: every operation that is not open says so (Swagger UI's Authorize button sends the key)."""
    doc["components"].setdefault("securitySchemes", {})["apiKey"] = SECURITY_SCHEME
    for path, item in doc["paths"].items():
        if is_open(path):
            continue
        for method in METHODS:
            if isinstance(op := item.get(method), dict):
                op["security"] = [{"apiKey": []}]
                op.setdefault("responses", {}).update(error_responses({"401": UNAUTHORIZED}, examples))


def document_image_route(op: dict[str, Any]) -> None:
    """Multipart with ``image`` or ``file``, or the raw image as the body with query parameters."""
    body = op.setdefault("requestBody", {"content": {}})
    content: dict[str, Any] = body.setdefault("content", {})
    form = content.get("multipart/form-data", {}).get("schema", {})
    props: dict[str, Any] = form.get("properties", {})
    # `file` is said, not listed: Swagger UI would send it empty beside `image`, and both are refused.
    image, alias = FILE_FIELDS
    if image in props and f"`{alias}`" not in (description := props[image].get("description") or "the image file"):
        props[image]["description"] = description + f"; the field may also be named `{alias}`"
    form.setdefault(
        "description",
        "The image in the field `image` (or `file`, the original FastInfer API's name), the options as form fields.",
    )
    text_as_text(content.get("multipart/form-data", {}))
    for media_type in RAW_MEDIA_TYPES:
        content.setdefault(
            media_type,
            {"schema": {"type": "string", "format": "binary", "description": "the whole image as the request body"}},
        )
    body["required"] = True
    body.setdefault(
        "description",
        "Either multipart/form-data with the image in the field `image` (or `file`, the original FastInfer API's "
        "name) and the options as form fields; or the image itself as the whole body with `Content-Type: image/*` "
        "(image/jpeg, image/png, image/webp, ...; application/octet-stream too) and the options as query "
        "parameters.",
    )
    add_query_parameters(op, {name: schema for name, schema in props.items() if name not in FILE_FIELDS})


def document_batch_route(op: dict[str, Any], max_images: int) -> None:
    """The batch API: its options as query parameters, a description, and BatchResponse as its 200 (its
    method returns ``dict[str, Any]``: SyncHTTPClient would turn BatchResponse's error items into ``{}``)."""
    form = op.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}).get("schema", {})
    options = {name: schema for name, schema in form.get("properties", {}).items() if name != BATCH_FIELD}
    text_as_text(op.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}))
    add_query_parameters(op, options)
    if batch_description(max_images) not in (description := op.get("description") or ""):
        op["description"] = (description.rstrip() + "\n\n" + batch_description(max_images)).strip()
    op.setdefault("responses", {})["200"] = {
        "description": "One result per image, in order (an image that failed has an error instead)",
        "content": {"application/json": {"schema": {"$ref": REF.format(model=BatchResponse.__name__)}}},
    }


def text_as_text(media: dict[str, Any]) -> None:
    """A multipart form's text fields as plain text parts (BentoML marks them ``application/json``, and
    refuses Swagger UI's ``backend=onnx`` typed so), and the server's default backend (else Swagger UI
    sends an empty one)."""
    props: dict[str, Any] = media.get("schema", {}).get("properties", {})
    encoding: dict[str, Any] = media.get("encoding") or {}
    for name, schema in props.items():
        if schema.get("type") == "string" and schema.get("format") != "binary":
            encoding.pop(name, None)
    if not encoding:
        media.pop("encoding", None)
    if "backend" in props:
        props["backend"].setdefault("default", default_choice().backend)


def add_query_parameters(op: dict[str, Any], options: dict[str, Any]) -> None:
    """The form fields but the files, as query parameters too (image_api.py reads both). No ``default``:
    Swagger UI would send it beside the form field, and a value given both ways is refused."""
    params: list[dict[str, Any]] = op.setdefault("parameters", [])
    taken = {(p.get("name"), p.get("in")) for p in params}
    for name, schema in options.items():
        if (name, "query") in taken:
            continue
        said = [(schema.get("description") or schema.get("title") or name).rstrip(".")]
        if "default" in schema:
            said.append(f"default {schema['default']}")
        said.append(
            "a query parameter too, the way to send it with a raw image body (a form field or a query "
            "parameter, not both)"
        )
        params.append(
            {
                "name": name,
                "in": "query",
                "required": False,
                "description": (text := "; ".join(said))[:1].upper() + text[1:] + ".",
                "schema": {k: v for k, v in schema.items() if k not in ("title", "description", "default")},
            }
        )


def batch_description(max_images: int) -> str:
    return (
        f"Multipart only: the field `{BATCH_FIELD}` once per image (1 to {max_images}, FASTINFER_MAX_BATCH_IMAGES), "
        "`backend` and `top_k` as form fields or query parameters. Each image is classified as by POST "
        "/classify, with the same `backend` and `top_k`. The answer has one entry per image, in upload order: "
        "its classification, or its error in the error shape. One bad image does not fail the others: a batch "
        f"whose images are all bad still answers 200 with an error for each. No images, or more than {max_images}, "
        "is a 400."
    )


def batch_errors(max_images: int) -> dict[str, tuple[str, str]]:
    return {
        "400": (
            f"The batch itself is invalid: no `{BATCH_FIELD}` (`{InvalidImage.code}`), more than {max_images} "
            f"(FASTINFER_MAX_BATCH_IMAGES), `{UnknownBackend.code}`, `invalid_top_k`, or a malformed body "
            f"(`{BadRequest.code}`). A bad image is not a 400: it gets an error in its place in `results`.",
            "too_many_images",
        ),
        "415": (IMAGE_ERRORS["415"][0], "unsupported_batch"),
    }


def status_operation(
    service: str, path: str, summary: str, description: str, model: type[BaseModel], examples: dict[Any, Any]
) -> dict[str, Any]:
    return {
        "tags": [STATUS_TAG.name],
        "summary": summary,
        "description": description,
        "operationId": f"{service}__{path.strip('/').replace('/', '_')}",
        "responses": {
            "200": {
                "description": "Successful Response",
                "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
            },
            **error_responses(STATUS_ERRORS, examples),
        },
    }


def document_infra(paths: dict[str, dict[str, Any]]) -> None:
    """What BentoML's probes and /metrics answer, in FastInfer's words."""
    for path, (summary, description) in INFRA_DOCS.items():
        op = paths.get(path, {}).get("get")
        if op is None:
            continue
        op.setdefault("summary", summary)
        if not (op.get("description") or "").startswith(description):  # BentoML's: replaced
            op["description"] = description
    if (metrics := paths.get("/metrics", {}).get("get")) is not None:
        metrics["responses"]["200"].setdefault(
            "content", {"text/plain": {"schema": {"type": "string", "description": "Prometheus text format"}}}
        )
    if (ready := paths.get("/readyz", {}).get("get")) is not None:
        ready["responses"].setdefault(
            "503",
            {"description": "Not ready: a runner is loading, could not load its model or is not answering; disk full"},
        )


def error_responses(errors: dict[str, tuple[str, str]], examples: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Each status's description and its example: the body the server answers in that case."""
    return {
        status: {
            "description": description,
            "content": {
                "application/json": {
                    "schema": {"$ref": REF.format(model=ErrorResponse.__name__)},
                    "example": copy.deepcopy(examples[status, case]),  # not shared: a YAML dump would alias it
                }
            },
        }
        for status, (description, case) in sorted(errors.items())
    }


def add_component(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    """A model and the models it refers to, as OpenAPI 3.0 components (kept where BentoML has one)."""
    schema = model.model_json_schema(ref_template=REF, mode="serialization")
    for name, sub in {**schema.pop("$defs", {}), model.__name__: schema}.items():
        schemas.setdefault(name, openapi30(sub))


def openapi30(node: Any) -> Any:
    """A JSON schema as OpenAPI 3.0 (what BentoML declares) has it: ``nullable: true`` for pydantic's
    ``anyOf [X, {type: null}]``, a binary string for BentoML's ``type: file``."""
    if isinstance(node, list):
        return [openapi30(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: openapi30(value) for key, value in node.items()}
    if node.get("type") == "file":
        node = {**node, "type": "string", "format": node.get("format") or "binary"}
    for key in ("anyOf", "oneOf"):
        choices = node.get(key)
        if isinstance(choices, list) and {"type": "null"} in choices:
            rest = [choice for choice in choices if choice != {"type": "null"}]
            del node[key]
            if len(rest) == 1 and "$ref" in rest[0]:
                node["allOf"] = rest  # in 3.0 a $ref's sibling keys are ignored
            elif len(rest) == 1:
                node = {**rest[0], **node}
            else:
                node[key] = rest
            node["nullable"] = True
    return node


def mounted_routes(svc: bentoml.Service[Any]) -> Iterator[tuple[str, str, Route]]:
    """(path, method, route) of every route of the Starlette apps mounted on the service."""
    for app, mount_path, _ in svc.mount_apps:
        if not isinstance(app, Starlette):
            continue
        if svc.path_prefix:  # spec paths leave the prefix out, as BentoML's generate_spec does
            mount_path = mount_path[len(svc.path_prefix) :]
        for route in app.routes:
            if isinstance(route, Route):
                path = "/" + "/".join(part.strip("/") for part in (mount_path, route.path) if part.strip("/"))
                for method in sorted(route.methods or {"GET"}):
                    if method != "HEAD":  # Starlette adds HEAD to every GET route
                        yield path, method.lower(), route


def first_sentence(text: str | None) -> str | None:
    """A docstring's first sentence, unwrapped: an operation's summary."""
    paragraph = " ".join((text or "").strip().split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "." if paragraph else None
