"""FastInfer: the one BentoML entry service. Routes only: the request pipeline is fastinfer/pipeline.py,
the HTTP forms of the image APIs fastinfer/image_api.py, the runners runners/.

The image APIs are declared here as BentoML APIs — that is what makes the OpenAPI spec, Swagger
and ``bentoml.SyncHTTPClient`` know them, and what an in-process caller gets — while their HTTP
requests are answered by the front's lean path (fastinfer.http.FrontMiddleware ``lanes`` →
fastinfer.image_api): same routes, fields and answers, without a temporary file per upload.
"""

import asyncio
import atexit
import contextlib
import json
import logging
import os
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import bentoml
import numpy as np
from bentoml.exceptions import BentoMLException, ServiceUnavailable
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope, Send

from fastinfer import analysis, dashboard_page, deadlines, hardware, image_api, inventory, store
from fastinfer.access import ANALYZE_ROUTE, Access, ApiKeys, analyze_guard, spend
from fastinfer.api_inputs import AnalyzeInput, BatchInput, ClassifyInput, CompareInput, ImageInput
from fastinfer.api_page import ApiPage
from fastinfer.cache import ResponseCache, open_cache
from fastinfer.config import get_settings
from fastinfer.connections import install_front_protocol
from fastinfer.cpu import CpuPool
from fastinfer.disk import guard_metric_files
from fastinfer.errors import ApiError, BackendUnavailable, RequestTimeout, RunnerNotLoaded
from fastinfer.http import FrontMiddleware
from fastinfer.live import LiveStats
from fastinfer.openapi import DocumentedService
from fastinfer.pipeline import Image, Pipeline
from fastinfer.schemas import (
    AnalyzeResponse,
    BackendsResponse,
    BatchResponse,
    ClassifyResponse,
    CompareResponse,
    summarise,
)
from runners import REGISTRY, attach, unavailable_reason

logger = logging.getLogger("fastinfer.service")
RUNNER_FAILURE_MEMORY_S = 10.0
DASHBOARD_DIR = Path(__file__).parent / "dashboard"
settings = get_settings()
FORM_RULES = image_api.FormRules(settings.default_backend, settings.max_batch_images)


