"""The API page speaks FastInfer (fastinfer/front/api_page.py, fastinfer/front/openapi.py): info, examples,
the page at ``/``. Checked on service.py's service in process; tests/integration/test_api_page.py checks a
real server's."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fastinfer import __version__
from fastinfer.catalog.backends import SPECS
from fastinfer.catalog.config import _contact, get_settings
from fastinfer.common import hardware
from fastinfer.common.schemas import AnalyzeResponse, BackendsResponse, BatchResponse, ClassifyResponse, CompareResponse
from fastinfer.front import api_page, openapi
from fastinfer.front.api_inputs import AnalyzeInput
from fastinfer.front.api_models import CacheStatsResponse, LiveStatsResponse
from fastinfer.front.image_routes import ROUTES
from fastinfer.front.openapi import STATUS_ROUTES
from tests.asgi import Recorder, raw, request
from tests.settings import settings_with
from tests.spec_checks import spec_problems
from tests.unit.test_openapi import as_json, base, service, spec  # noqa: F401 (fixtures)

PAGE = api_page.PAGE.read_text(encoding="utf-8")


def test_bentoml_s_own_spec_is_what_the_check_refuses(base: dict[str, Any]) -> None:  # noqa: F811
    problems = spec_problems(base)
    assert "title is 'fastinfer'" in problems and "version is 'None'" in problems
    assert "framework placeholder 'Machine Learning Service created with BentoML'" in problems
    assert "framework placeholder 'BentoML Team'" in problems
    assert "POST /classify: no example" in problems and "GET /readyz: no example" in problems


def test_the_spec_speaks_fastinfer(spec: dict[str, Any]) -> None:  # noqa: F811
    info = spec["info"]
    assert info["title"] == "FastInfer" and info["version"] == __version__
    assert info["contact"] == {"name": "FastInfer"}
    # Not a running server here (as in `bentoml build`): the page, without what a server is set to.
    assert info["description"] == PAGE.rstrip() + "\n"
    assert spec_problems(spec) == []


def test_this_server_says_how_it_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api_page, "serving", lambda: True)  # as in a worker of `bentoml serve`
    settings = settings_with(
        monkeypatch,
        FASTINFER_API_KEYS="k" * 20,
        FASTINFER_MAX_BATCH_IMAGES="7",
        FASTINFER_DEFAULT_BACKEND="openvino-int8",
        FASTINFER_CONTACT="Platform team <ops@example.org>",
    )
    info = api_page.info(settings, service())
    assert info["description"].startswith(PAGE.rstrip())
    server = info["description"].split("## This server", 1)[1]
    assert "API keys: required" in server and "export FASTINFER_API_KEY=<your key>" in server
    assert "up to 7 images" in server and "`openvino-int8`" in server
    assert "Contact: Platform team, [ops@example.org](<mailto:ops@example.org>)." in server
    assert "k" * 20 not in info["description"]
    assert info["contact"] == {"name": "Platform team", "email": "ops@example.org"}


def test_the_contact_line() -> None:
    assert "FASTINFER_CONTACT" in api_page.contact_line({})  # none set: says how to name one
    url = {"name": "Ops", "url": "https://ops.example.org/a_(b)"}
    assert api_page.contact_line(url) == "[Ops](<https://ops.example.org/a_(b)>)"
    assert api_page.contact_line({"name": "Team_*x* [y]"}) == r"Team\_\*x\* \[y\]"  # shown as written


def test_serving_is_a_worker_of_bentoml_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """BentoML sets the worker index in every worker it starts (_bentoml_impl/worker/service.py),
    never in `bentoml build` or here: only a server's page says what the server is set to."""
    from bentoml._internal.context import server_context

    assert not api_page.serving() and "## This server" not in api_page.info(get_settings(), service())["description"]
    monkeypatch.setattr(server_context, "worker_index", 1)
    assert api_page.serving() and "## This server" in api_page.info(get_settings(), service())["description"]


