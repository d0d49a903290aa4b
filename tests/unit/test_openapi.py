"""The OpenAPI spec tells the whole API (fastinfer/front/openapi.py), checked on service.py's own service:
BentoML's spec of its typed APIs, with FastInfer's table merged over it."""

from __future__ import annotations

import functools
import json
from typing import Any

import bentoml
import jsonschema
import pytest
import yaml
from bentoml._internal.service.openapi.specification import OpenAPISpecification
from starlette.applications import Starlette
from starlette.routing import Route

from fastinfer.catalog.choice import default_choice
from fastinfer.catalog.config import BACKENDS
from fastinfer.common.schemas import ErrorResponse
from fastinfer.front import openapi
from fastinfer.front.image_routes import ROUTES
from tests.settings import settings_with

IMAGE_ROUTES = [path for path, route in ROUTES.items() if route.kind != "batch"]
ERROR_STATUSES = {"400", "408", "413", "415", "429", "500", "503", "504"}
METHODS = ("get", "post")


@functools.cache
def service() -> bentoml.Service[Any]:
    import service as module  # service.py: importing it declares the service (as `bentoml serve` does)

    return module.FastInfer


def as_json(spec: OpenAPISpecification) -> dict[str, Any]:
    """What /docs.json answers (JSON turns BentoML's int status keys into strings)."""
    return json.loads(json.dumps(spec.asdict()))


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    """BentoML's own spec of the same service."""
    return as_json(bentoml.Service.openapi_spec.fget(service()))


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return as_json(service().openapi_spec)


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
            for media_type, body in op["responses"]["200"].get("content", {}).items():  # with an example beside
                assert full["responses"]["200"]["content"][media_type]["schema"] == body["schema"], (path, media_type)
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


def examples(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any], Any]]:
    """(where, schema, example) of every example the spec holds beside a schema."""
    found = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            media = [("request", m) for m in op.get("requestBody", {}).get("content", {}).values()]
            media += [(status, m) for status, r in op["responses"].items() for m in r.get("content", {}).values()]
            found += [(f"{method} {path} {where}", m["schema"], m["example"]) for where, m in media if "example" in m]
    return found


def test_the_spec_is_openapi_31_and_every_example_is_valid_against_its_schema(spec: dict[str, Any]) -> None:
    """OpenAPI 3.1's schemas are JSON Schema 2020-12, what pydantic writes: a stock validator checks the examples."""
    assert spec["openapi"] == "3.1.0"
    text = json.dumps(spec)
    assert '"nullable"' not in text and '"type": "file"' not in text  # 3.0's word; BentoML's own upload type
    found = examples(spec)
    assert len(found) > 40
    for where, schema, example in found:
        validator = jsonschema.Draft202012Validator({**schema, "components": spec["components"]})
        errors = [e.message for e in validator.iter_errors(example)]
        assert not errors, (where, errors[:3])
    schemas = spec["components"]["schemas"]
    assert schemas["BackendInfo"]["properties"]["reason"]["anyOf"] == [{"type": "string"}, {"type": "null"}]


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


def test_every_mounted_route_and_the_probes_are_documented(spec: dict[str, Any]) -> None:
    mounted = [
        (route.path, method.lower())
        for app, _, _ in service().mount_apps
        if isinstance(app, Starlette)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET route
    ]
    assert len(mounted) == 3
    for path, method in mounted:
        assert method in spec["paths"][path], (path, method)
    assert spec["paths"]["/dashboard/"]["get"]["responses"]["200"]["content"]["text/html"]
    for path in ("/livez", "/readyz", "/metrics"):
        assert spec["paths"][path]["get"]["summary"]
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert [tag["name"] for tag in spec["tags"]] == ["Service APIs", "Infrastructure", "Status"]


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
        assert query["backend"]["schema"]["enum"] == list(BACKENDS)
        assert "default" not in query["backend"]["schema"]
        # Swagger UI preselects the server's default (it would send an empty backend otherwise), as plain text.
        assert form["properties"]["backend"]["default"] == default_choice().backend
        assert "backend" not in body["content"]["multipart/form-data"]["encoding"]
        assert body["content"]["multipart/form-data"]["encoding"]["top_k"] == {"contentType": "application/json"}


def test_summary_is_the_docstrings_first_sentence(spec: dict[str, Any]) -> None:
    assert spec["paths"]["/classify"]["post"]["summary"] == (
        "Classify one image with the chosen backend; returns top-k labels and per-stage timings."
    )
    assert spec["paths"]["/predict"]["post"]["summary"] == "The original FastInfer API's route: PyTorch eager."
    assert openapi.first_sentence("Classify up to N images in one request: decoded\n    in parallel. More.") == (
        "Classify up to N images in one request: decoded in parallel."
    )
    assert openapi.first_sentence("") is None


