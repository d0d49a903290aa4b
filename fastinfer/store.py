"""The BentoML model store as FastInfer uses it: names, labels, metadata, lookups.

Models are named ``resnet50-<backend>[-b<N>]`` and labelled with backend, precision, batch,
weights and source hash. Their metadata carries the I/O contract, the preprocessing
parameters and the class names, so that serving needs nothing but the store.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastinfer.preprocess import PreprocessSpec

if TYPE_CHECKING:
    from bentoml import Model

BUILD_FORMAT = "1"
"""Bumped when an export changes, so that stored models from an older build are rebuilt."""

INPUT_SPEC = {"name": "images", "dtype": "uint8", "shape": ["N", 224, 224, 3], "layout": "NHWC RGB"}
OUTPUT_SPEC = {"name": "logits", "dtype": "float32", "shape": ["N", 1000]}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def model_name(backend: str, batch: int | None = None) -> str:
    return f"resnet50-{backend}" + (f"-b{batch}" if batch else "")


@dataclass(frozen=True)
class StoredModelInfo:
    """What the service needs to know about one stored model."""

    tag: str
    path: str
    backend: str
    weights: str
    source_hash: str
    preprocess: PreprocessSpec
    categories: list[str]


def find(backend: str, batch: int | None = None) -> Model | None:
    """The latest stored model for a backend, or None if it was never built."""
    import bentoml
    from bentoml.exceptions import NotFound

    try:
        return bentoml.models.get(f"{model_name(backend, batch)}:latest")
    except NotFound:
        return None


def describe(model: Model) -> StoredModelInfo:
    labels: dict[str, str] = dict(model.info.labels)
    meta: dict[str, Any] = dict(model.info.metadata)
    pre = meta.get("preprocess", {})
    return StoredModelInfo(
        tag=str(model.tag),
        path=model.path,
        backend=labels.get("backend", ""),
        weights=labels.get("weights", "unknown"),
        source_hash=labels.get("source_hash", ""),
        preprocess=PreprocessSpec(
            resize_size=int(pre.get("resize_size", 232)), crop_size=int(pre.get("crop_size", 224))
        ),
        categories=list(meta.get("categories", [])),
    )


def is_current(model: Model | None, source_hash: str) -> bool:
    """True when a stored model was built from these weights by this build format."""
    if model is None:
        return False
    labels = model.info.labels
    return labels.get("source_hash") == source_hash and labels.get("build_format") == BUILD_FORMAT
