"""In-process engine latency per backend: the model alone, no HTTP, no decode."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from fastinfer.engines import Engine
from fastinfer.measure import plots
from fastinfer.measure.profile import cpu_and_wall


@dataclass(frozen=True)
class EngineTiming:
    backend: str
    batch: int
    median_ms: float
    per_image_ms: float
    images_per_s: float

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def time_engine(backend: str, engine: Engine, images: np.ndarray, batch: int, repeats: int) -> EngineTiming:
    x = np.ascontiguousarray(np.resize(images, (batch, *images.shape[1:])))
    _, median = cpu_and_wall(lambda: engine.run(x), repeats)  # after a warm-up for this shape
    return EngineTiming(backend, batch, round(median, 2), round(median / batch, 2), round(1000 * batch / median, 1))


def table(timings: list[EngineTiming], baseline: str = "onnx") -> str:
    base = {t.batch: t.per_image_ms for t in timings if t.backend == baseline}
    head = ["backend", "batch", "median ms", "ms / image", "images/s", f"× vs {baseline} FP32"]
    rows = [[t.backend, t.batch, t.median_ms, t.per_image_ms, t.images_per_s,
             f"{base[t.batch] / t.per_image_ms:.2f}×" if t.batch in base else "—"] for t in timings]  # fmt: skip
    return plots.table(head, rows)