@pytest.mark.parametrize(
    ("raw", "contact"),
    [
        ("", {}),
        ("https://ops.example.org/a", {"name": "https://ops.example.org/a", "url": "https://ops.example.org/a"}),
        ("HTTPS://OPS.EXAMPLE.ORG", {"name": "HTTPS://OPS.EXAMPLE.ORG", "url": "HTTPS://OPS.EXAMPLE.ORG"}),
        ("ops@example.org", {"name": "ops@example.org", "email": "ops@example.org"}),
        ("mailto:ops@example.org", {"name": "ops@example.org", "email": "ops@example.org"}),
        ("MAILTO:ops@example.org", {"name": "ops@example.org", "email": "ops@example.org"}),
        ("Platform team <ops@example.org>", {"name": "Platform team", "email": "ops@example.org"}),
        ("Ops <https://ops.example.org>", {"name": "Ops", "url": "https://ops.example.org"}),
        ("Platform team, #ml-serving ☃", {"name": "Platform team, #ml-serving ☃"}),
    ],
)
def test_contact(raw: str, contact: dict[str, str]) -> None:
    assert _contact(raw) == contact


@pytest.mark.parametrize(
    "raw",
    [
        *(
            "ftp://x",
            "a@b",
            "x" * 201,
            "two\nlines",
            "javascript://alert(1)",
            "Ops <>",
            "<script>",
            'https://x.org/"><b>',
        ),
        # A name with markup, before a valid address: the page is Markdown that Swagger UI renders as HTML.
        *("<script>alert(1)</script> <o@x.io>", "a <b> <c@d.ef>", "<img src=https://e.example/x.png> <o@x.io>"),
        *("x@y.z?subject=hi", "user:pw@host.com", "ops@x.org)"),
    ],
)
def test_contact_refuses_what_it_cannot_show(raw: str) -> None:
    with pytest.raises(ValueError, match="FASTINFER_CONTACT"):
        _contact(raw)


def test_the_page_names_every_backend_in_order_and_every_route() -> None:
    table = re.findall(r"^\| `([a-z0-9-]+)` \|", PAGE, flags=re.MULTILINE)[1:]  # under the header `backend`
    assert table == list(SPECS)
    for route in [*ROUTES, *STATUS_ROUTES, "/analyze", "/dashboard/", "/metrics", "/livez", "/readyz"]:
        assert f"`{route}`" in PAGE or f"`POST {route}`" in PAGE or f"`GET {route}`" in PAGE, route


def test_each_status_route_answers_its_own_even_under_a_root_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """service.py's GET routes, mounted under a prefix (uvicorn's --root-path): each its own handler."""
    import httpx

    import service as service_module

    class Stub:
        async def backends(self) -> dict[str, str]:
            return {"route": "/backends"}

        async def live_stats(self) -> dict[str, str]:
            return {"route": "/stats/live"}

        class pipeline:
            class cache:
                @staticmethod
                async def describe() -> dict[str, str]:
                    return {"route": "/cache/stats"}

    monkeypatch.setattr(service_module.bentoml, "get_current_service", Stub)
    (app,) = [app for app, path, _ in service_module.FastInfer.mount_apps if path == "/"]

    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path="/api")
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/api" + path)

    assert list(service_module.STATUS_ANSWERS) == list(STATUS_ROUTES)  # served and documented: the same paths
    for path in STATUS_ROUTES:
        assert asyncio.run(get(path)).json() == {"route": path}


EXAMPLE_MODELS: list[tuple[str, Any, type[BaseModel]]] = [
    ("CLASSIFY", openapi.ANSWERS["/classify"], ClassifyResponse),
    ("BATCH", openapi.ANSWERS["/classify/batch"], BatchResponse),
    ("COMPARE", openapi.ANSWERS["/compare"], CompareResponse),
    ("ANALYZE", openapi.ANSWERS["/analyze"], AnalyzeResponse),
    ("ANALYZE_REQUEST", openapi.ANALYZE_REQUEST, AnalyzeInput),
    ("BACKENDS", openapi.ANSWERS["/backends"], BackendsResponse),
    ("CACHE_STATS", openapi.ANSWERS["/cache/stats"], CacheStatsResponse),
    ("LIVE_STATS", openapi.ANSWERS["/stats/live"], LiveStatsResponse),
]


@pytest.mark.parametrize(("name", "example", "model"), EXAMPLE_MODELS, ids=[e[0] for e in EXAMPLE_MODELS])
def test_every_example_is_a_valid_answer(name: str, example: Any, model: type[BaseModel]) -> None:
    model.model_validate(example)
    fields = {f.alias or n for n, f in model.model_fields.items()}
    assert set(example) <= fields, f"{name} has keys {set(example) - fields} that {model.__name__} does not"


