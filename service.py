"""FastInfer: the one BentoML entry service. Thin: HTTP in, runners for inference, JSON out.

Request path (README.md, "What it is"): read + sha256 → response cache (a hit answers here) →
decode at reduced JPEG scale → resize/crop to uint8 224×224×3 (in a thread, off the event loop) →
the backend's runner (``infer`` or the batching ``infer_batched``) → softmax/top-k → typed
response with per-stage timings → cache SET (fail-open).
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import bentoml
import numpy as np
from bentoml.exceptions import ServiceUnavailable
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

from fastinfer import analysis, hardware, metrics, store
from fastinfer.api_inputs import AnalyzeInput, ClassifyInput, CompareInput, ImageInput
from fastinfer.cache import Expected, ResponseCache, cache_key, open_cache
from fastinfer.config import get_settings
from fastinfer.cpu import CpuPool
from fastinfer.errors import ApiError, BackendUnavailable, RunnerNotLoaded, UnknownBackend
from fastinfer.http import FrontMiddleware
from fastinfer.live import LiveStats
from fastinfer.postprocess import top_k as rank
from fastinfer.preprocess import Prepared, PreprocessSpec, prepare
from fastinfer.schemas import (
    AnalyzeResponse,
    BackendInfo,
    BackendsResponse,
    BatchingInfo,
    ClassifyResponse,
    CompareResponse,
    Timings,
    summarise,
)
from runners import REGISTRY, attach, unavailable_reason

logger = logging.getLogger("fastinfer.service")
RUNNER_FAILURE_MEMORY_S = 10.0
NO_BACKEND = "No backend can run here; see GET /backends for why."
DASHBOARD_DIR = Path(__file__).parent / "dashboard"
settings = get_settings()


def error_response(ctx: bentoml.Context, exc: ApiError) -> JSONResponse:
    """Our error JSON with its status (BentoML applies the context's status to any response)."""
    ctx.response.status_code = exc.status
    return JSONResponse(exc.body(), status_code=exc.status)


# Overload (429) and timeouts (504) are answered by FrontMiddleware, in our error shape; BentoML's
# own limiter sits outside our middleware and answers in another shape. Its timeout stays, a little
# later than ours, as a backstop.
@bentoml.service(
    name="fastinfer",
    workers=settings.front_workers,
    traffic={"timeout": settings.request_timeout_s + 5},
)
@attach  # one bentoml.depends per runner that can run here (fastinfer/backends.py is the table)
class FastInfer:
    def __init__(self) -> None:
        self.unavailable = {name: reason for name in REGISTRY if (reason := unavailable_reason(name))}
        self.models = {
            name: store.describe(m)
            for name, entry in REGISTRY.items()
            if (m := store.find(entry.spec.artifact, entry.spec.static_batches[0])) is not None
        }
        self.runner_failures: dict[str, tuple[str, float]] = {}  # runner → (why, until when it is believed)
        self.hardware = hardware.probe()
        self.cache: ResponseCache = ResponseCache()  # replaced at start-up (open_cache is async)
        self.live = LiveStats()
        # Decoding is CPU-bound; more threads than cores only adds contention (see fastinfer.cpu).
        self.cpu = CpuPool(hardware.cpu_count(), "front-cpu")
        for name, reason in self.unavailable.items():
            logger.warning("backend %s unavailable: %s", name, reason)

    @bentoml.on_startup
    async def _open_cache(self) -> None:
        self.cache = await open_cache(
            settings.cache,
            settings.redis_url,
            settings.cache_ttl_s,
            settings.cache_timeout_ms / 1000,
            settings.cache_max_entries,
        )

    @bentoml.on_shutdown
    async def _close(self) -> None:
        await self.cache.close()
        self.cpu.close()

    @bentoml.api(route="/classify", input_spec=ClassifyInput)
    async def classify(self, image: Path, backend: str, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """Classify one image with the chosen backend; returns top-k labels and per-stage timings.

        Send `Cache-Control: no-cache` to bypass the response cache (benchmarks do)."""
        return await self._answer(ctx, image, backend, top_k)

    @bentoml.api(route="/predict", input_spec=ImageInput)
    async def predict(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: PyTorch eager."""
        return await self._answer(ctx, image, "pytorch", top_k)

    @bentoml.api(route="/predict/onnx", input_spec=ImageInput)
    async def predict_onnx(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: ONNX Runtime FP32."""
        return await self._answer(ctx, image, "onnx", top_k)

    @bentoml.api(route="/predict/quantized", input_spec=ImageInput)
    async def predict_quantized(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: ONNX Runtime static INT8."""
        return await self._answer(ctx, image, "onnx-int8", top_k)

    @bentoml.api(route="/predict/coreml", input_spec=ImageInput)
    async def predict_coreml(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: CoreML FP16, batch 1 (macOS; 503 with the reason elsewhere)."""
        return await self._answer(ctx, image, "coreml", top_k)

    @bentoml.api(route="/predict/openvino", input_spec=ImageInput)
    async def predict_openvino(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """OpenVINO: the FP32 model at the CPU's best precision (BF16 where the CPU has BF16 units;
        `FASTINFER_OPENVINO_PRECISION`); GET /backends says which (`runs_on.precision`)."""
        return await self._answer(ctx, image, "openvino", top_k)

    @bentoml.api(route="/predict/batched", input_spec=ImageInput)
    async def predict_batched(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: PyTorch through adaptive batching, whatever the batching setting."""
        return await self._answer(ctx, image, "pytorch", top_k, batched=True)

    @bentoml.api(route="/predict/batched/coreml", input_spec=ImageInput)
    async def predict_batched_coreml(self, image: Path, top_k: int, ctx: bentoml.Context) -> ClassifyResponse:
        """The seed's route: CoreML static batches b1/b2/b4/b8 (macOS; 503 with the reason elsewhere)."""
        return await self._answer(ctx, image, "coreml-batched", top_k)

    @bentoml.api(route="/compare", input_spec=CompareInput)
    async def compare(self, image: Path, top_k: int, ctx: bentoml.Context) -> CompareResponse:
        """One image through every backend available here, one after another (decoded once, never
        from the cache, so that the timings compare backends); with a summary."""
        ctx.request.state.fastinfer_backend = "all"
        try:
            started = time.perf_counter()
            names = [n for n in REGISTRY if self._unavailable(n) is None]
            if not names:
                raise BackendUnavailable(NO_BACKEND)
            shared: dict[str, float] = {}
            data = await self._in_thread(image.read_bytes, shared, "read")
            prepared = await self._prepare(data, self.models[names[0]].preprocess, shared)
            results = []
            for name in names:
                timings = dict(shared)
                try:
                    logits = await self._infer(name, prepared.pixels, None, timings)
                except RunnerNotLoaded:  # listed as unavailable (a runner that crashed is still an error)
                    continue
                timings["total"] = sum(timings.values())  # what a request to this backend alone would take
                results.append(self._respond(name, self._body(name, logits, top_k), timings, started))
            if not results:
                raise BackendUnavailable(NO_BACKEND)
        except ApiError as exc:
            return error_response(ctx, exc)
        return summarise(results, [n for n in REGISTRY if self._unavailable(n) is not None], started)

    @bentoml.api(route="/analyze", input_spec=AnalyzeInput)
    async def analyze(self, results: list[dict[str, Any]], question: str, ctx: bentoml.Context) -> AnalyzeResponse:
        """Ask Groq to explain prediction results and their latency trade-offs (never the image)."""
        try:
            return await analysis.analyze(results, question, settings.groq)
        except ApiError as exc:
            return error_response(ctx, exc)

    async def _answer(
        self, ctx: bentoml.Context, image: Path, backend: str, k: int, batched: bool | None = None
    ) -> Any:
        ctx.request.state.fastinfer_backend = backend  # FrontMiddleware labels the request metric with it
        bypass = "no-cache" in ctx.request.headers.get("cache-control", "").lower()
        try:
            return await self._classify(image, backend, k, batched, bypass)
        except ApiError as exc:
            return error_response(ctx, exc)

    async def _classify(
        self, image: Path, backend: str, k: int, batched: bool | None, bypass: bool
    ) -> ClassifyResponse:
        started = time.perf_counter()
        if backend not in REGISTRY:
            raise UnknownBackend(f"Unknown backend {backend!r}; valid backends: {', '.join(REGISTRY)}")
        if (reason := self._unavailable(backend)) is not None:
            raise BackendUnavailable(reason)
        info = self.models[backend]
        timings: dict[str, float] = {}

        def read_and_hash() -> tuple[bytes, str]:  # sha256 of up to FASTINFER_MAX_BYTES: not on the event loop
            data = image.read_bytes()
            return data, cache_key(data, backend, info.tag, k)

        data, key = await self._in_thread(read_and_hash, timings, "read")
        if bypass:
            self.cache.bypassed()
            metrics.CACHE_EVENTS.labels(event="bypass").inc()
        else:
            t0 = time.perf_counter()
            expected = Expected(backend, info.tag, k, info.weights, info.categories)
            cached, event = await self.cache.lookup(key, expected)
            timings["cache"] = (time.perf_counter() - t0) * 1000
            metrics.CACHE_EVENTS.labels(event=event).inc()
            if cached is not None:
                return self._respond(backend, {**cached, "cached": True}, timings, started)
        prepared = await self._prepare(data, info.preprocess, timings)
        body = self._body(backend, await self._infer(backend, prepared.pixels, batched, timings), k)
        if not bypass:
            await self.cache.store(key, body)
        return self._respond(backend, body, timings, started)

    def _unavailable(self, backend: str) -> str | None:
        """Why a backend cannot answer now: it cannot run here, or its runner recently failed to load."""
        if backend in self.unavailable:
            return self.unavailable[backend]
        reason, until = self.runner_failures.get(REGISTRY[backend].runner, ("", 0.0))
        return reason if time.monotonic() < until else None

    async def _prepare(self, data: bytes, spec: PreprocessSpec, timings: dict[str, float]) -> Prepared:
        prepared = await self._in_thread(lambda: prepare(data, spec, settings.max_pixels), timings, None)
        timings["decode"], timings["preprocess"] = prepared.decode_ms, prepared.preprocess_ms
        return prepared

    async def _infer(self, backend: str, pixels: np.ndarray, batched: bool | None, timings: dict[str, float]) -> Any:
        entry = REGISTRY[backend]
        t0 = time.perf_counter()
        call = getattr(getattr(self, entry.runner).to_async, entry.method(batched))
        try:
            try:
                logits = await call(pixels[np.newaxis])
            except aiohttp.ClientConnectorError:
                # Nothing was sent, so one retry is safe. At SIGTERM the runner's socket file is
                # gone for a moment before the runner links it back (runners/drain.py).
                await asyncio.sleep(0.1)
                logits = await call(pixels[np.newaxis])
        except ServiceUnavailable as exc:
            # The runner is up but could not load its model. BentoML hides a 5xx's message, so ask the
            # runner why, and remember it for a while: requests meanwhile get the 503 without the round
            # trip; after it the runner is asked again (it retries the load, runners/base.py).
            reason = (await self._describe(entry.runner)).get("error") or f"The {backend} runner is unavailable"
            self.runner_failures[entry.runner] = (reason, time.monotonic() + RUNNER_FAILURE_MEMORY_S)
            raise RunnerNotLoaded(reason) from exc
        except Exception as exc:  # runner down or crashed: the server's fault, said plainly
            logger.exception("runner %s failed", backend)
            raise BackendUnavailable(f"The {backend} runner failed: {type(exc).__name__}") from exc
        timings["inference"] = (time.perf_counter() - t0) * 1000
        return np.asarray(logits)[0]

    def _body(self, backend: str, logits: np.ndarray, k: int) -> dict[str, Any]:
        info = self.models[backend]
        predictions = rank(logits, k, info.categories)
        return {
            "class": predictions[0].label,
            "class_index": predictions[0].index,
            "confidence": predictions[0].score,
            "top_k": [p.model_dump() for p in predictions],
            "backend": backend,
            "model": info.tag,
            "weights": info.weights,
            "cached": False,
        }

    async def _in_thread(self, work: Any, timings: dict[str, float], stage: str | None) -> Any:
        """CPU work off the event loop, at most one thread per core."""
        t0 = time.perf_counter()
        result = await self.cpu.run(work)
        if stage:
            timings[stage] = (time.perf_counter() - t0) * 1000
        return result

    def _respond(
        self, backend: str, body: dict[str, Any], timings: dict[str, float], started: float
    ) -> ClassifyResponse:
        timings.setdefault("total", (time.perf_counter() - started) * 1000)
        metrics.observe_stages(backend, timings)
        self.live.record(backend, timings["total"], body.get("cached", False))
        stages = {stage: round(timings.get(stage, 0.0), 3) for stage in Timings.model_fields}
        return ClassifyResponse(
            **{k: v for k, v in body.items() if k != "class"},
            class_=body["class"],
            latency_ms=stages["total"],
            timings_ms=Timings(**stages),
        )

    async def backends(self) -> BackendsResponse:
        """Each backend: available or why not, models, weights, where it runs, batching; the machine."""
        names = list(REGISTRY)
        runners = {REGISTRY[n].runner for n in names if n not in self.unavailable}
        described = dict(zip(runners, await asyncio.gather(*(self._describe(r) for r in runners)), strict=True))
        infos = []
        for name, entry in REGISTRY.items():
            batching = settings.batching_for(name)
            model = self.models.get(name)
            reason = self.unavailable.get(name)
            runs_on = described.get(entry.runner, {}) if reason is None else {}
            if reason is None and "error" in runs_on:
                reason = runs_on.pop("error")
            infos.append(
                BackendInfo(
                    name=name,
                    description=entry.spec.description,
                    available=reason is None,
                    reason=reason,
                    model=model.tag if model else None,
                    models=runs_on.pop("models", [model.tag] if model else []),
                    weights=model.weights if model else None,
                    runs_on=runs_on,
                    batching=BatchingInfo(
                        enabled=batching.enabled,
                        max_batch_size=batching.max_batch_size,
                        max_latency_ms=batching.max_latency_ms,
                    ),
                )
            )
        available = [i.name for i in infos if i.available]
        return BackendsResponse(
            default=settings.default_backend,
            hardware=self.hardware,
            recommended=hardware.recommend(self.hardware, available),
            backends=infos,
        )

    async def _describe(self, runner: str) -> dict[str, Any]:
        try:
            with anyio.fail_after(5):
                return dict(await getattr(self, runner).to_async.describe())
        except Exception as exc:
            return {"error": f"the runner does not answer: {type(exc).__name__}"}


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


# Route → backend label of the request metric when a request fails before the handler names one
# (a /classify rejected by validation never reached a backend).
ROUTE_BACKENDS = {
    "/classify": "none",
    "/predict": "pytorch",
    "/predict/onnx": "onnx",
    "/predict/quantized": "onnx-int8",
    "/predict/coreml": "coreml",
    "/predict/openvino": "openvino",
    "/predict/batched": "pytorch",
    "/predict/batched/coreml": "coreml-batched",
    "/compare": "all",
    "/analyze": "none",
}

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
FastInfer.mount_asgi_app(StaticFiles(directory=DASHBOARD_DIR, html=True), path="/dashboard", name="dashboard")
FastInfer.add_asgi_middleware(
    FrontMiddleware,
    max_bytes=settings.max_bytes,
    max_concurrency=settings.max_concurrency,
    timeout_s=settings.request_timeout_s,
    route_backends=ROUTE_BACKENDS,
    max_uploads=settings.max_uploads,
    body_idle_s=settings.body_idle_s,
)