# Overload (429) and timeouts (504) are answered by FrontMiddleware, in our error shape; BentoML's
# own limiter sits outside our middleware and answers in another shape. Its timeout stays, a little
# later than ours, as a backstop.
@bentoml.service(
    name="fastinfer",
    service_class=DocumentedService,  # /docs.json tells the whole API (fastinfer/openapi.py)
    workers=settings.front_workers,
    traffic={"timeout": settings.request_timeout_s + 5},
    # BentoML's access log decodes the request's Content-Type as UTF-8 just before the response body
    # goes out: one \xff in it cut every answer short and logged two tracebacks (review finding).
    logging={"access": {"request_content_type": False}},
)
@attach  # one bentoml.depends per runner that can run here (fastinfer/backends.py is the table)
class FastInfer:
    def __init__(self) -> None:
        self.unavailable = {name: reason for name in REGISTRY if (reason := unavailable_reason(name))}
        models = {
            name: store.describe(m)
            for name, entry in REGISTRY.items()
            if (m := store.serving_or_none(entry.spec.artifact, entry.spec.static_batches[0])) is not None
        }
        self.runner_failures: dict[str, tuple[str, float]] = {}  # runner → (why, until when it is believed)
        self.hardware = hardware.probe()
        self.live = LiveStats()
        # Decoding is CPU-bound; more threads than cores only adds contention (see fastinfer.cpu).
        self.cpu = CpuPool(hardware.cpu_count(), "front-cpu")
        self.pipeline = Pipeline(
            list(REGISTRY), models, self._unavailable, self._infer, ResponseCache(), self.cpu, self.live,
            settings.max_pixels,
        )  # fmt: skip
        for name, reason in self.unavailable.items():
            logger.warning("backend %s unavailable: %s", name, reason)
        if settings.api_keys:
            logger.info("API keys: on (%d accepted, from %s); open: probes, /metrics, the API page, the "
                        "dashboard's files", len(settings.api_keys), settings.api_keys_from)  # fmt: skip
        else:
            logger.warning("API keys: off (neither FASTINFER_API_KEYS nor FASTINFER_API_KEYS_FILE is set): every "
                           "route is open to whoever reaches the port")  # fmt: skip
            if os.environ.get("FASTINFER_API_KEY"):
                logger.warning("FASTINFER_API_KEY is what clients send; the server's keys are FASTINFER_API_KEYS")

    @bentoml.on_deployment
    def _pin_models() -> None:
        """Once per ``bentoml serve``, in its parent process before any worker starts: fix the exact
        model versions this server serves (fastinfer.store.PINS_ENV, inherited by every worker, restarted
        or not), and record them so that a rebuild keeps them while this server runs."""
        pinned = store.pin([name for entry in REGISTRY.values() for name in entry.spec.model_names()])
        os.environ[store.PINS_ENV] = json.dumps(pinned)
        try:
            atexit.register(store.record_pins(pinned).unlink, missing_ok=True)
        except OSError as exc:  # a read-only home (a container's): nothing builds beside this server there
            logger.warning("could not record the served versions for builds to keep: %s", exc)
        logger.info("serving %s", ", ".join(sorted(set(pinned.values()))) or "no stored model")

    @bentoml.on_startup
    async def _open_cache(self) -> None:
        self.pipeline.cache = await open_cache(
            settings.cache,
            settings.redis_url,
            settings.cache_ttl_s,
            settings.cache_timeout_ms / 1000,
            settings.cache_max_entries,
            hmac_key=settings.cache_hmac_key,
        )

    @bentoml.on_shutdown
    async def _close(self) -> None:
        await self.pipeline.cache.close()
        self.cpu.close()

    @property
    def cache(self) -> ResponseCache:
        return self.pipeline.cache

    # The image APIs. Over HTTP, fastinfer.image_api answers them (see the module docstring); these
    # bodies serve in-process callers and give BentoML the types for the spec and its client.

    @bentoml.api(route="/classify", input_spec=ClassifyInput)
    async def classify(self, image: Path, backend: str, top_k: int) -> ClassifyResponse:
        """Classify one image with the chosen backend; returns top-k labels and per-stage timings.

        Send `Cache-Control: no-cache` (or `Pragma: no-cache`) to bypass the response cache (benchmarks do),
        `Cache-Control: no-store` to keep this answer out of it."""
        return ClassifyResponse.model_validate(await self.pipeline.classify(Image(image.read_bytes()), backend, top_k))

    @bentoml.api(route="/classify/batch", input_spec=BatchInput)
    async def classify_batch(self, images: list[Path], backend: str, top_k: int) -> dict[str, Any]:
        """Classify up to FASTINFER_MAX_BATCH_IMAGES images in one request: decoded in parallel, sent to the
        runner as one batch, answered in order; an image that cannot be classified gets its own error."""
        # Declared as a plain object: bentoml.SyncHTTPClient validates answers against the declared
        # schema and turned the error items of BatchResponse's union into {}. /docs.json still shows
        # BatchResponse (fastinfer/openapi.py).
        sent = [Image(path.read_bytes(), path.name) for path in images]
        return BatchResponse.model_validate(
            {"results": await self.pipeline.classify_many(sent, backend, top_k)}
        ).model_dump(mode="json")

    @bentoml.api(route="/predict", input_spec=ImageInput)
    async def predict(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: PyTorch eager."""
        return await self._fixed("/predict", image, top_k)

    @bentoml.api(route="/predict/onnx", input_spec=ImageInput)
    async def predict_onnx(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: ONNX Runtime FP32."""
        return await self._fixed("/predict/onnx", image, top_k)

    @bentoml.api(route="/predict/quantized", input_spec=ImageInput)
    async def predict_quantized(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: ONNX Runtime static INT8."""
        return await self._fixed("/predict/quantized", image, top_k)

    @bentoml.api(route="/predict/coreml", input_spec=ImageInput)
    async def predict_coreml(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: CoreML FP16, batch 1 (macOS; 503 with the reason elsewhere)."""
        return await self._fixed("/predict/coreml", image, top_k)

    @bentoml.api(route="/predict/openvino", input_spec=ImageInput)
    async def predict_openvino(self, image: Path, top_k: int) -> ClassifyResponse:
        """OpenVINO: the FP32 model at the CPU's best precision (BF16 where the CPU has BF16 units;
        `FASTINFER_OPENVINO_PRECISION`); GET /backends says which (`runs_on.precision`)."""
        return await self._fixed("/predict/openvino", image, top_k)

    @bentoml.api(route="/predict/batched", input_spec=ImageInput)
    async def predict_batched(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: PyTorch through adaptive batching, whatever the batching setting."""
        return await self._fixed("/predict/batched", image, top_k)

    @bentoml.api(route="/predict/batched/coreml", input_spec=ImageInput)
    async def predict_batched_coreml(self, image: Path, top_k: int) -> ClassifyResponse:
        """The original FastInfer API's route: CoreML static batches b1/b2/b4/b8 (macOS; 503 with the reason
        elsewhere)."""
        return await self._fixed("/predict/batched/coreml", image, top_k)

    @bentoml.api(route="/compare", input_spec=CompareInput)
    async def compare(self, image: Path, top_k: int) -> CompareResponse:
        """One image through every backend available here, one after another (decoded once, never
        from the cache, so that the timings compare backends); with a summary."""
        started = time.perf_counter()
        results, skipped = await self.pipeline.compare(Image(image.read_bytes()), top_k, list(REGISTRY))
        return CompareResponse.model_validate(summarise(results, skipped, started))

    @bentoml.api(route="/analyze", input_spec=AnalyzeInput)
    async def analyze(self, results: list[dict[str, Any]], question: str, ctx: bentoml.Context) -> AnalyzeResponse:
        """Ask Groq to explain prediction results and their latency trade-offs (never the image)."""
        if settings.groq.api_key:  # the input is valid (BentoML checked it): Groq will be called
            with contextlib.suppress(LookupError):  # an in-process call has no request, and no guard
                if (refusal := spend(ctx.request.scope)) is not None:
                    ctx.response.status_code = refusal.status
                    headers = {k.decode(): v.decode() for k, v in refusal.headers}
                    return JSONResponse(refusal.body, status_code=refusal.status, headers=headers)
        try:
            return await analysis.analyze(results, question, settings.groq)
        except ApiError as exc:
            ctx.response.status_code = exc.status
            return JSONResponse(exc.body(), status_code=exc.status)

    async def _fixed(self, route: str, image: Path, k: int) -> ClassifyResponse:
        spec = image_api.ROUTES[route]
        body = await self.pipeline.classify(Image(image.read_bytes()), str(spec.backend), k, batched=spec.batched)
        return ClassifyResponse.model_validate(body)

    def _unavailable(self, backend: str) -> str | None:
        """Why a backend cannot answer now: it cannot run here, or its runner recently failed to load."""
        if backend in self.unavailable:
            return self.unavailable[backend]
        reason, until = self.runner_failures.get(REGISTRY[backend].runner, ("", 0.0))
        return reason if time.monotonic() < until else None

    async def _infer(self, backend: str, pixels: np.ndarray, batched: bool | None) -> np.ndarray:
        """The backend's runner on a uint8 batch (fastinfer.pipeline.Infer)."""
        entry = REGISTRY[backend]
        call = getattr(getattr(self, entry.runner).to_async, entry.method(batched))
        # The runner computes only with the model this answer will be labelled with (runners/base.py).
        model = self.pipeline.models[backend].tag
        within_s = deadlines.remaining()  # the runner drops the images if this passes before they run
        try:
            try:
                return await call(pixels, model=model, within_s=within_s)
            except aiohttp.ClientConnectorError:
                # Nothing was sent, so one retry is safe. At SIGTERM the runner's socket file is
                # gone for a moment before the runner links it back (runners/drain.py).
                await asyncio.sleep(0.1)
                return await call(pixels, model=model, within_s=within_s)
        except ServiceUnavailable as exc:
            # The runner is up but could not load its model. BentoML hides a 5xx's message, so ask the
            # runner why, and remember it for a while: requests meanwhile get the 503 without the round
            # trip; after it the runner is asked again (it retries the load, runners/base.py).
            reason = (await self._describe(entry.runner)).get("error") or f"The {backend} runner is unavailable"
            self.runner_failures[entry.runner] = (reason, time.monotonic() + RUNNER_FAILURE_MEMORY_S)
            raise RunnerNotLoaded(reason) from exc
        except BentoMLException as exc:
            if exc.error_code == HTTPStatus.GATEWAY_TIMEOUT:  # the deadline passed before the model ran it
                raise RequestTimeout(f"The request did not finish within {settings.request_timeout_s:g} s") from exc
            if exc.error_code != HTTPStatus.CONFLICT:
                logger.exception("runner %s failed", backend)
                raise BackendUnavailable(f"The {backend} runner failed: {type(exc).__name__}") from exc
            # The runner holds another version than this front names (runners/base.py ModelMismatch):
            # nothing was computed; said, and remembered like a load failure.
            reason = _runner_message(str(exc)) or f"The {backend} runner holds another model version than {model}"
            self.runner_failures[entry.runner] = (reason, time.monotonic() + RUNNER_FAILURE_MEMORY_S)
            raise RunnerNotLoaded(reason) from exc
        except Exception as exc:  # runner down or crashed: the server's fault, said plainly
            logger.exception("runner %s failed", backend)
            raise BackendUnavailable(f"The {backend} runner failed: {type(exc).__name__}") from exc

    async def backends(self) -> BackendsResponse:
        """Each backend: available or why not, models, weights, where it runs, batching; the machine."""
        runners = {REGISTRY[n].runner for n in REGISTRY if n not in self.unavailable}
        described = dict(zip(runners, await asyncio.gather(*(self._describe(r) for r in runners)), strict=True))
        return inventory.backends(REGISTRY, self.unavailable, self.pipeline.models, described, settings, self.hardware)

    async def _describe(self, runner: str) -> dict[str, Any]:
        try:
            with anyio.fail_after(5):
                return dict(await getattr(self, runner).to_async.describe())
        except Exception as exc:
            return {"error": f"the runner does not answer: {type(exc).__name__}"}


def _runner_message(text: str) -> str:
    """The message of a runner's 4xx answer: BentoML sends ``[{"error": "..."}]``."""
    with contextlib.suppress(ValueError):
        body = json.loads(text)
        body = body[0] if isinstance(body, list) and body else body
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    return ""


async def _image_lane(scope: Scope, body: bytes, send: Send) -> None:
    """An image route's request, its body in hand (FrontMiddleware's lane)."""
    service: FastInfer = bentoml.get_current_service()
    await image_api.serve(service.pipeline, scope, body, send, FORM_RULES)


async def _backends_route(_: Request) -> JSONResponse:
    service: FastInfer = bentoml.get_current_service()
    return JSONResponse((await service.backends()).model_dump(mode="json"))


async def _live_route(_: Request) -> JSONResponse:
    """The dashboard's live panel: requests served, cache, p50 per backend (this worker)."""
    service: FastInfer = bentoml.get_current_service()
    return JSONResponse({**service.live.snapshot(), "cache": await service.cache.describe()})


async def _cache_stats_route(_: Request) -> JSONResponse:
    """Mode, hits, misses, errors, bypasses, hit rate, key count, since when (this worker's counts)."""
    service: FastInfer = bentoml.get_current_service()
    return JSONResponse(await service.cache.describe())


# GET routes beside the typed POST APIs (BentoML APIs are POST-only).
FastInfer.mount_asgi_app(
    Starlette(
        routes=[
            Route("/backends", _backends_route, methods=["GET"]),
            Route("/cache/stats", _cache_stats_route, methods=["GET"]),
            Route("/stats/live", _live_route, methods=["GET"]),
        ]
    ),
    path="/",
)
FastInfer.mount_asgi_app(dashboard_page.files(DASHBOARD_DIR), path="/dashboard", name="dashboard")
# Idle connections, header size and count, open connections: bounded in uvicorn's protocol, below the
# middleware, before a request has headers to check (fastinfer/connections.py).
install_front_protocol(settings)
FastInfer.add_asgi_middleware(
    FrontMiddleware,
    max_bytes=settings.max_bytes,
    max_concurrency=settings.max_concurrency,
    timeout_s=settings.request_timeout_s,
    # Route → the request metric's backend label when a request fails before it names one.
    route_backends={**{path: route.metric_label for path, route in image_api.ROUTES.items()}, "/analyze": "none"},
    max_uploads=settings.max_uploads,
    body_idle_s=settings.body_idle_s,
    lanes=dict.fromkeys(image_api.ROUTES, _image_lane),
    access=Access(
        ApiKeys(settings.api_keys),
        {ANALYZE_ROUTE: analyze_guard(settings)},
    ),
    # A full disk under BENTOML_HOME: metrics held in memory instead of a SIGBUS, and /readyz says why.
    degraded=guard_metric_files(settings.min_free_disk_mb * 2**20).reason,
)
# Inside FrontMiddleware (its limits apply): "/" is FastInfer's API page, not BentoML's.
FastInfer.add_asgi_middleware(ApiPage)
