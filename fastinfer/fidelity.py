"""How closely each backend reproduces the FP32 PyTorch reference, on real photos.

Metrics per backend: top-1 agreement, top-5 overlap, cosine similarity of the logits, and the
max absolute logit error. ``fastinfer fidelity`` prints the table and writes JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from fastinfer import photos
from fastinfer.engines import Engine
from fastinfer.preprocess import PreprocessSpec, prepare

INT8_MIN_TOP1, INT8_MIN_TOP5, INT8_MAX_ERROR = 0.90, 0.85, 5.0
"""The INT8 gates against FP32 PyTorch, shared by the gated tests (tests/unit/test_fidelity.py, where
they are shown to catch a model calibrated on nothing and a wrong input scale) and the build's
verification (build_models)."""


@dataclass(frozen=True)
class Fidelity:
    backend: str
    images: int
    top1_agreement: float
    top5_overlap: float
    cosine: float  # mean over images
    max_abs_error: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def fidelity_images(spec: PreprocessSpec) -> np.ndarray:
    """36 real photos, framed differently from the INT8 calibration set: JPEG q85 whole, a
    central 80% crop, and a quarter turn."""
    out = []
    for name in photos.PHOTOS:
        img = photos.load(name)
        w, h = img.size
        variants = [
            img,
            img.crop((w // 10, h // 10, w - w // 10, h - h // 10)),
            img.transpose(Image.Transpose.ROTATE_90),
        ]
        out.extend(prepare(photos.encode(v, "JPEG", 85), spec, 10**9).pixels for v in variants)
    return np.stack(out)


def compare(backend: str, reference: np.ndarray, logits: np.ndarray) -> Fidelity:
    ref_top5 = np.argsort(-reference, axis=1)[:, :5]
    top5 = np.argsort(-logits, axis=1)[:, :5]
    overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(ref_top5, top5, strict=True)])
    cosine = np.sum(reference * logits, axis=1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(logits, axis=1) + 1e-12
    )
    return Fidelity(
        backend=backend,
        images=len(reference),
        top1_agreement=float(np.mean(ref_top5[:, 0] == top5[:, 0])),
        top5_overlap=float(overlap),
        cosine=float(np.mean(cosine)),
        max_abs_error=float(np.max(np.abs(reference - logits))),
    )


def run_batched(engine: Engine, images: np.ndarray, batch: int = 8) -> np.ndarray:
    return np.concatenate([engine.run(images[i : i + batch]) for i in range(0, len(images), batch)])


def table(results: list[Fidelity]) -> str:
    lines = [
        "| backend | images | top-1 agreement | top-5 overlap | cosine | max abs logit error |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.backend} | {r.images} | {r.top1_agreement:.1%} | {r.top5_overlap:.1%} | {r.cosine:.5f} | "
        f"{r.max_abs_error:.3g} |"
        for r in results
    ]
    return "\n".join(lines)
