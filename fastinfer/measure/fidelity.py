"""How closely each backend reproduces the FP32 PyTorch reference on real photos: top-1 agreement, top-5
overlap, cosine similarity of the logits and the max absolute logit error."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.engines import Engine
from fastinfer.measure import photos, plots
from fastinfer.measure.accuracy import run_precision
from fastinfer.serving.preprocess import prepare


@dataclass(frozen=True)
class Gate:
    """How far a backend may drift from the FP32 PyTorch reference."""

    max_abs_error: float
    min_top1: float
    min_top5: float = 0.0
    max_error_per_std: float = 0.0  # the error allowed grows with the logits' scale (a fine-tuned head's)

    def error_limit(self, f: Fidelity) -> float:
        return max(self.max_abs_error, self.max_error_per_std * f.reference_std)

    def violations(self, f: Fidelity) -> list[str]:
        out = []
        if not f.max_abs_error <= self.error_limit(f):  # written so that NaN fails too
            out.append(f"max |logit diff| {f.max_abs_error:.3g} > {self.error_limit(f):.3g}")
        if f.top1_agreement < self.min_top1:
            out.append(f"top-1 agreement {f.top1_agreement:.1%} < {self.min_top1:.1%}")
        if f.top5_overlap < self.min_top5:
            out.append(f"top-5 overlap {f.top5_overlap:.1%} < {self.min_top5:.1%}")
        return out

    def passes(self, f: Fidelity) -> bool:
        return not self.violations(f)


INT8_MIN_TOP1, INT8_MIN_TOP5, INT8_MAX_ERROR, INT8_MAX_ERROR_PER_STD = 0.90, 0.85, 5.0, 0.3
# The gates against FP32 PyTorch, shared by tests/unit/test_fidelity.py (which shows what each catches) and the
# build's verification. FP32: the same graph in another runtime (measured ~3e-5 to 1e-4). BF16: measured top-1
# 100%, top-5 98.9%, max error 0.39. INT8: 5 logits, or 0.3 std of the reference's logits where that is more.
INT8_GATE = Gate(INT8_MAX_ERROR, INT8_MIN_TOP1, INT8_MIN_TOP5, INT8_MAX_ERROR_PER_STD)
FP32_GATE = Gate(max_abs_error=1e-3, min_top1=1.0)
BF16_GATE = Gate(max_abs_error=1.0, min_top1=0.95, min_top5=0.95)


@dataclass(frozen=True)
class Fidelity:
    backend: str
    images: int
    top1_agreement: float
    top5_overlap: float
    cosine: float  # mean over images
    max_abs_error: float
    reference_std: float = 0.0  # of the reference's logits: their scale


def fidelity_images(spec: PreprocessSpec) -> np.ndarray:
    """36 real photos, framed unlike the INT8 calibration set: JPEG q85 whole, a central 80% crop, a quarter turn."""
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
    k = min(5, reference.shape[1])  # a family of 3 classes has a top-3, not a top-5
    ref_top5 = np.argsort(-reference, axis=1)[:, :k]
    top5 = np.argsort(-logits, axis=1)[:, :k]
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_top5, top5, strict=True)])
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
        reference_std=float(np.std(reference)),
    )


def gate_for(backend: str, precision: str | None) -> tuple[str, Gate] | None:
    """Which gate a backend answers to, by what it computes in (None: no gate, e.g. CoreML FP16)."""
    if "int8" in backend or precision == "int8":
        return "int8", INT8_GATE
    if precision == "bf16":
        return "bf16", BF16_GATE
    if precision in ("f32", "fp32"):
        return "fp32", FP32_GATE
    return None  # FP16 (CoreML), or an engine that does not say


def measure(backend: str, engine: Engine, images: np.ndarray, reference: np.ndarray) -> dict[str, object]:
    """One backend against the reference, with the precision it ran at and its gate's verdict."""
    precision = run_precision(backend, engine.describe())
    f = compare(backend, reference, run_batched(engine, images))
    out: dict[str, object] = {**asdict(f), "precision": precision}
    gate = gate_for(backend, precision)
    if gate is not None:
        out |= {"gate": gate[0], "gate_passed": gate[1].passes(f)}
    return out


def run_batched(engine: Engine, images: np.ndarray, batch: int = 8) -> np.ndarray:
    return np.concatenate([engine.run(images[i : i + batch]) for i in range(0, len(images), batch)])


def table(results: list[dict[str, object]]) -> str:
    head = ["backend", "runs at", "images", "top-1 agreement", "top-5 overlap", "cosine", "max abs logit error", "gate"]
    rows = [[r["backend"], r["precision"], r["images"], f"{r['top1_agreement']:.1%}", f"{r['top5_overlap']:.1%}",
             f"{r['cosine']:.5f}", f"{r['max_abs_error']:.3g}",
             f"{r['gate']} {'passed' if r['gate_passed'] else 'FAILED'}" if "gate" in r else "—"]
            for r in results]  # fmt: skip
    return plots.table(head, rows)
