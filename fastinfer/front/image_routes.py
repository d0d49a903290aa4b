"""The image routes, each declared once: path, API name, backend, kind and description. Both faces of a route
come from this table, the BentoML API (:func:`image_apis`) and its HTTP answer (image_api.py); both end in :func:`run`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import bentoml
from pydantic import BaseModel

from fastinfer.common.schemas import BatchResponse, ClassifyResponse, CompareResponse, summarise
from fastinfer.front.api_inputs import BatchInput, ClassifyInput, CompareInput, ImageInput
from fastinfer.serving.pipeline import Image, Pipeline

FILE_FIELDS = ("image", "file")  # ``file``: the original FastInfer API's field name
BATCH_FIELD = "images"


@dataclass(frozen=True)
class CacheUse:
    """What a request lets the response cache do (RFC 9111 request directives; image_api.cache_use)."""

    read: bool = True  # may be answered from the cache
    store: bool = True  # its answer may be stored


@dataclass(frozen=True)
class ImageRoute:
    """One image route: its API's name and description, its backend (None: the request names it), its kind."""

    path: str
    name: str  # the API's name (BentoML's, the Python client's method)
    doc: str  # the API's description in the spec and Swagger
    backend: str | None
    kind: Literal["one", "batch", "compare"] = "one"
    batched: bool | None = None  # force adaptive batching on or off; None: the backend's setting
    original: bool = False  # a route of the original FastInfer API (its FastAPI release)

    @property
    def metric_label(self) -> str:
        """The request metric's backend label until the request names one."""
        return self.backend or ("all" if self.kind == "compare" else "none")

    @property
    def text_fields(self) -> tuple[str, ...]:
        return ("backend", "top_k") if self.backend is None else ("top_k",)

    @property
    def file_fields(self) -> tuple[str, ...]:
        return (BATCH_FIELD,) if self.kind == "batch" else FILE_FIELDS

    @property
    def input_spec(self) -> type[bentoml.IODescriptor]:
        one = ClassifyInput if self.backend is None else ImageInput
        return {"one": one, "batch": BatchInput, "compare": CompareInput}[self.kind]

    @property
    def answer_type(self) -> type[BaseModel]:
        return {"one": ClassifyResponse, "batch": BatchResponse, "compare": CompareResponse}[self.kind]


ROUTES: dict[str, ImageRoute] = {
    route.path: route
    for route in (
        ImageRoute(
            "/classify",
            "classify",
            "Classify one image with the chosen backend; returns top-k labels and per-stage timings.\n\n"
            "Send `Cache-Control: no-cache` (or `Pragma: no-cache`) to bypass the response cache (benchmarks do),\n"
            "`Cache-Control: no-store` to keep this answer out of it.",
            None,
        ),
        ImageRoute(
            "/classify/batch",
            "classify_batch",
            "Classify up to FASTINFER_MAX_BATCH_IMAGES images in one request: decoded in parallel, sent to the\n"
            "runner as one batch, answered in order; an image that cannot be classified gets its own error.",
            None,
            "batch",
        ),
        # The original FastInfer API's routes (its clients work unchanged), and their OpenVINO sibling:
        # a fixed backend each.
        ImageRoute(
            "/predict", "predict", "The original FastInfer API's route: PyTorch eager.", "pytorch", original=True
        ),
        ImageRoute(
            "/predict/onnx", "predict_onnx", "The original FastInfer API's route: ONNX Runtime FP32.", "onnx",
            original=True,
        ),
        ImageRoute(
            "/predict/quantized", "predict_quantized", "The original FastInfer API's route: ONNX Runtime static INT8.",
            "onnx-int8", original=True,
        ),
        ImageRoute(
            "/predict/coreml", "predict_coreml",
            "The original FastInfer API's route: CoreML FP16, batch 1 (macOS; 503 with the reason elsewhere).",
            "coreml", original=True,
        ),
        ImageRoute(
            "/predict/openvino", "predict_openvino",
            "OpenVINO: the FP32 model at the CPU's best precision (BF16 where the CPU has BF16 units;\n"
            "`FASTINFER_OPENVINO_PRECISION`); GET /backends says which (`runs_on.precision`).",
            "openvino",
        ),
        ImageRoute(
            "/predict/batched", "predict_batched",
            "The original FastInfer API's route: PyTorch through adaptive batching, whatever the batching setting.",
            "pytorch", batched=True, original=True,
        ),
        ImageRoute(
            "/predict/batched/coreml", "predict_batched_coreml",
            "The original FastInfer API's route: CoreML static batches b1/b2/b4/b8 (macOS; 503 with the reason\n"
            "elsewhere).",
            "coreml-batched", original=True,
        ),
        ImageRoute(
            "/compare", "compare",
            "One image through every backend available here, one after another (decoded once, never\n"
            "from the cache, so that the timings compare backends); with a summary.",
            "all", "compare",
        ),
    )
}  # fmt: skip


