"""Every error example in the spec is what the server answers in that case (fastinfer/front/openapi.py errors).

Each case is sent, in process, to a server wired as service.py wires it: FrontMiddleware with the options service.py
gives it (fastinfer/front/http.py front_options: limits, access check, image lanes over a real pipeline with a
stand-in runner) in front of a BentoML service whose /analyze takes the real AnalyzeInput and answers with
service.py's handler (fastinfer/front/analysis.py answer; Groq: tests/fake_groq.py). Nothing else stands in: the
GET requests are answered by the front before any route. The headers the spec and the API page document (429:
``Retry-After``; 401: the ``WWW-Authenticate`` of its bearer scheme) are compared too, and no other case sends
them. A constructor whose output changes without its example, or an example written by hand that drifts, fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import bentoml
import httpx
import pytest
from starlette.responses import JSONResponse

from fastinfer.catalog import backends, holdings
from fastinfer.catalog.config import GroqConfig, Settings, get_settings
from fastinfer.common import hardware
from fastinfer.common.schemas import AnalyzeResponse
from fastinfer.front import analysis, api_page, http, image_api, openapi
from fastinfer.front.access import ANALYZE_ROUTE, GUARDED, NO_KEY, analyze_guard, rate_limited, unauthorized
from fastinfer.front.api_inputs import AnalyzeInput
from fastinfer.front.http import FrontMiddleware, front_options
from fastinfer.front.image_routes import ROUTES
from fastinfer.serving.cache import MemoryCache
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.live import LiveStats
from fastinfer.serving.pipeline import Pipeline
from tests import images
from tests.fake_groq import FakeGroq
from tests.unit.test_family_serving import info

KEY = "example-key-0123456789"
RATE_LIMITED_WAIT_S = 42  # the rate_limited example's wait (openapi.errors)
DOCUMENTED_HEADERS = ("retry-after", "www-authenticate")  # compared on every case: sent where documented only
GROQ_CONFIG: ContextVar[GroqConfig] = ContextVar("groq_config")  # the /analyze handler's Groq, set by server()


@pytest.fixture(scope="module")
def groq() -> Iterator[FakeGroq]:
    with FakeGroq() as fake:
        yield fake


@pytest.fixture(scope="module")
def settings(groq: FakeGroq) -> Settings:
    return get_settings().model_copy(
        update=dict(
            request_timeout_s=3,  # more than Groq's, below
            body_idle_s=1,
            max_concurrency=1,
            max_batch_images=2,
            api_keys=(KEY,),
            groq=GroqConfig(api_key="groq-key", base_url=groq.url, timeout_s=1),
        )
    )


def documented_headers(settings: Settings) -> dict[tuple[str, str], dict[str, str]]:
    """(status, case) → the headers documented for it, from the constructors the server sends them with. The other
    cases send none of DOCUMENTED_HEADERS."""
    guard = analyze_guard(settings)
    sent = {
        ("401", "no_key"): unauthorized(NO_KEY).headers,
        ("429", "overloaded"): http.RETRY_SHORTLY,
        ("429", "rate_limited"): rate_limited(guard, ANALYZE_ROUTE, RATE_LIMITED_WAIT_S).headers,
    }
    return {case: {k.decode(): v.decode() for k, v in headers} for case, headers in sent.items()}


def png_header(width: int, height: int) -> bytes:
    """A PNG of that size, as far as its header says (nothing to decode: the server reads the header only)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


class Failing:
    """A stand-in runner that fails (a bug, not the client's doing)."""

    async def engine(self, backend: str) -> str:
        return f"stand-in for {backend}"

    async def __call__(self, *args: Any) -> Any:
        raise RuntimeError("the runner broke")


def coreml_unavailable(name: str) -> str | None:
    """Why CoreML cannot run here, as the catalog says it with its models stored."""
    return backends.unavailable_reason(name) if name == "coreml" else None


# Without BentoML's request metrics: they register once per process, and another test's app may have.
@bentoml.service(name="spec-examples", metrics={"enabled": False})
class Examples:
    @bentoml.api(route=ANALYZE_ROUTE, input_spec=AnalyzeInput)
    async def analyze(self, results: list[dict[str, Any]], question: str, ctx: bentoml.Context) -> AnalyzeResponse:
        """service.py's handler, after two faults of its own: a bug, and a handler slower than the deadline."""
        if question == "bug":
            raise RuntimeError("a bug")
        if question == "slow":
            await asyncio.sleep(10)
        groq = GroqConfig() if question == "no key" else GROQ_CONFIG.get()
        return await analysis.answer(results, question, groq, ctx)


@functools.cache
def bentoml_app() -> Any:
    return Examples.to_asgi()


