"""Build every FastInfer artifact from one set of weights and store it in the BentoML model store.

``python -m build_models --weights auto|imagenet|random|PATH.pth [--only NAME,...] [--force]``

Every ONNX export is run against PyTorch on real photos; one that diverges beyond its artifact's
tolerance fails the build and is not stored.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from build_models import exporters
from fastinfer import fidelity, hardware, photos, store
from fastinfer.fidelity import Fidelity, compare
from fastinfer.preprocess import PreprocessSpec, prepare

logger = logging.getLogger("build_models")


VERIFICATION_PHOTOS = 8
"""Real photos every verified export is compared on against PyTorch."""


class VerificationError(RuntimeError):
    """An export that diverges from the PyTorch reference beyond its artifact's tolerance."""


@dataclass(frozen=True)
class Tolerance:
    """How far an export may drift from the PyTorch reference on the verification photos."""

    max_abs_diff: float
    min_top1: float
    min_top5: float = 0.0

    def violations(self, f: Fidelity) -> list[str]:
        out = []
        if not f.max_abs_error <= self.max_abs_diff:  # written so that NaN fails too
            out.append(f"max |logit diff| {f.max_abs_error:.3g} > {self.max_abs_diff:g}")
        if f.top1_agreement < self.min_top1:
            out.append(f"top-1 agreement {f.top1_agreement:.1%} < {self.min_top1:.1%}")
        if f.top5_overlap < self.min_top5:
            out.append(f"top-5 overlap {f.top5_overlap:.1%} < {self.min_top5:.1%}")
        return out


# The same graph in another runtime: measured max |logit diff| ~3e-5 here.
FP32_TOLERANCE = Tolerance(max_abs_diff=1e-3, min_top1=1.0)
# The INT8 fidelity gates (fastinfer.fidelity; 36 photos there) on the 8 verification photos:
# 90% of 8 rounds down to 7, so one photo may flip.
INT8_TOLERANCE = Tolerance(
    max_abs_diff=fidelity.INT8_MAX_ERROR,
    min_top1=math.floor(fidelity.INT8_MIN_TOP1 * VERIFICATION_PHOTOS) / VERIFICATION_PHOTOS,
    min_top5=fidelity.INT8_MIN_TOP5,
)


@dataclass(frozen=True)
class Artifact:
    """One stored model per entry of ``batches`` (None = one model with a dynamic batch)."""

    name: str
    precision: str
    export: Callable[..., dict[str, Any]]
    batches: tuple[int | None, ...] = (None,)
    # Run with ONNX Runtime on real photos against PyTorch; beyond this the build fails and stores
    # nothing. None: not checked at build time (pytorch is the reference; CoreML predicts only on macOS).
    tolerance: Tolerance | None = None


ARTIFACTS: dict[str, Artifact] = {
    a.name: a
    for a in (
        Artifact("pytorch", "fp32", exporters.export_pytorch),
        Artifact("onnx", "fp32", exporters.export_onnx, tolerance=FP32_TOLERANCE),
        Artifact("onnx-int8", "int8-static", exporters.export_onnx_int8_static, tolerance=INT8_TOLERANCE),
        Artifact("onnx-int8-dynamic", "int8-dynamic", exporters.export_onnx_int8_dynamic, tolerance=INT8_TOLERANCE),
        Artifact("coreml", "fp16", exporters.export_coreml, batches=(1, 2, 4, 8)),
    )
}
ARTIFACT_NAMES: tuple[str, ...] = tuple(ARTIFACTS)


@dataclass(frozen=True)
class BuildResult:
    name: str  # store name, e.g. resnet50-coreml-b4
    tag: str
    built: bool  # False when the stored model was already current
    seconds: float
    max_abs_diff: float | None = None
    top1_agreement: float | None = None


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
    return np.stack(
        [prepare(photos.photo_jpeg(name), spec, 10**9).pixels for name in photos.PHOTOS[:VERIFICATION_PHOTOS]]
    )


