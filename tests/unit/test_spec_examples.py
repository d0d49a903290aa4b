"""Every error example in the spec is what the server answers in that case (fastinfer/front/api_examples.py errors).

Each case is sent, in process, to a server wired as service.py wires it: FrontMiddleware with its access check and
the image lanes (a real pipeline over a stand-in runner) in front of a BentoML service whose /analyze takes the
real AnalyzeInput and calls fastinfer/front/analysis.py (Groq: tests/fake_groq.py). A constructor whose output
changes without its example, or an example written by hand that drifts, fails here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import bentoml
import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fastinfer.catalog import backends, holdings
from fastinfer.catalog.config import GroqConfig, get_settings
from fastinfer.common import hardware
from fastinfer.common.errors import ApiError
from fastinfer.common.schemas import AnalyzeResponse
from fastinfer.front import analysis, api_examples, api_page, image_api, openapi
from fastinfer.front.access import ANALYZE_ROUTE, Access, ApiKeys, analyze_guard, spend
from fastinfer.front.api_inputs import AnalyzeInput
from fastinfer.front.http import FrontMiddleware
from fastinfer.front.image_routes import ROUTES
from fastinfer.serving.cache import MemoryCache
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.live import LiveStats
from fastinfer.serving.pipeline import Pipeline
from tests import images
from tests.fake_groq import FakeGroq
from tests.unit.test_family_serving import info

KEY = "example-key-0123456789"
GROQ = FakeGroq()  # listening from here; answering from the module's fixture on
SETTINGS = replace(
    get_settings(),
    request_timeout_s=3,  # more than Groq's, below
    body_idle_s=1,
    max_concurrency=1,
    max_batch_images=2,
    api_keys=(KEY,),
    groq=GroqConfig(api_key="groq-key", base_url=GROQ.url, timeout_s=1),
)
EXAMPLES = api_examples.errors(SETTINGS)
CLOCK = [0.0]  # the /analyze guard's clock


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
        """As service.py's: the guard's call recorded, then analysis.analyze, its ApiError in the error shape."""
        if question == "bug":
            raise RuntimeError("a bug")
        if question == "slow":
            await asyncio.sleep(10)
        if (refusal := spend(ctx.request.scope)) is not None:
            ctx.response.status_code = refusal.status
            return JSONResponse(refusal.body, status_code=refusal.status)
        groq = SETTINGS.groq if question != "no key" else GroqConfig()
        try:
            return await analysis.analyze(results, question, groq)
        except ApiError as exc:
            ctx.response.status_code = exc.status
            return JSONResponse(exc.body(), status_code=exc.status)


async def _backends(_: Any) -> JSONResponse:
    return JSONResponse({})


Examples.mount_asgi_app(Starlette(routes=[Route("/backends", _backends)]), path="/")


@functools.cache
def bentoml_app() -> Any:
    return Examples.to_asgi()


@contextlib.asynccontextmanager
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the server, with the key."""
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
        SETTINGS.max_pixels,
    )
    rules = image_api.FormRules("onnx", SETTINGS.max_batch_images)
    guard = analyze_guard(SETTINGS)
    guard.clock = lambda: CLOCK[0]
    front = FrontMiddleware(
        bentoml_app(),
        max_bytes=SETTINGS.max_bytes,
        max_concurrency=SETTINGS.max_concurrency,
        timeout_s=SETTINGS.request_timeout_s,
        route_backends={},
        max_uploads=SETTINGS.max_uploads,
        body_idle_s=SETTINGS.body_idle_s,
        lanes=dict.fromkeys(ROUTES, lambda scope, body, send: image_api.serve(pipeline, scope, body, send, rules)),
        access=Access(ApiKeys(SETTINGS.api_keys), {ANALYZE_ROUTE: guard}),
    )
    try:
        async with front.app.router.lifespan_context(front.app):
            transport = httpx.ASGITransport(front)
            headers = {"Authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
                yield client
    finally:
        pipeline.cpu.close()


def raw(path: str, body: bytes, content_type: str) -> Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]:
    return lambda c: c.post(path, content=body, headers={"content-type": content_type})


def analyze(question: str) -> Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]:
    return lambda c: c.post(ANALYZE_ROUTE, json={"results": [{"class": "tabby"}], "question": question})


async def slow_body(client: httpx.AsyncClient) -> httpx.Response:
    async def stalls() -> AsyncIterator[bytes]:
        yield b"x"
        await asyncio.sleep(3)

    return await client.post("/classify", content=stalls(), headers={"content-type": "image/png"})