@dataclass
class Server:
    """A client of the server (with the key), and what the cases set: the settings, Groq, the guard's clock."""

    client: httpx.AsyncClient
    settings: Settings
    groq: FakeGroq
    now: float = 0.0  # the /analyze guard's clock


@contextlib.asynccontextmanager
async def server(monkeypatch: pytest.MonkeyPatch, settings: Settings, groq: FakeGroq) -> AsyncIterator[Server]:
    monkeypatch.setattr(holdings, "serving", lambda *_: "stored")  # the models are built and stored
    names = list(backends.SPECS)
    pipeline = Pipeline(
        names,
        {name: info(name) for name in names},
        coreml_unavailable,
        Failing(),
        Failing().engine,
        MemoryCache(max_entries=10, ttl_s=60),
        CpuPool(1),
        LiveStats(),
        settings.max_pixels,
    )
    rules = image_api.FormRules("onnx", settings.max_batch_images)
    options = front_options(
        settings, ROUTES, lambda scope, body, send: image_api.serve(pipeline, scope, body, send, rules)
    )
    front = FrontMiddleware(bentoml_app(), **options)
    GROQ_CONFIG.set(settings.groq)
    try:
        async with front.app.router.lifespan_context(front.app):
            transport = httpx.ASGITransport(front)
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
                served = Server(client, settings, groq)
                options["access"].guards[ANALYZE_ROUTE].clock = lambda: served.now
                yield served
    finally:
        pipeline.cpu.close()


Send = Callable[[Server], Awaitable[httpx.Response]]


def raw(path: str, body: bytes, content_type: str) -> Send:
    return lambda s: s.client.post(path, content=body, headers={"content-type": content_type})


def analyze(question: str) -> Send:
    return lambda s: s.client.post(ANALYZE_ROUTE, json={"results": [{"class": "tabby"}], "question": question})


async def too_many_images(s: Server) -> httpx.Response:
    files = [("images", (f"{n}.png", b"x")) for n in range(s.settings.max_batch_images + 1)]
    return await s.client.post("/classify/batch", files=files)


async def slow_body(s: Server) -> httpx.Response:
    async def stalls() -> AsyncIterator[bytes]:
        yield b"x"
        await asyncio.sleep(3)

    return await s.client.post("/classify", content=stalls(), headers={"content-type": "image/png"})


async def while_busy(s: Server) -> httpx.Response:
    """A request while the one handling slot is taken."""
    busy = asyncio.ensure_future(analyze("slow")(s))
    await asyncio.sleep(0.3)
    try:
        return await s.client.get("/backends")
    finally:
        await busy


async def over_the_limit(s: Server) -> httpx.Response:
    """A client that has made all its calls of the last minute (42 s before the window frees one)."""
    for _ in range(s.settings.analyze_per_minute):  # each recorded as it reaches Groq, whatever Groq answers
        await analyze("")(s)
    s.now += 60 - RATE_LIMITED_WAIT_S
    return await analyze("")(s)


async def failing_front(s: Server) -> httpx.Response:
    """The front fails before anything answers (the app under it raises)."""

    async def broken(*_: Any) -> None:
        raise RuntimeError("the app broke")

    front = FrontMiddleware(broken, **front_options(s.settings, ROUTES, broken))
    transport = httpx.ASGITransport(front)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=s.client.headers) as alone:
        return await alone.get("/backends")


async def without_key(s: Server) -> httpx.Response:
    del s.client.headers["authorization"]
    return await s.client.post("/classify", content=b"x", headers={"content-type": "image/png"})


def via_groq(mode: str) -> Send:
    """Groq failing (``error``) or slow (``slow``: 2 s, over the Groq timeout and within the request's)."""

    async def send(s: Server) -> httpx.Response:
        before = s.groq.mode, s.groq.delay_s
        s.groq.mode, s.groq.delay_s = mode, 2.0
        try:
            return await analyze("")(s)
        finally:
            s.groq.mode, s.groq.delay_s = before

    return send


