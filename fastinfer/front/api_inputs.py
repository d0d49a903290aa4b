"""Typed inputs of the APIs, as BentoML declares them: the OpenAPI spec, Swagger's forms and
``bentoml.SyncHTTPClient`` are built from these.

Over HTTP the image APIs are parsed by fastinfer/front/image_api.py (same fields, plus the field name
``file`` and raw ``image/*`` bodies); the limits here and there are the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from _bentoml_sdk.io_models import IODescriptor  # BentoML's base for typed API inputs
from pydantic import Field

from fastinfer.catalog.choice import default_choice
from fastinfer.catalog.config import BACKENDS, get_settings
from fastinfer.common.schemas import TOP_K_MAX

BackendName = Literal[BACKENDS]  # type: ignore[valid-type]  # rendered as an enum in Swagger
TopK = Annotated[int, Field(ge=1, le=TOP_K_MAX, description=f"how many classes to return (1..{TOP_K_MAX})")]
ImageFile = Annotated[
    Path,
    Field(description="the image file (JPEG, PNG, GIF, WebP, BMP, TIFF ...); the field may also be named `file`"),
]


def _default_backend() -> str:
    return default_choice().backend


class ImageInput(IODescriptor):
    image: ImageFile
    top_k: TopK = 5


class ClassifyInput(ImageInput):
    backend: BackendName = Field(default_factory=_default_backend)


class CompareInput(ImageInput):
    pass


class BatchInput(IODescriptor):
    images: list[Path] = Field(
        min_length=1,
        max_length=get_settings().max_batch_images,
        description="the images, one `images` part each (1..FASTINFER_MAX_BATCH_IMAGES, default 32)",
    )
    backend: BackendName = Field(default_factory=_default_backend)
    top_k: TopK = 5


class AnalyzeInput(IODescriptor):
    """Prediction results to explain: /classify responses or /compare's ``results`` (no images)."""

    results: list[dict[str, Any]] = Field(min_length=1, max_length=20)
    question: str = Field(default="", max_length=500, description="optional focus for the explanation")