async def while_busy(client: httpx.AsyncClient) -> httpx.Response:
    """A request while the one handling slot is taken."""
    busy = asyncio.ensure_future(analyze("slow")(client))
    await asyncio.sleep(0.3)
    try:
        return await client.get("/backends")
    finally:
        await busy


async def over_the_limit(client: httpx.AsyncClient) -> httpx.Response:
    """A client that has made all its calls of the last minute (42 s before the window frees one)."""
    for _ in range(SETTINGS.analyze_per_minute):  # each recorded as it reaches Groq, whatever Groq answers
        await analyze("")(client)
    CLOCK[0] += 18
    return await analyze("")(client)


async def failing_front(client: httpx.AsyncClient) -> httpx.Response:
    """The front fails before anything answers (the app under it raises)."""

    async def broken(*_: Any) -> None:
        raise RuntimeError("the app broke")

    front = FrontMiddleware(broken, 100, 1, 1, {}, 1, 1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(front), base_url="http://test") as alone:
        return await alone.get("/backends")


async def without_key(client: httpx.AsyncClient) -> httpx.Response:
    del client.headers["authorization"]
    return await client.post("/classify", content=b"x", headers={"content-type": "image/png"})


async def via_groq(client: httpx.AsyncClient, mode: str) -> httpx.Response:
    GROQ.mode, GROQ.delay_s = mode, 2.0
    try:
        return await analyze("")(client)
    finally:
        GROQ.mode = "ok"


# (status, case) → the request that gets the server to answer that case.
SENDS: dict[tuple[str, str], Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]] = {
    ("400", "invalid_field"): analyze("x" * 501),
    ("400", "invalid_image"): raw("/classify", b"not an image", "image/png"),
    ("400", "too_many_images"): lambda c: c.post(
        "/classify/batch", files=[("images", (f"{n}.png", b"x")) for n in range(SETTINGS.max_batch_images + 1)]
    ),
    ("401", "no_key"): without_key,
    ("408", "slow_body"): slow_body,
    ("413", "too_large"): raw("/classify", bytes(25_000_000), "image/png"),
    ("413", "get_body"): lambda c: c.request("GET", "/backends", content=b"x"),
    ("413", "image_too_large"): raw("/classify", png_header(12000, 10000), "image/png"),
    ("415", "unsupported"): raw("/classify", b"a,b", "text/csv"),
    ("415", "unsupported_batch"): raw("/classify/batch", b"a,b", "text/csv"),
    ("429", "overloaded"): while_busy,
    ("429", "rate_limited"): over_the_limit,
    ("500", "failed"): analyze("bug"),
    ("500", "image_failed"): raw("/classify", images.tiny_png(), "image/png"),
    ("502", "groq_failed"): lambda c: via_groq(c, "error"),
    ("503", "unavailable"): failing_front,
    ("503", "backend_unavailable"): raw("/classify?backend=coreml", images.tiny_png(), "image/png"),
    ("503", "groq_unavailable"): analyze("no key"),
    ("504", "timeout"): analyze("slow"),
    ("504", "groq_timeout"): lambda c: via_groq(c, "slow"),
}


@pytest.fixture(scope="module", autouse=True)
def groq() -> Any:
    with GROQ:
        yield


def test_every_example_has_a_case_and_every_documented_case_an_example() -> None:
    assert set(SENDS) == set(EXAMPLES)
    tables = [openapi.ERRORS, openapi.IMAGE_ERRORS, openapi.STATUS_ERRORS, openapi.batch_errors(2)]
    tables += [*openapi.ROUTE_ERRORS.values(), {"401": openapi.UNAUTHORIZED}]
    documented = {(status, case) for table in tables for status, (_, case) in table.items()}
    assert documented == set(EXAMPLES)


@pytest.mark.parametrize(("status", "case"), list(SENDS), ids=[f"{s}-{c}" for s, c in SENDS])
def test_the_example_is_what_the_server_answers(monkeypatch: pytest.MonkeyPatch, status: str, case: str) -> None:
    if case == "backend_unavailable" and hardware.is_macos():
        pytest.skip("CoreML runs on macOS")

    async def sent() -> httpx.Response:
        async with server(monkeypatch) as client:
            return await SENDS[status, case](client)

    response = asyncio.run(sent())
    assert (str(response.status_code), response.json()) == (status, EXAMPLES[status, case])


def test_the_pages_error_example_is_one_the_server_answers() -> None:
    shown = re.search(r"```json\n(\{\"error\".*\})\n```", api_page.PAGE_TEXT)
    assert shown is not None and json.loads(shown.group(1)) in EXAMPLES.values()
