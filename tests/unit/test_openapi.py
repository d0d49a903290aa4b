"""The OpenAPI spec tells the whole API (fastinfer/front/openapi.py), checked on a small service shaped
like FastInfer's: typed image and batch APIs, a Starlette app of GET routes and a static mount beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import bentoml
import pytest
import yaml
from bentoml._internal.service.openapi.specification import OpenAPISpecification
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

from fastinfer.catalog.config import get_settings
from fastinfer.common.schemas import AnalyzeResponse, ClassifyResponse, CompareResponse, ErrorResponse
from fastinfer.front.openapi import DocumentedService, extend_spec, first_sentence, openapi30

Backend = Literal["onnx", "onnx-int8"]
TopK = Annotated[int, Field(ge=1, le=20, description="how many classes to return (1..20)")]
IMAGE_ROUTES = ["/classify", "/predict", "/predict/onnx", "/compare"]
ERROR_STATUSES = {"400", "408", "413", "415", "429", "500", "503", "504"}


class Images:
    @bentoml.api(route="/classify")
    def classify(self, image: Path, backend: Backend = "onnx", top_k: TopK = 5) -> ClassifyResponse:
        """Classify one image with the chosen backend; returns top-k labels.

        Send `Cache-Control: no-cache` to bypass the response cache."""
        raise NotImplementedError

    @bentoml.api(route="/predict")
    def predict(self, image: Path, top_k: TopK = 5) -> ClassifyResponse:
        """The original FastInfer API's route: PyTorch eager."""
        raise NotImplementedError

    @bentoml.api(route="/predict/onnx")
    def predict_onnx(self, image: Path, top_k: TopK = 5) -> ClassifyResponse:
        raise NotImplementedError

    @bentoml.api(route="/compare")
    def compare(self, image: Path, top_k: TopK = 5) -> CompareResponse:
        raise NotImplementedError

    @bentoml.api(route="/analyze")
    def analyze(self, results: list[dict[str, Any]], question: str = "") -> AnalyzeResponse:
        raise NotImplementedError

    @bentoml.api(route="/classify/batch")
    def classify_batch(
        self,
        images: Annotated[list[Path], Field(min_length=1, max_length=32)],
        backend: Backend = "onnx",
        top_k: TopK = 5,
    ) -> dict[str, Any]:  # as image_routes.py: a BatchResponse, typed loosely for bentoml.SyncHTTPClient
        """Classify up to 32 images in one request."""
        raise NotImplementedError


async def _json(_: Request) -> JSONResponse:
    return JSONResponse({})


async def _extra(_: Request) -> JSONResponse:
    """Something else mounted. It is listed all the same."""
    return JSONResponse({})


def make_service(inner: type, name: str) -> bentoml.Service[Any]:
    svc = bentoml.service(name=name, service_class=DocumentedService)(inner)
    routes = [Route(path, _json, methods=["GET"]) for path in ("/backends", "/cache/stats", "/stats/live")]
    svc.mount_asgi_app(Starlette(routes=[*routes, Route("/debug/extra", _extra, methods=["GET"])]), path="/")
    svc.mount_asgi_app(StaticFiles(directory="/nonexistent", check_dir=False), path="/dashboard", name="dashboard")
    return svc


SERVICE = make_service(Images, "tiny")


def as_json(spec: OpenAPISpecification) -> dict[str, Any]:
    """What /docs.json answers (JSON turns BentoML's int status keys into strings)."""
    return json.loads(json.dumps(spec.asdict()))


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    """BentoML's own spec of the same service."""
    return as_json(bentoml.Service.openapi_spec.fget(SERVICE))


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return as_json(SERVICE.openapi_spec)


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    return []


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    return spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]