def test_the_backends_example_shows_every_field_and_setting_a_server_answers(monkeypatch) -> None:
    """GET /backends' example is hand-written: it must not fall behind what a real answer carries."""
    from fastinfer.catalog import choice

    backends = openapi.ANSWERS["/backends"]
    assert set(backends) == set(BackendsResponse.model_fields)
    settings = settings_with(monkeypatch, *(n for n in os.environ if n.startswith("FASTINFER_")))
    shown = choice.configuration(settings, choice.default_choice())
    assert list(backends["configuration"]) == list(shown)


def test_examples_sit_where_swagger_shows_them(spec: dict[str, Any]) -> None:  # noqa: F811
    classify = spec["paths"]["/classify"]["post"]
    assert classify["responses"]["200"]["content"]["application/json"]["example"] == openapi.ANSWERS["/classify"]
    assert (
        "curl -F image=@cat.jpg -F backend=onnx-int8 -F top_k=3 http://127.0.0.1:3000/classify"
        in (classify["description"])
    )
    onnx = spec["paths"]["/predict/onnx"]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    assert onnx["backend"] == "onnx" and onnx["model"].startswith("resnet50-onnx:")
    analyze = spec["paths"]["/analyze"]["post"]
    assert analyze["requestBody"]["content"]["application/json"]["example"] == openapi.ANALYZE_REQUEST
    backends = spec["paths"]["/backends"]["get"]
    assert backends["responses"]["200"]["content"]["application/json"]["example"] == openapi.ANSWERS["/backends"]


def test_original_routes_say_what_they_are(spec: dict[str, Any]) -> None:  # noqa: F811
    predict = spec["paths"]["/predict"]["post"]  # its summary: test_openapi.py
    assert (
        "original FastInfer API (its FastAPI release), kept so that its clients work unchanged"
        in (predict["description"])
    )
    assert "original FastInfer API" not in spec["paths"]["/classify"]["post"]["description"]


def test_examples_carry_the_key_when_keys_are_on(monkeypatch: pytest.MonkeyPatch) -> None:
    settings_with(monkeypatch, FASTINFER_API_KEYS="k" * 20)  # and the spec's get_settings() reads it afresh
    locked = as_json(service().openapi_spec)
    assert "Authorization: Bearer $FASTINFER_API_KEY" in locked["paths"]["/classify"]["post"]["description"]
    assert "Authorization" not in locked["paths"]["/livez"]["get"]["description"]  # open paths need none


def test_the_page_at_root_is_fastinfer_s_and_loads_nothing_from_elsewhere() -> None:
    app = Recorder()
    page = request(api_page.ApiPage(app), "GET", "/")
    assert not app.paths and page.status_code == 200
    html = page.text
    assert "<title>FastInfer API</title>" in html
    assert "BentoML" not in html and "googletagmanager" not in html
    assert not re.search(r"(src|href)=\"https?://", html)
    # Swagger UI would send the spec's address to its validator from any host but localhost.
    assert "validatorUrl: null" in html and "swagger-initializer.js" not in html
    (script,) = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)  # the one inline script
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = page.headers["content-security-policy"]
    assert f"script-src 'self' 'sha256-{digest}'" in policy and "default-src 'self'" in policy
    # Raw: httpx drops a HEAD's body, and what is checked is that the page sends none.
    head = raw(api_page.ApiPage(app), {"method": "HEAD", "path": "/"})
    assert head[1]["body"] == b"" and dict(head[0]["headers"])[b"content-length"] == str(len(html)).encode()
    for method, path in [("POST", "/"), ("GET", "/docs.json"), ("GET", "/classify")]:
        assert request(api_page.ApiPage(app), method, path).text == "reached", (method, path)  # on to the app
    assert app.paths == ["/", "/docs.json", "/classify"]