def build(
    weights_choice: str = "auto",
    only: list[str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
    calibration_dir: Path | None = None,
    int8_activations: str = "u8",
) -> list[BuildResult]:
    """Build (or confirm current) every artifact named in ``only`` (default: all).

    ``force`` rebuilds every one from the weights. Raises :class:`VerificationError` when an export
    diverges from PyTorch beyond its tolerance; that artifact is not stored (a previous version stays).
    """
    import torch

    from build_models.context import BuildContext
    from build_models.weights import load_weights
    from fastinfer.torch_model import resnet50

    names = only or list(ARTIFACT_NAMES)
    unknown = [n for n in names if n not in ARTIFACTS]
    if unknown:
        raise ValueError(f"unknown artifact(s) {unknown}; choose from {', '.join(ARTIFACT_NAMES)}")

    progress(f"weights: resolving {weights_choice!r}")
    weights = load_weights(weights_choice)
    progress(f"weights: {weights.kind} ({weights.description}), source hash {weights.source_hash}")
    spec = preprocess_spec()
    ctx = BuildContext(weights, spec, resnet50(weights.state_dict), calibration_dir, int8_activations, force)
    jobs = [(ARTIFACTS[n], b) for n in names for b in ARTIFACTS[n].batches]
    batch: np.ndarray | None = None
    reference: np.ndarray | None = None
    results: list[BuildResult] = []
    try:
        for i, (artifact, size) in enumerate(jobs, 1):
            name = store.model_name(artifact.name, size)
            step = f"[{i}/{len(jobs)}] {name}"
            existing = store.find(artifact.name, size)
            if not force and store.is_current(existing, weights.source_hash):
                progress(f"{step}: up to date ({existing.tag}), skipped")
                results.append(BuildResult(name, str(existing.tag), False, 0.0))
                continue
            progress(f"{step}: exporting ...")
            t0 = time.perf_counter()
            export = artifact.export if size is None else partial(artifact.export, batch=size)
            with tempfile.TemporaryDirectory() as tmp:
                extra = export(ctx, Path(tmp))
                if artifact.name == "onnx-int8":
                    progress(f"{step}: calibrated on {extra['calibration_images']} images ({ctx.calibration_source})")
                check: Fidelity | None = None
                if artifact.tolerance is not None:
                    if batch is None:
                        batch = verification_batch(spec)
                        with torch.inference_mode():
                            reference = ctx.model(torch.from_numpy(batch)).numpy()
                    from fastinfer.engines.onnx import OnnxEngine

                    check = compare(name, reference, OnnxEngine(tmp, cpu_only=True).run(batch))
                    found = (
                        f"on {check.images} real photos: max |logit diff| {check.max_abs_error:.2e}, "
                        f"top-1 agreement {check.top1_agreement:.0%}, top-5 overlap {check.top5_overlap:.0%}"
                    )
                    problems = artifact.tolerance.violations(check)
                    if problems:
                        kept = f"; {existing.tag} stays" if existing is not None else ""
                        raise VerificationError(
                            f"{name}: the export diverges from PyTorch beyond its tolerance: "
                            f"{'; '.join(problems)} ({found}). Nothing stored{kept}."
                        )
                    progress(f"{step}: verified vs PyTorch {found}")
                elif artifact.name == "coreml" and not hardware.is_macos():
                    progress(f"{step}: converted; CoreML prediction needs macOS, so it is verified there (fidelity)")
                labels = {
                    "backend": artifact.name,
                    "precision": artifact.precision,
                    "batch": "dynamic" if size is None else str(size),
                    "weights": weights.kind,
                    "source_hash": weights.source_hash,
                    "build_format": store.BUILD_FORMAT,
                }
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
                    **(
                        {}
                        if check is None
                        else {
                            "max_abs_diff_vs_pytorch": check.max_abs_error,
                            "top1_agreement_vs_pytorch": check.top1_agreement,
                            "top5_overlap_vs_pytorch": check.top5_overlap,
                        }
                    ),
                    **extra,
                }
                import bentoml

                with bentoml.models.create(name, labels=labels, metadata=metadata) as stored:
                    for f in Path(tmp).iterdir():
                        # Not Path.rename, which cannot cross filesystems: where BentoML stages a new
                        # model is its own business (1.4 stages it in TMPDIR, then copies it to the store).
                        shutil.move(f, Path(stored.path) / f.name)
                if existing is not None:  # superseded: keep the store from growing on every --force
                    bentoml.models.delete(existing.tag)
            seconds = time.perf_counter() - t0
            progress(f"{step}: stored {stored.tag} in {seconds:.1f}s")
            diff, agree = (None, None) if check is None else (check.max_abs_error, check.top1_agreement)
            results.append(BuildResult(name, str(stored.tag), True, seconds, diff, agree))
    finally:
        ctx.close()
    return results


def missing() -> list[str]:
    """Store names of the models the store lacks entirely."""
    return [store.model_name(a.name, b) for a in ARTIFACTS.values() for b in a.batches if store.find(a.name, b) is None]
