"""Typed request/response models of the public API (they are the Swagger schemas)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TOP_K_MAX = 20  # the most classes one answer ranks (fewer for a family with fewer classes)
DEFAULT_TOP_K = 5  # ranked when a request does not say (every class of a family with fewer)


class Prediction(BaseModel):
    label: str
    index: int = Field(ge=0)
    score: float = Field(ge=0.0, le=1.0, description="softmax probability")


class Timings(BaseModel):
    """Milliseconds per stage of this request, as measured in the front."""

    read: float = Field(description="hashing the uploaded body for the cache key (0 when the cache is bypassed)")
    cache: float = Field(default=0.0, description="response cache lookup (0 when bypassed)")
    decode: float = Field(description="image decode (reduced JPEG DCT scale), EXIF, to RGB")
    preprocess: float = Field(description="resize + centre crop to the model's uint8 input (224×224×3 for ImageNet's)")
    inference: float = Field(description="runner round trip: transfer, queueing/batching, model")
    total: float = Field(description="the whole request inside the service")


class ClassifyResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    class_: str = Field(alias="class", description="top-1 label (a key of the original FastInfer API's answers)")
    class_index: int
    confidence: float = Field(description="top-1 softmax probability")
    top_k: list[Prediction]
    backend: str
    model: str = Field(description="BentoML model store tag")
    weights: str = Field(description="imagenet | random-init | file")
    engine: str = Field(
        description="what computed it beside the model: runtime and version, device, precision, CPU instruction "
        "sets (a cached answer is shared only between servers whose engines say the same)"
    )
    latency_ms: float = Field(description="same as timings_ms.total")
    timings_ms: Timings
    cached: bool = False


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable, e.g. invalid_image, unknown_backend, backend_unavailable")
    message: str = Field(description="what went wrong, for a person")


class ErrorResponse(BaseModel):
    """Every 4xx/5xx, on every route."""

    error: ErrorDetail


def _one_of(schema: dict[str, Any]) -> None:
    schema["items"]["oneOf"] = schema["items"].pop("anyOf")


class BatchResponse(BaseModel):
    # An item is a prediction or an error, never both: oneOf, which bentoml.SyncHTTPClient hands through as sent
    # (it reads an anyOf as its first choice, and so an error item as {}).
    results: list[ClassifyResponse | ErrorResponse] = Field(
        description="one per image, in the order sent: a prediction, or the error for that image alone",
        json_schema_extra=_one_of,
    )


class BatchingInfo(BaseModel):
    enabled: bool
    max_batch_size: int
    max_latency_ms: int


class BackendInfo(BaseModel):
    name: str
    description: str
    available: bool
    reason: str | None = Field(default=None, description="why it is unavailable")
    model: str | None = Field(default=None, description="store tag of the model answering batch-1 requests")
    models: list[str] = Field(default_factory=list, description="every stored model the runner loaded")
    weights: str | None = None
    runs_on: dict[str, Any] = Field(
        default_factory=dict,
        description="device or execution providers with node placement and fallbacks, threads, batch sizes seen",
    )
    batching: BatchingInfo | None = None
    accuracy: dict[str, Any] | None = Field(
        default=None,
        description="top-1 and top-5 (0..1; top-5 counts every class of a family of 5 or fewer, so 1 there) of "
        "its model on the labelled photos its build measured (--eval-dir), "
        "beside PyTorch's (reference_top1/5), the precision that ran and the images counted; null: not measured",
    )


class ModelFamily(BaseModel):
    """The model family a server serves (FASTINFER_MODEL): one set of weights, labels and preprocessing."""

    name: str = Field(description="the family: its models are <name>-<backend> in the model store")
    stored: bool = Field(description="false: the model store holds none of it (missing says what it holds)")
    num_classes: int | None = Field(default=None, description="how many classes it tells apart: top_k is capped at it")
    weights: str | None = Field(default=None, description="imagenet | random-init | file")
    weights_description: str | None = Field(default=None, description="where the weights came from, in words")
    preprocess: dict[str, Any] = Field(
        default_factory=dict, description="resize_size, crop_size, mean and std its weights expect"
    )
    accuracy: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="backend → the accuracy its build measured (backends without: not measured)"
    )
    missing: str | None = Field(default=None, description="why nothing is served: the families the store holds")
    labels: list[str] = Field(
        default_factory=list,
        description="its class names in index order (an answer's `index` → `label`): what a client scores answers by",
    )


class BackendsResponse(BaseModel):
    family: ModelFamily | None = Field(default=None, description="the model family this server serves")
    default: str = Field(description="the backend of requests that name none")
    default_choice: dict[str, str] = Field(
        description="how the default was chosen: backend; requested (FASTINFER_DEFAULT_BACKEND: auto or a "
        "backend); source (environment, tuned, measured or rule); why"
    )
    configuration: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="the settings that decide served throughput: setting → its value in force and its source "
        "(tuned, environment, rule, measured or default)",
    )
    tuned: dict[str, Any] = Field(
        default_factory=dict,
        description="the tuned file (`fastinfer tune`): path, status (in force, ignored or none), why, created, "
        "goal, the settings it gives",
    )
    hardware: dict[str, Any] = Field(
        description="OS, CPU, cores (and cores_source: CPU affinity or the container's cgroup CPU quota), "
        "ISA features, Apple chip, Neural Engine, CUDA, MPS"
    )
    recommended: dict[str, str] = Field(
        description="the backend to use here among those that answer now, why, and its source (measured or rule)"
    )
    backends: list[BackendInfo]


class CompareSummary(BaseModel):
    fastest: str = Field(description="backend with the lowest total time")
    slowest: str
    all_agree_top1: bool
    top1: dict[str, str] = Field(description="backend → top-1 label")
    unavailable: list[str] = Field(
        description="backends that could not answer: this machine cannot run them (see /backends), or their model "
        "computed NaN or infinite scores for this image (logged)"
    )


class CompareResponse(BaseModel):
    results: list[ClassifyResponse]
    summary: CompareSummary
    total_ms: float


class AnalyzeResponse(BaseModel):
    text: str
    model: str = Field(description="the Groq model that wrote it")


def summarise(results: list[dict[str, Any]], unavailable: list[str], started: float) -> dict[str, Any]:
    """/compare's answer (CompareResponse's shape) from the backends' ClassifyResponse-shaped bodies."""
    by_time = sorted(results, key=lambda r: r["timings_ms"]["total"])
    top1 = {r["backend"]: r["class"] for r in results}
    summary = CompareSummary(
        fastest=by_time[0]["backend"],
        slowest=by_time[-1]["backend"],
        all_agree_top1=len(set(top1.values())) == 1,
        top1=top1,
        unavailable=unavailable,
    )
    return {
        "results": results,
        "summary": summary.model_dump(),
        "total_ms": round((time.perf_counter() - started) * 1000, 3),
    }
