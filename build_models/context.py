"""What every exporter may need, each computed at most once per build."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from build_models.converters import int8_scheme, write_onnx_fp32, write_onnx_int8_static
from build_models.text import as_text
from fastinfer.catalog import store, store_check
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common.files import file_sha256
from fastinfer.engines.onnx import MODEL_FILE as ONNX_FILE
from fastinfer.measure import photos
from fastinfer.measure.photos import UnusablePhoto, photo_pixels
from fastinfer.serving.preprocess import prepare

if TYPE_CHECKING:
    from bentoml import Model

    from build_models.weights import Weights
    from fastinfer.engines.torch_model import Uint8Classifier

# What an export's bytes depend on beyond the source: the runtimes it is exported and quantized with.
EXPORT_RUNTIMES = ("torch", "onnx", "onnxruntime", "openvino", "nncf", "coremltools")
EXPORT_CODE = ("exporters", "converters", "weights", "context")  # build_models/ modules that write the bytes


@functools.cache
def build_code() -> str:
    """The ``built_by`` label: a digest of the export code and the runtimes' versions, so a model an older build
    made is rebuilt. Not the CLI's or the gate's code: editing a message must not outdate the store."""
    here, engines = Path(__file__).parent, Path(importlib.util.find_spec("fastinfer.engines").origin).parent
    digest = hashlib.sha256()
    # This module (calibration, the shared FP32 and INT8 files) among them; read by path: no import cycle.
    for path in (*(here / f"{m}.py" for m in EXPORT_CODE), engines / "torch_model.py", engines / "pytorch.py"):
        digest.update(path.read_bytes())
    for runtime in EXPORT_RUNTIMES:
        try:
            digest.update(f"{runtime}=={importlib.metadata.version(runtime)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{runtime} absent".encode())
    return digest.hexdigest()[:16]


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def sample_calibration_images(spec: PreprocessSpec) -> list[np.ndarray]:
    """The bundled sample set: each photo whole, as two deterministic crops and a flip, preprocessed as served."""
    out: list[np.ndarray] = []
    for name in photos.PHOTOS:
        img = photos.load(name)
        w, h = img.size
        variants = [
            img,
            img.crop((0, 0, int(w * 0.7), int(h * 0.7))),
            img.crop((int(w * 0.3), int(h * 0.3), w, h)),
            img.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        ]
        out.extend(prepare(photos.encode(v, "PNG"), spec, 10**9).pixels for v in variants)
    return out


class BadCalibrationDir(ValueError):
    """A ``--calibration-dir`` that holds no image to calibrate on: said in one line."""


@dataclass(frozen=True)
class Calibration:
    images: list[np.ndarray]  # through the service's preprocessing
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why): named image files not used


def directory_images(directory: Path, spec: PreprocessSpec) -> Calibration:
    """Every image file under ``directory`` (hidden ones aside) through the service's preprocessing, none over the
    server's FASTINFER_MAX_PIXELS (a 30000×30000 PNG of 875 KB takes 5 GB to decode); one it refuses is skipped
    and named. BadCalibrationDir when none is left."""
    from fastinfer.catalog.config import get_settings

    shown = as_text(str(directory))
    if not directory.is_dir():
        why = "not a folder" if directory.exists() else "no such folder"
        raise BadCalibrationDir(f"--calibration-dir {shown}: {why}")
    try:
        limit = get_settings().max_pixels
    except ValueError as exc:  # a bad setting: the same one would stop a server
        why = f"the settings do not hold, so the calibration photos' pixel limit is unknown: {exc}"
        raise BadCalibrationDir(why) from None
    found = (p for p in directory.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    files = sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(directory).parts))
    if not files:
        raise BadCalibrationDir(
            f"--calibration-dir {shown}: no images found (files ending {', '.join(sorted(IMAGE_SUFFIXES))})"
        )
    images: list[np.ndarray] = []
    skipped: list[tuple[str, str]] = []
    for path in files:
        try:
            images.append(photo_pixels(path, spec, limit))
        except UnusablePhoto as exc:
            skipped.append((as_text(str(path)), as_text(str(exc))))
    if not images:
        first, why = skipped[0]
        raise BadCalibrationDir(
            f"--calibration-dir {shown}: none of its {len(files)} image file(s) can be used (first: {first}: {why})"
        )
    return Calibration(images, skipped)


def stored_int8_sha256(family_name: str) -> str | None:
    """The sha256 of a family's stored onnx-int8 model's file (None when there is none)."""
    stored = store.find("onnx-int8", family_name=family_name)
    return None if stored is None else file_sha256(Path(stored.path) / ONNX_FILE)


def family_hash(weights_hash: str, categories: list[str], spec: PreprocessSpec) -> str:
    """A family's ``source_hash`` label: weights, labels and preprocessing, so that changing any one rebuilds."""
    source = {
        "weights": weights_hash,
        "categories": categories,
        "resize_size": spec.resize_size,
        "crop_size": spec.crop_size,
        "mean": list(spec.mean),
        "std": list(spec.std),
    }
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class BuildContext:
    weights: Weights
    spec: PreprocessSpec  # the family's preprocessing: its mean/std are in ``model``, its crop in every export
    model: Uint8Classifier
    calibration_dir: Path | None = None
    int8_activations: str | None = None  # None: not asked for (u8; a stored model of either kind stands)
    force: bool = False  # rebuild from the weights: never reuse a stored export
    family: str = store.DEFAULT_FAMILY  # whose models every store lookup of this build finds
    categories: list[str] = field(default_factory=list)  # the family's labels, one per class
    _tmp: tempfile.TemporaryDirectory = field(default_factory=tempfile.TemporaryDirectory)
    _onnx_int8: tuple[Path, dict[str, Any]] | None = None
    _health: dict[str, store_check.Health] = field(default_factory=dict)

    def health(self, model: Model) -> store_check.Health:
        """A stored model's files against their record, read at most once per build."""
        if str(model.tag) not in self._health:
            self._health[str(model.tag)] = store_check.check(model)
        return self._health[str(model.tag)]

    @property
    def source_hash(self) -> str:
        """The ``source_hash`` this build labels its models with: weights, labels and preprocessing."""
        return family_hash(self.weights.source_hash, self.categories, self.spec)

    def reusable(self, artifact: str) -> Model | None:
        """The stored model of ``artifact`` whose file an export may start from (built from this source, and
        intact), or None."""
        model = store.find(artifact, family_name=self.family)
        current = model is not None and store.is_current(model, self.source_hash, build_code())
        return model if current and self.health(model).intact else None

    @property
    def activation_type(self) -> str:
        return self.int8_activations or "u8"

    @property
    def calibration_source(self) -> str:
        if self.calibration_dir is None:
            return "bundled scikit-image photos (+crops, flips)"
        return as_text(str(self.calibration_dir))  # recorded with the INT8 models: valid text

    @functools.cached_property
    def onnx_fp32(self) -> Path:
        """The FP32 ONNX file, made at most once: a copy of the stored one when current (never the stored file
        itself, which rebuilding ``onnx`` deletes mid-build), else a fresh export."""
        path = Path(self._tmp.name) / "fp32.onnx"
        if not self.force and (stored := self.reusable("onnx")) is not None:
            shutil.copyfile(Path(stored.path) / ONNX_FILE, path)
        else:
            write_onnx_fp32(self.model, path, self.spec.crop_size)
        return path

    def onnx_int8(self, fresh: bool = False) -> tuple[Path, dict[str, Any]]:
        """The static INT8 ONNX file and its calibration metadata, made at most once: calibrated when ``fresh``,
        else the stored one when current and calibrated as asked (one calibration for both runtimes)."""
        if self._onnx_int8 is None:
            path = Path(self._tmp.name) / "int8.onnx"
            stored = None if fresh else self.reusable("onnx-int8")
            if stored is not None and self.calibrated_as_asked(stored):
                shutil.copyfile(Path(stored.path) / ONNX_FILE, path)
                meta = stored.info.metadata
                calibration = {k: meta[k] for k in ("quantization", "calibration_images", "calibration_source")}
            else:
                images = self.calibration.images
                calibration = write_onnx_int8_static(self.onnx_fp32, images, self.activation_type, path)
                calibration["calibration_source"] = self.calibration_source
            self._onnx_int8 = (path, calibration)
        return self._onnx_int8

    def calibrated_as_asked(self, model: Model) -> bool:
        """A stored onnx-int8 model is current only if calibrated as this build asks (when it asks)."""
        meta = model.info.metadata
        if self.calibration_dir is not None and meta.get("calibration_source") != self.calibration_source:
            return False
        scheme = int8_scheme(self.activation_type)
        return self.int8_activations is None or str(meta.get("quantization", "")).startswith(scheme + ",")

    def converts_stored_int8_as_asked(self, model: Model) -> bool:
        """A stored openvino-int8 model is current only if converted from the onnx-int8 model stored now, and
        calibrated as asked."""
        stored = model.info.metadata.get("int8_onnx_sha256") == stored_int8_sha256(self.family)
        return stored and self.calibrated_as_asked(model)

    @functools.cached_property
    def calibration(self) -> Calibration:
        """The calibration photos, read at most once (BadCalibrationDir when the folder has none)."""
        if self.calibration_dir is None:
            return Calibration(sample_calibration_images(self.spec))
        return directory_images(self.calibration_dir, self.spec)

    def close(self) -> None:
        self._tmp.cleanup()