@pytest.mark.parametrize("path", [*IMAGE_ROUTES, "/classify/batch", "/analyze"])
def test_errors_are_documented_in_the_one_error_shape(spec: dict[str, Any], path: str) -> None:
    responses = spec["paths"][path]["post"]["responses"]
    expected = ERROR_STATUSES if path != "/analyze" else ERROR_STATUSES - {"415"} | {"502"}
    assert set(responses) == {"200"} | expected  # BentoML's 404, and its 400/500 shapes, are gone
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
    settings_with(monkeypatch, FASTINFER_MAX_BATCH_IMAGES="8")  # and the spec's get_settings() reads it afresh
    op = as_json(service().openapi_spec)["paths"]["/classify/batch"]["post"]
    assert "(1 to 8, FASTINFER_MAX_BATCH_IMAGES)" in op["description"]
    assert "more than 8" in op["responses"]["400"]["description"]


def test_the_typed_batch_api_is_documented_not_duplicated(spec: dict[str, Any]) -> None:
    item = spec["paths"]["/classify/batch"]
    assert set(item) == {"post"}
    op = item["post"]
    assert op["x-bentoml-name"] == "classify_batch"  # BentoML's operation, kept
    assert op["summary"].startswith("Classify up to FASTINFER_MAX_BATCH_IMAGES images in one request: decoded in")
    form = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["images"]["items"]["format"] == "binary"
    assert {p["name"] for p in op["parameters"]} == {"backend", "top_k"}
    assert "image/*" not in op["requestBody"]["content"]  # a batch is multipart only
    assert "still answers 200" in op["description"]
    # The method returns a BatchResponse: BentoML's spec says what it holds, each item one or the other.
    ok = op["responses"]["200"]
    assert "One result per image" in ok["description"]
    results = ok["content"]["application/json"]["schema"]["properties"]["results"]["items"]["oneOf"]
    assert {r["$ref"].rsplit("/", 1)[-1] for r in results} == {"ClassifyResponse", "ErrorResponse"}


def test_applying_it_twice_changes_nothing(spec: dict[str, Any]) -> None:
    assert json.loads(json.dumps(openapi.extend_spec(spec, service()))) == spec


def test_spec_object_serves_and_dumps_as_bentoml_expects() -> None:
    """/docs.json calls ``.asdict()``; ``bentoml build`` yaml-dumps the object into apis/openapi.yaml."""
    spec = service().openapi_spec
    assert isinstance(spec, OpenAPISpecification)
    assert yaml.safe_load(yaml.dump(spec)) == as_json(spec)


def test_served_spec_and_the_python_client() -> None:
    """In the running app /docs.json is the full spec, and bentoml.SyncHTTPClient reads /schema.json, which lists
    the typed APIs only (BentoML's, unchanged): it finds them and nothing else."""
    from _bentoml_impl.client.http import SyncHTTPClient  # bentoml.SyncHTTPClient's base, which takes an app

    routes = {route["name"]: route["route"] for route in service().schema()["routes"]}
    assert routes == {"analyze": "/analyze"} | {route.name: path for path, route in ROUTES.items()}
    assert service().schema() == bentoml.Service.schema(service())
    with SyncHTTPClient("http://fastinfer.test", app=service().to_asgi()) as client:
        assert set(client.endpoints) == set(routes)
        docs = client.client.get("/docs.json")
        assert docs.status_code == 200
        assert docs.json() == as_json(service().openapi_spec)


def test_the_spec_is_built_once_not_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """/docs.json is open without a key: building the spec (~40 ms) on every request let an unauthenticated
    flood hold the event loop. It is built again only when what it depends on changes (the settings)."""
    built = []
    monkeypatch.setattr(openapi, "extend_spec", lambda doc, svc: built.append(svc) or doc)
    monkeypatch.setattr(openapi, "_BUILT", [])
    first = service().openapi_spec
    assert service().openapi_spec is first and len(built) == 1
    settings_with(monkeypatch, FASTINFER_MAX_BATCH_IMAGES="7")
    assert service().openapi_spec is not first and len(built) == 2


def test_the_error_descriptions_name_codes_the_server_answers() -> None:
    """api_spec.json writes the codes as text: each one named must be one the server sends."""
    import re

    from tests.unit.test_api_page import documented_codes

    named = {code for _, said in openapi.error_cases(32).values() for code in re.findall(r"`([a-z_]+)`", said)}
    fields = {"images", "results"}  # named in backticks too, as fields
    assert named - fields <= documented_codes(), named - fields - documented_codes()
    assert {"invalid_image", "unsupported_media_type", "rate_limited"} <= named


def test_every_setting_the_spec_names_is_one_that_exists(spec: dict[str, Any]) -> None:
    """A description naming a removed or misspelt variable sends an operator looking for nothing."""
    import re
    import sys
    from pathlib import Path

    from fastinfer.catalog.tuned import REMOVED

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "hooks"))
    import settings_table

    named = set(re.findall(r"\b(?:FASTINFER|GROQ)_[A-Z0-9_]*[A-Z0-9]", json.dumps(spec)))
    assert named and named <= settings_table.documented() - REMOVED.keys(), sorted(named)