def documented_codes() -> set[str]:
    """Every error code the server answers with: its error classes, the front's, the documented ones."""
    import fastinfer.front.analysis  # noqa: F401 (its errors)
    from fastinfer.common import errors
    from fastinfer.front import http

    def subclasses(cls: type) -> list[type]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    codes = {cls.code for cls in subclasses(errors.ApiError)}
    codes |= set(http._STATUS_CODES.values()) | set(http._FIELD_CODES.values())
    codes |= {body["error"]["code"] for body in openapi.error_bodies(get_settings()).values()}  # the documented
    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "fastinfer").rglob("*.py"), *(root / "runners").rglob("*.py"), root / "service.py"]:
        codes |= set(re.findall(r'(?:code=|error_body\()\s*"([a-z_]+)"', path.read_text()))
    return codes


def test_the_page_lists_every_error_code() -> None:
    codes = documented_codes()
    assert {"invalid_request", "unauthorized", "rate_limited", "analysis_failed", "request_timeout"} <= codes
    missing = sorted(code for code in codes if f"`{code}`" not in PAGE)
    assert missing == [], f"api_page.md does not list {missing}"


@pytest.mark.parametrize(
    ("tuned", "said"),
    [
        ({}, "no tuned configuration (`fastinfer tune` measures one): defaults and rules"),
        (
            {"status": "in force", "path": "/h/tuned/tuned.json", "created": "today", "goal": "throughput"},
            "the tuned configuration is in force (/h/tuned/tuned.json, today, goal throughput)",
        ),
        (
            {"status": "ignored", "path": "/h/tuned/tuned.json", "why": "tuned on another machine (isa)"},
            "the tuned configuration /h/tuned/tuned.json is ignored: tuned on another machine (isa)",
        ),
        (  # a newline in the file cannot end the list item and start its own Markdown
            {"status": "ignored", "path": "tuned.json", "why": "runtime (fastinfer 9\n\n## Pay here\n\n| a | b |)"},
            r"the tuned configuration tuned.json is ignored: runtime (fastinfer 9 \#\# Pay here \| a \| b \|)",
        ),
        (  # the reason quotes the file's own values: shown as written, never as Markdown
            {"status": "ignored", "path": "tuned.json", "why": "FASTINFER_X='![a](http://e/x.png)<b>' is unknown"},
            r"the tuned configuration tuned.json is ignored: FASTINFER\_X='!\[a\](http://e/x.png)\<b\>' is unknown",
        ),
    ],
)
def test_this_server_says_which_configuration_is_in_force(tuned, said) -> None:
    server = api_page.this_server(get_settings().model_copy(update={"tuned": tuned}), service())
    assert f"- Configuration: {said}" in server


# the environment → what the page's "This server" says, on one line
@pytest.mark.parametrize(
    ("env", "said"),
    [
        # Each worker counts alone (fastinfer/front/access.py share): at least 1 each, so 4 in all, not the 1 asked.
        ({"FASTINFER_FRONT_WORKERS": "4", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "1"},
         ["1 in all per minute per front worker (4 workers: up to 4 in all)"]),
        ({"FASTINFER_DEFAULT_BACKEND": "coreml"}, [] if hardware.is_macos() else [
            "default backend `coreml` (FASTINFER_DEFAULT_BACKEND), which cannot run here: CoreML prediction needs macOS"
        ]),
        ({"FASTINFER_FRONT_WORKERS": "2"},
         ["- Its values and where each came from: ", "`FASTINFER_FRONT_WORKERS` 2 (environment)",
          "`FASTINFER_DEFAULT_BACKEND` ", "`FASTINFER_RUNNER_WORKERS` 1 (default)"]),
        ({"FASTINFER_BACKENDS": "onnx,onnx-int8"},
         ["- Backends: serves `onnx`, `onnx-int8`; switched off by `FASTINFER_BACKENDS` (503): `pytorch`,"]),
        ({}, ["- Backends: every backend switched on (`FASTINFER_BACKENDS` unset)"]),
    ],
)  # fmt: skip
def test_this_server_says_how_it_is_set_line_by_line(monkeypatch, env: dict[str, str], said: list[str]) -> None:
    unset = ("FASTINFER_BACKENDS", "FASTINFER_FRONT_WORKERS", "FASTINFER_RUNNER_WORKERS")
    server = api_page.this_server(settings_with(monkeypatch, *unset, **env), service())
    line = next(x for x in server.splitlines() if said[0] in x) if said else ""
    assert all(words in line for words in said), server
