"""Build every FastInfer artifact from one set of weights and store it in the BentoML model store.

``python -m build_models --weights auto|imagenet|random|PATH.pth [--only NAME,...] [--force]``
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer import photos, store
from fastinfer.preprocess import PreprocessSpec, prepare

logger = logging.getLogger("build_models")


@dataclass(frozen=True)
class Artifact:
    backend: str
    precision: str
    export: Callable[..., dict[str, Any]]
    verify: bool = True  # compare against the PyTorch reference after export


def _artifacts() -> dict[str, Artifact]:
    from build_models import exporters

    return {
        "pytorch": Artifact("pytorch", "fp32", exporters.export_pytorch, verify=False),
        "onnx": Artifact("onnx", "fp32", exporters.export_onnx),
    }


ARTIFACT_NAMES: tuple[str, ...] = ("pytorch", "onnx")


@dataclass(frozen=True)
class BuildResult:
    name: str
    tag: str
    built: bool  # False when the stored model was already current
    seconds: float
    max_abs_diff: float | None = None


def preprocess_spec() -> PreprocessSpec:
    """Taken from the weights' own transforms (IMAGENET1K_V2: resize 232, crop 224)."""
    from torchvision.models import ResNet50_Weights

    transforms = ResNet50_Weights.IMAGENET1K_V2.transforms()
    return PreprocessSpec(resize_size=int(transforms.resize_size[0]), crop_size=int(transforms.crop_size[0]))


def categories() -> list[str]:
    """ImageNet class names from torchvision's weight metadata (no download)."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V2.meta["categories"])


def verification_batch(spec: PreprocessSpec) -> np.ndarray:
    """Real photos through the service's own preprocessing: what the models will see."""
    return np.stack([prepare(photos.photo_jpeg(name), spec, 10**9).pixels for name in photos.PHOTOS[:8]])


def build(
    weights_choice: str = "auto",
    only: list[str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
) -> list[BuildResult]:
    """Build (or confirm current) every artifact named in ``only`` (default: all)."""
    import bentoml
    import torch

    from build_models.weights import load_weights
    from fastinfer.engines.onnx import OnnxEngine
    from fastinfer.torch_model import resnet50

    artifacts = _artifacts()
    names = only or list(ARTIFACT_NAMES)
    unknown = [n for n in names if n not in artifacts]
    if unknown:
        raise ValueError(f"unknown artifact(s) {unknown}; choose from {', '.join(artifacts)}")

    progress(f"weights: resolving {weights_choice!r}")
    weights = load_weights(weights_choice)
    progress(f"weights: {weights.kind} ({weights.description}), source hash {weights.source_hash}")
    spec = preprocess_spec()
    model = resnet50(weights.state_dict)
    reference: np.ndarray | None = None
    batch: np.ndarray | None = None

    results: list[BuildResult] = []
    for i, name in enumerate(names, 1):
        artifact = artifacts[name]
        step = f"[{i}/{len(names)}] {store.model_name(name)}"
        existing = store.find(name)
        if not force and store.is_current(existing, weights.source_hash):
            progress(f"{step}: up to date ({existing.tag}), skipped")
            results.append(BuildResult(name, str(existing.tag), False, 0.0))
            continue
        progress(f"{step}: exporting ...")
        t0 = time.perf_counter()
        labels = {
            "backend": artifact.backend,
            "precision": artifact.precision,
            "batch": "dynamic",
            "weights": weights.kind,
            "source_hash": weights.source_hash,
            "build_format": store.BUILD_FORMAT,
        }
        diff: float | None = None
        with tempfile.TemporaryDirectory() as tmp:
            extra = artifact.export(model, Path(tmp))
            if artifact.verify:
                if batch is None:
                    batch = verification_batch(spec)
                    with torch.inference_mode():
                        reference = model(torch.from_numpy(batch)).numpy()
                logits = OnnxEngine(tmp, cpu_only=True).run(batch)
                diff = float(np.abs(logits - reference).max())
                progress(f"{step}: verified on {len(batch)} real photos, max |logit diff| vs PyTorch = {diff:.2e}")
            metadata = {
                "input": store.INPUT_SPEC,
                "output": store.OUTPUT_SPEC,
                "preprocess": {
                    "resize_size": spec.resize_size,
                    "crop_size": spec.crop_size,
                    "interpolation": "bilinear",
                    "antialias": True,
                    "mean": [0.485, 0.456, 0.406],
                    "std": [0.229, 0.224, 0.225],
                    "normalisation": "inside the model graph",
                },
                "weights_description": weights.description,
                "categories": categories(),
                **({"max_abs_diff_vs_pytorch": diff} if diff is not None else {}),
                **extra,
            }
            with bentoml.models.create(store.model_name(name), labels=labels, metadata=metadata) as stored:
                for f in Path(tmp).iterdir():
                    f.rename(Path(stored.path) / f.name)
        seconds = time.perf_counter() - t0
        progress(f"{step}: stored {stored.tag} in {seconds:.1f}s")
        results.append(BuildResult(name, str(stored.tag), True, seconds, diff))
    return results


def missing() -> list[str]:
    """Artifacts the store lacks entirely (used by ``make serve`` to decide whether to build)."""
    return [name for name in ARTIFACT_NAMES if store.find(name) is None]
