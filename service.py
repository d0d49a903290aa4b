"""FastInfer: the one BentoML entry service. Thin: HTTP in, runners for inference, JSON out.

Request path (see ../shared/DESIGN.md): read → decode at reduced JPEG scale → resize/crop to
uint8 224×224×3 (in a thread, off the event loop) → the backend's runner (``infer`` or the
adaptive-batching ``infer_batched``) → softmax/top-k → typed response with per-stage timings.
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import anyio
import bentoml
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from fastinfer import hardware, store
from fastinfer.api_inputs import ClassifyInput, ImageInput
from fastinfer.config import get_settings
from fastinfer.errors import ApiError, BackendUnavailable, UnknownBackend
from fastinfer.http import FrontMiddleware
from fastinfer.postprocess import top_k as rank
from fastinfer.preprocess import prepare
from fastinfer.schemas import BackendInfo, BackendsResponse, BatchingInfo, ClassifyResponse, Timings
from runners import REGISTRY, runs_here, unavailable_reason
from runners.base import keep_sessions_open
from runners.coreml import CoremlRunner
from runners.onnx import OnnxInt8DynamicRunner, OnnxInt8Runner, OnnxRunner
from runners.pytorch import PytorchRunner

logger = logging.getLogger("fastinfer.service")
settings = get_settings()


@bentoml.service(
    name="fastinfer",
    workers=settings.front_workers,
    traffic={"timeout": settings.request_timeout_s, "max_concurrency": settings.max_concurrency},
)
class FastInfer:
    pytorch = bentoml.depends(PytorchRunner)
    onnx = bentoml.depends(OnnxRunner)
    onnx_int8 = bentoml.depends(OnnxInt8Runner)
    onnx_int8_dynamic = bentoml.depends(OnnxInt8DynamicRunner)
    if runs_here("coreml"):  # off macOS the CoreML runner is not started at all
        coreml = bentoml.depends(CoremlRunner)

    def __init__(self) -> None:
        self.unavailable = {name: reason for name in REGISTRY if (reason := unavailable_reason(name))}
        self.models = {
            name: store.describe(m)
            for name, entry in REGISTRY.items()
            if (m := store.find(entry.spec.artifact, entry.spec.static_batches[0])) is not None
        }
        self.hardware = hardware.probe()
        # Decoding is CPU-bound; more threads than cores only adds contention.
        self.cpu_limiter = anyio.CapacityLimiter(hardware.cpu_count())
        for runner in {entry.runner for name, entry in REGISTRY.items() if name not in self.unavailable}:
            keep_sessions_open(getattr(self, runner))
        for name, reason in self.unavailable.items():
            logger.warning("backend %s unavailable: %s", name, reason)

    @bentoml.api(route="/classify", input_spec=ClassifyInput)
    async def classify(self, image: Path, backend: str, top_k: int) -> ClassifyResponse:
        """Classify one image with the chosen backend; returns top-k labels and per-stage timings."""
        return await self._answer(image, backend, top_k)

    @bentoml.api(route="/predict", input_spec=ImageInput)
    async def predict(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: PyTorch eager."""
        return await self._answer(image, "pytorch", top_k)

    @bentoml.api(route="/predict/onnx", input_spec=ImageInput)
    async def predict_onnx(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: ONNX Runtime FP32."""
        return await self._answer(image, "onnx", top_k)

    @bentoml.api(route="/predict/quantized", input_spec=ImageInput)
    async def predict_quantized(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: ONNX Runtime static INT8."""
        return await self._answer(image, "onnx-int8", top_k)

    @bentoml.api(route="/predict/coreml", input_spec=ImageInput)
    async def predict_coreml(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: CoreML FP16, batch 1 (macOS; 503 with the reason elsewhere)."""
        return await self._answer(image, "coreml", top_k)

    @bentoml.api(route="/predict/batched", input_spec=ImageInput)
    async def predict_batched(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: PyTorch through adaptive batching, whatever the batching setting."""
        return await self._answer(image, "pytorch", top_k, batched=True)

    @bentoml.api(route="/predict/batched/coreml", input_spec=ImageInput)
    async def predict_batched_coreml(self, image: Path, top_k: int) -> ClassifyResponse:
        """The seed's route: CoreML static batches b1/b2/b4/b8 (macOS; 503 with the reason elsewhere)."""
        return await self._answer(image, "coreml-batched", top_k)

    async def _answer(self, image: Path, backend: str, k: int, batched: bool | None = None) -> Any:
        try:
            return await self._classify(image, backend, k, batched)
        except ApiError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)

    async def _classify(self, image: Path, backend: str, k: int, batched: bool | None) -> ClassifyResponse:
        started = time.perf_counter()
        if backend not in REGISTRY:
            raise UnknownBackend(f"Unknown backend {backend!r}; valid backends: {', '.join(REGISTRY)}")
        if backend in self.unavailable:
            raise BackendUnavailable(self.unavailable[backend])
        info = self.models[backend]

        def read_and_prepare() -> tuple[float, Any]:
            t0 = time.perf_counter()
            data = image.read_bytes()
            read_ms = (time.perf_counter() - t0) * 1000
            return read_ms, prepare(data, info.preprocess, settings.max_pixels)

        read_ms, prepared = await anyio.to_thread.run_sync(read_and_prepare, limiter=self.cpu_limiter)
        entry = REGISTRY[backend]
        runner = getattr(self, entry.runner)
        t_infer = time.perf_counter()
        try:
            logits = await getattr(runner.to_async, entry.method(batched))(prepared.pixels[np.newaxis])
        except Exception as exc:  # runner down or crashed: the server's fault, said plainly
            logger.exception("runner %s failed", backend)
            raise BackendUnavailable(f"The {backend} runner failed: {type(exc).__name__}") from exc
        inference_ms = (time.perf_counter() - t_infer) * 1000
        predictions = rank(np.asarray(logits)[0], k, info.categories)
        total_ms = (time.perf_counter() - started) * 1000
        return ClassifyResponse(
            class_=predictions[0].label,
            class_index=predictions[0].index,
            confidence=predictions[0].score,
            top_k=predictions,
            backend=backend,
            model=info.tag,
            weights=info.weights,
            latency_ms=round(total_ms, 3),
            timings_ms=Timings(
                read=round(read_ms, 3),
                decode=round(prepared.decode_ms, 3),
                preprocess=round(prepared.preprocess_ms, 3),
                inference=round(inference_ms, 3),
                total=round(total_ms, 3),
            ),
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
    result = await service.backends()
    return JSONResponse(result.model_dump(mode="json"))


# GET routes beside the typed POST APIs (BentoML APIs are POST-only).
FastInfer.mount_asgi_app(Starlette(routes=[Route("/backends", _backends_route, methods=["GET"])]), path="/")
FastInfer.add_asgi_middleware(FrontMiddleware, max_bytes=settings.max_bytes)