def test_nothing_bentoml_documented_is_lost(base: dict[str, Any], spec: dict[str, Any]) -> None:
    for path, item in base["paths"].items():
        for method, op in item.items():
            full = spec["paths"][path][method]
            for key in ("x-bentoml-name", "operationId", "tags"):
                assert full.get(key) == op.get(key), (path, key)
            if path != "/classify/batch":  # its dict[str, Any] answer is said to be a BatchResponse
                ours = full["responses"]["200"]  # the same, with an example beside each schema
                assert ours["description"] == op["responses"]["200"]["description"]
                for media_type, body in op["responses"]["200"].get("content", {}).items():
                    assert ours["content"][media_type]["schema"] == body["schema"], (path, media_type)
            for media_type, body in op.get("requestBody", {}).get("content", {}).items():
                assert set(body["schema"]["properties"]) <= set(
                    full["requestBody"]["content"][media_type]["schema"]["properties"]
                )
    assert set(base["components"]["schemas"]) <= set(spec["components"]["schemas"])
    assert {"/livez", "/readyz", "/metrics"} <= set(spec["paths"])


def test_every_reference_resolves(spec: dict[str, Any]) -> None:
    found = refs(spec)
    assert found
    for ref in found:
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[-1] in spec["components"]["schemas"], ref


@pytest.mark.parametrize(
    ("path", "model", "field"),
    [
        ("/backends", "BackendsResponse", "backends"),
        ("/cache/stats", "CacheStatsResponse", "hit_rate"),
        ("/stats/live", "LiveStatsResponse", "p50_ms"),
    ],
)
def test_get_routes_have_summary_and_response_schema(spec: dict[str, Any], path: str, model: str, field: str) -> None:
    op = spec["paths"][path]["get"]
    assert op["summary"] and op["description"]
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": f"#/components/schemas/{model}"}
    assert field in resolve(spec, schema)["properties"]
    assert "post" not in spec["paths"][path]
    assert set(op["responses"]) == {"200", "413", "429", "504"}
    assert "takes no request body" in op["responses"]["413"]["description"]


def test_response_models_are_openapi_30(spec: dict[str, Any]) -> None:
    """No JSON Schema 2020-12 ``{"type": "null"}`` (OpenAPI 3.0 has ``nullable``)."""
    schemas = spec["components"]["schemas"]
    assert schemas["BackendInfo"]["properties"]["reason"] == {
        **schemas["BackendInfo"]["properties"]["reason"],
        "type": "string",
        "nullable": True,
    }
    assert schemas["CacheStatsResponse"]["properties"]["keys"]["nullable"] is True
    assert '"null"' not in json.dumps(
        [schemas[n] for n in ("BackendsResponse", "CacheStatsResponse", "LiveStatsResponse")]
    )


def test_other_mounted_routes_and_infra_are_listed(spec: dict[str, Any]) -> None:
    extra = spec["paths"]["/debug/extra"]
    assert set(extra) == {"get"}  # Starlette's implicit HEAD is not an operation of its own
    assert extra["get"]["summary"] == "Something else mounted."
    assert spec["paths"]["/dashboard/"]["get"]["responses"]["200"]["content"]["text/html"]
    for path in ("/livez", "/readyz", "/metrics"):
        assert spec["paths"][path]["get"]["summary"]
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert {"Service APIs", "Infrastructure", "Status"} <= {tag["name"] for tag in spec["tags"]}