# (status, case) → the request that gets the server to answer that case.
SENDS: dict[tuple[str, str], Send] = {
    ("400", "invalid_field"): analyze("x" * 501),
    ("400", "invalid_image"): raw("/classify", b"not an image", "image/png"),
    ("400", "too_many_images"): too_many_images,
    ("401", "no_key"): without_key,
    ("408", "slow_body"): slow_body,
    ("413", "too_large"): raw("/classify", bytes(25_000_000), "image/png"),
    ("413", "get_body"): lambda s: s.client.request("GET", "/backends", content=b"x"),
    ("413", "image_too_large"): raw("/classify", png_header(12000, 10000), "image/png"),
    ("415", "unsupported"): raw("/classify", b"a,b", "text/csv"),
    ("415", "unsupported_batch"): raw("/classify/batch", b"a,b", "text/csv"),
    ("429", "overloaded"): while_busy,
    ("429", "rate_limited"): over_the_limit,
    ("500", "failed"): analyze("bug"),
    ("500", "image_failed"): raw("/classify", images.tiny_png(), "image/png"),
    ("502", "groq_failed"): via_groq("error"),
    ("503", "unavailable"): failing_front,
    ("503", "backend_unavailable"): raw("/classify?backend=coreml", images.tiny_png(), "image/png"),
    ("503", "groq_unavailable"): analyze("no key"),
    ("504", "timeout"): analyze("slow"),
    ("504", "groq_timeout"): via_groq("slow"),
}


def descriptions() -> dict[tuple[str, str], set[str]]:
    """(status, case) → the spec's description of it (fastinfer/front/openapi.py)."""
    return {(status, case): {said} for case, (status, said) in openapi.error_cases(2).items()}


def test_every_example_has_a_case_and_every_documented_case_an_example(settings: Settings) -> None:
    assert set(SENDS) == set(openapi.error_bodies(settings)) == set(descriptions())


def test_the_headers_compared_are_the_documented_ones(settings: Settings) -> None:
    """Retry-After where the spec's description names it (and the API page: 429 only); WWW-Authenticate on a 401,
    as the spec's bearer scheme has it (RFC 6750)."""
    assert "| 429 | `overloaded`, `rate_limited`, with `Retry-After` |" in api_page.PAGE_TEXT
    assert openapi.SECURITY_SCHEME["scheme"] == "bearer"
    documented = {
        case: {"retry-after"} if any("`Retry-After`" in d for d in said) else set()
        for case, said in descriptions().items()
    }
    documented["401", "no_key"].add("www-authenticate")
    sent = documented_headers(settings)
    assert {case: set(sent.get(case, {})) for case in documented} == documented


@pytest.mark.parametrize(("status", "case"), list(SENDS), ids=[f"{s}-{c}" for s, c in SENDS])
def test_the_example_is_what_the_server_answers(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, groq: FakeGroq, status: str, case: str
) -> None:
    if case == "backend_unavailable" and hardware.is_macos():
        pytest.skip("CoreML runs on macOS")

    async def sent() -> httpx.Response:
        async with server(monkeypatch, settings, groq) as s:
            return await SENDS[status, case](s)

    response = asyncio.run(sent())
    headers = {name: response.headers[name] for name in DOCUMENTED_HEADERS if name in response.headers}
    expected = openapi.error_bodies(settings)[status, case], documented_headers(settings).get((status, case), {})
    assert (str(response.status_code), response.json(), headers) == (status, *expected)


def test_a_call_refused_as_it_spends_is_answered_as_the_front_refuses_it(settings: Settings) -> None:
    """Calls admitted meanwhile filled the window between the front's check and Groq's call: /analyze's handler
    answers the rate_limited example, with its Retry-After."""
    guard = analyze_guard(settings)
    guard.clock = lambda: 0.0
    for _ in range(settings.analyze_per_minute):
        assert guard.admit("key-1") is None
    guard.clock = lambda: 60.0 - RATE_LIMITED_WAIT_S
    scope = {"state": {GUARDED: (guard, "key-1", ANALYZE_ROUTE)}}  # as Access.check leaves it
    ctx: Any = SimpleNamespace(request=SimpleNamespace(scope=scope), response=SimpleNamespace(status_code=200))
    answered = asyncio.run(analysis.answer([{"class": "tabby"}], "", settings.groq, ctx))
    assert isinstance(answered, JSONResponse)
    headers = {name: answered.headers[name] for name in DOCUMENTED_HEADERS if name in answered.headers}
    assert (ctx.response.status_code, answered.status_code, json.loads(answered.body), headers) == (
        429,
        429,
        openapi.error_bodies(settings)["429", "rate_limited"],
        documented_headers(settings)["429", "rate_limited"],
    )


def test_the_pages_error_example_is_one_the_server_answers(settings: Settings) -> None:
    shown = re.search(r"```json\n(\{\"error\".*\})\n```", api_page.PAGE_TEXT)
    assert shown is not None and json.loads(shown.group(1)) in openapi.error_bodies(settings).values()


def test_service_is_wired_by_the_functions_this_test_serves() -> None:
    """The cases above run http.front_options and analysis.answer: service.py must answer through them too."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "service.py").read_text())
    called = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert {"front_options", "analysis.answer"} <= called, "service.py no longer builds its front as this test does"