async def run(
    pipeline: Pipeline,
    route: ImageRoute,
    images: Sequence[Image],
    backend: str,
    k: int | None,
    use: CacheUse,
    started: float,
) -> dict[str, Any]:
    """What a route answers for these images, as JSON; ApiError for what cannot be. ``k``: the classes to
    rank (None: the default); ``started``: when the request began (time.perf_counter), for /compare's total."""
    if route.kind == "compare":  # never from the cache, never into it
        results, skipped = await pipeline.compare(images[0], k, pipeline.backends)
        return summarise(results, skipped, started)
    if route.kind == "batch":
        return {"results": await pipeline.classify_many(images, backend, k, bypass=not use.read, store=use.store)}
    backend = route.backend or backend
    return await pipeline.classify(images[0], backend, k, bypass=not use.read, store=use.store, batched=route.batched)


def _api(route: ImageRoute) -> Any:
    """The route's BentoML API: its typed inputs (the route's input spec) run through :func:`run`."""
    # BentoML reads an API's parameters and answer type from its signature; in-process callers pass
    # them by position too: (image | images, [backend,] top_k), as the methods written by hand did.
    images = inspect.Parameter(
        BATCH_FIELD if route.kind == "batch" else FILE_FIELDS[0],
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=list[Path] if route.kind == "batch" else Path,
    )
    named = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
             for name, annotation in (("backend", str), ("top_k", int)) if name in route.text_fields]  # fmt: skip
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), images, *named],
        return_annotation=route.answer_type,
    )

    async def api(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            inputs = signature.bind(*args, **kwargs).arguments
        except TypeError as exc:  # say which API, as a method written by hand would
            raise TypeError(f"{route.name}(): {exc}") from None
        paths = inputs[images.name] if route.kind == "batch" else [inputs[images.name]]
        if isinstance(paths, str | Path):  # a path is iterable, one character (or part) at a time
            raise TypeError(f"{route.name}(): {images.name} is a list of paths, not {type(paths).__name__}")
        sent = [Image(Path(path).read_bytes(), Path(path).name if route.kind == "batch" else "") for path in paths]
        pipeline = inputs["self"].pipeline
        body = await run(pipeline, route, sent, inputs.get("backend", ""), inputs["top_k"], CacheUse(), started)
        return route.answer_type.model_validate(body)

    api.__signature__ = signature  # type: ignore[attr-defined]
    api.__annotations__ = {**{p.name: p.annotation for p in signature.parameters.values() if p.name != "self"},
                           "return": route.answer_type}  # fmt: skip
    api.__name__ = route.name
    api.__doc__ = route.doc
    return bentoml.api(route=route.path, input_spec=route.input_spec)(api)


def image_apis(front: type) -> type:
    """Class decorator for the front service, under ``@bentoml.service``: one API per image route (over
    the service's ``pipeline``)."""
    for route in ROUTES.values():
        if hasattr(front, route.name):
            raise TypeError(f"{front.__name__}.{route.name} already exists; {route.path} declares it")
        api = _api(route)
        api.func.__qualname__ = f"{front.__qualname__}.{route.name}"  # tracebacks name the service's API
        setattr(front, route.name, api)
    return front