@pytest.mark.parametrize("path", IMAGE_ROUTES)
def test_image_routes_take_file_or_a_raw_body(spec: dict[str, Any], path: str) -> None:
    op = spec["paths"][path]["post"]
    body = op["requestBody"]
    assert body["required"] is True
    assert next(iter(body["content"])) == "multipart/form-data"  # Swagger UI's default form stays BentoML's
    form = body["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["image"]["format"] == "binary"
    # `file` is said, not listed: Swagger UI would send an empty `file` part beside `image`.
    assert "file" not in form["properties"]
    assert "`file`" in form["properties"]["image"]["description"]
    assert "`file`" in form["description"]
    for media_type in ("image/*", "application/octet-stream"):
        assert body["content"][media_type]["schema"] == {
            **body["content"][media_type]["schema"],
            "type": "string",
            "format": "binary",
        }
    query = {p["name"]: p for p in op["parameters"] if p["in"] == "query"}
    assert set(query) == ({"backend", "top_k"} if path == "/classify" else {"top_k"})
    # No default: Swagger UI would send it beside the form field, and both ways at once is a 400.
    assert query["top_k"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 20}
    assert "default 5" in query["top_k"]["description"]
    assert query["top_k"]["required"] is False
    if path == "/classify":
        assert query["backend"]["schema"]["enum"] == ["onnx", "onnx-int8"]
        assert "default" not in query["backend"]["schema"]
        # Swagger UI preselects it (it would send an empty backend otherwise), as plain text.
        # This test service declares its own default (onnx); image_routes.py declares none, and the
        # server's (fastinfer/catalog/choice.py) fills it in: setdefault keeps a declared one.
        assert form["properties"]["backend"]["default"] == "onnx"
        assert "backend" not in body["content"]["multipart/form-data"]["encoding"]
        assert body["content"]["multipart/form-data"]["encoding"]["top_k"] == {"contentType": "application/json"}


def test_summary_is_the_docstrings_first_sentence(spec: dict[str, Any]) -> None:
    assert (
        spec["paths"]["/classify"]["post"]["summary"]
        == "Classify one image with the chosen backend; returns top-k labels."
    )
    assert spec["paths"]["/predict"]["post"]["summary"] == "The original FastInfer API's route: PyTorch eager."
    assert first_sentence("Classify up to N images in one request: decoded\n    in parallel. More.") == (
        "Classify up to N images in one request: decoded in parallel."
    )
    assert first_sentence("") is None


@pytest.mark.parametrize("path", [*IMAGE_ROUTES, "/classify/batch", "/analyze"])
def test_errors_are_documented_in_the_one_error_shape(spec: dict[str, Any], path: str) -> None:
    responses = spec["paths"][path]["post"]["responses"]
    expected = ERROR_STATUSES if path != "/analyze" else ERROR_STATUSES - {"415"} | {"502"}
    assert set(responses) == {"200"} | expected
    for status in expected:
        media = responses[status]["content"]["application/json"]
        assert media["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
        ErrorResponse.model_validate(media["example"])  # the example is a real error body
        assert responses[status]["description"]
    if path != "/analyze":
        assert "invalid_image" in responses["400"]["description"]
    error = spec["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"]
    assert set(resolve(spec, error["properties"]["error"])["required"]) == {"code", "message"}


def test_batch_limit_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTINFER_MAX_BATCH_IMAGES", "8")
    get_settings.cache_clear()
    try:
        op = as_json(SERVICE.openapi_spec)["paths"]["/classify/batch"]["post"]
    finally:
        monkeypatch.delenv("FASTINFER_MAX_BATCH_IMAGES")
        get_settings.cache_clear()
    assert "(1 to 8, FASTINFER_MAX_BATCH_IMAGES)" in op["description"]
    assert "more than 8" in op["responses"]["400"]["description"]


def test_the_typed_batch_api_is_documented_not_duplicated(spec: dict[str, Any]) -> None:
    item = spec["paths"]["/classify/batch"]
    assert set(item) == {"post"}
    op = item["post"]
    assert op["x-bentoml-name"] == "classify_batch"  # BentoML's operation, kept
    assert op["summary"] == "Classify up to 32 images in one request."
    form = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["images"]["items"]["format"] == "binary"
    assert {p["name"] for p in op["parameters"]} == {"backend", "top_k"}
    assert "image/*" not in op["requestBody"]["content"]  # a batch is multipart only
    assert "still answers 200" in op["description"]
    assert "more than 32" in op["responses"]["400"]["description"]
    # The method returns dict[str, Any] (for bentoml.SyncHTTPClient); the spec says what it holds.
    ok = op["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/BatchResponse"}
    assert "One result per image" in ok["description"]
    results = spec["components"]["schemas"]["BatchResponse"]["properties"]["results"]["items"]["anyOf"]
    assert {r["$ref"].rsplit("/", 1)[-1] for r in results} == {"ClassifyResponse", "ErrorResponse"}


def test_applying_it_twice_changes_nothing(base: dict[str, Any], spec: dict[str, Any]) -> None:
    assert json.loads(json.dumps(extend_spec(spec, SERVICE))) == spec


def test_spec_object_serves_and_dumps_as_bentoml_expects() -> None:
    """/docs.json calls ``.asdict()``; ``bentoml build`` yaml-dumps the object into apis/openapi.yaml."""
    spec = SERVICE.openapi_spec
    assert isinstance(spec, OpenAPISpecification)
    dumped = yaml.safe_load(yaml.dump(spec))
    assert set(dumped["paths"]) == set(as_json(spec)["paths"])


def test_python_client_still_sees_the_typed_apis() -> None:
    """bentoml.SyncHTTPClient reads /schema.json, which lists the typed APIs only (unchanged)."""
    routes = {route["name"]: route["route"] for route in SERVICE.schema()["routes"]}
    assert routes == {
        "classify": "/classify",
        "predict": "/predict",
        "predict_onnx": "/predict/onnx",
        "compare": "/compare",
        "analyze": "/analyze",
        "classify_batch": "/classify/batch",
    }
    assert SERVICE.schema() == bentoml.Service.schema(SERVICE)


def test_served_spec_and_the_python_client() -> None:
    """In the running app /docs.json is the full spec, and bentoml.SyncHTTPClient (which reads
    /schema.json) finds the typed APIs and nothing else."""
    from _bentoml_impl.client.http import SyncHTTPClient  # bentoml.SyncHTTPClient's base, which takes an app

    with SyncHTTPClient("http://fastinfer.test", app=SERVICE.to_asgi()) as client:
        assert set(client.endpoints) == {"classify", "predict", "predict_onnx", "compare", "analyze", "classify_batch"}
        docs = client.client.get("/docs.json")
        assert docs.status_code == 200
        assert "/classify/batch" in docs.json()["paths"]
        assert "image/*" in docs.json()["paths"]["/classify"]["post"]["requestBody"]["content"]


def test_openapi30() -> None:
    assert openapi30({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}) == {
        "type": "integer",
        "default": None,
        "nullable": True,
    }
    assert openapi30({"anyOf": [{"$ref": "#/x"}, {"type": "null"}]}) == {"allOf": [{"$ref": "#/x"}], "nullable": True}
    assert openapi30({"type": "file", "format": "binary", "title": "Image"}) == {
        "type": "string",
        "format": "binary",
        "title": "Image",
    }
    assert openapi30({"anyOf": [{"type": "integer"}, {"type": "string"}]}) == {
        "anyOf": [{"type": "integer"}, {"type": "string"}]
    }


def test_the_spec_is_built_once_not_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """/docs.json is open without a key: building the spec (~40 ms) on every request let an unauthenticated
    flood hold the event loop. It is built again only when what it depends on changes (the settings)."""
    import fastinfer.front.openapi as openapi

    built = []
    monkeypatch.setattr(openapi, "extend_spec", lambda doc, svc: built.append(svc) or extend_spec(doc, svc))
    monkeypatch.setattr(openapi, "_BUILT", {})
    first = SERVICE.openapi_spec
    assert SERVICE.openapi_spec is first and len(built) == 1
    monkeypatch.setenv("FASTINFER_MAX_BATCH_IMAGES", "7")
    get_settings.cache_clear()
    try:
        assert SERVICE.openapi_spec is not first and len(built) == 2
    finally:
        get_settings.cache_clear()
