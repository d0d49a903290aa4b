"""CoreML FP16 engine over static-batch mlprograms (b1/b2/b4/b8).

A batch of n images runs on the smallest static model >= n, padded with zeros, and is sliced back to n rows;
more than the largest is split. Plain Python over ``predictors``: tested anywhere with a stand-in model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.engines import DEFAULT_INPUT_SIZE, square_side

PACKAGE_DIR = "model.mlpackage"

Predictor = Callable[[np.ndarray], np.ndarray]  # [b,S,S,3] uint8 → [b,C] float32, for exactly its own b


def choose_batch(n: int, sizes: list[int]) -> int:
    fitting = [s for s in sizes if s >= n]
    return min(fitting) if fitting else max(sizes)


class CoreMLEngine:
    def __init__(
        self,
        predictors: Mapping[int, Predictor],
        description: dict[str, Any] | None = None,
        input_size: int = DEFAULT_INPUT_SIZE,
    ) -> None:
        if not predictors:
            raise ValueError("CoreMLEngine needs at least one static-batch model")
        self.input_size = input_size
        self.predictors = dict(sorted(predictors.items()))
        self.sizes = list(self.predictors)
        self.padded_rows = 0  # rows of zeros computed so far: the price of static shapes
        self._description = description or {}

    @classmethod
    def open(cls, dirs: Mapping[int | None, str], threads: int = 0, **options: Any) -> CoreMLEngine:
        """The stored static-batch mlpackages with ComputeUnit.ALL (Neural Engine, GPU or CPU; CoreML chooses its
        own threads). macOS only."""
        import coremltools as ct

        predictors: dict[int, Predictor] = {}
        side = DEFAULT_INPUT_SIZE
        for size, directory in dirs.items():
            if size is None:
                continue
            model = ct.models.MLModel(str(Path(directory) / PACKAGE_DIR), compute_units=ct.ComputeUnit.ALL)
            # Every static-batch model of a family takes its crop size: the exported input's S.
            side = square_side(model.get_spec().description.input[0].type.multiArrayType.shape)

            def predict(images: np.ndarray, model: Any = model) -> np.ndarray:
                out = model.predict({"images": images.astype(np.int32)})
                return np.asarray(out["logits"], dtype=np.float32)

            predictors[size] = predict
        return cls(
            predictors,
            {
                "runtime": f"coremltools {ct.__version__}",
                "compute_units": "ALL (Neural Engine, GPU, CPU)",
                "precision": "fp16",
            },
            input_size=side,
        )

    def run(self, images: np.ndarray) -> np.ndarray:
        largest = self.sizes[-1]
        if len(images) > largest:
            return np.concatenate([self.run(images[i : i + largest]) for i in range(0, len(images), largest)])
        n = len(images)
        size = choose_batch(n, self.sizes)
        if size > n:
            pad = np.zeros((size - n, *images.shape[1:]), dtype=images.dtype)
            images = np.concatenate([images, pad])
            self.padded_rows += size - n
        return self.predictors[size](images)[:n]

    def identity(self) -> str:
        d = self._description
        return f"{d.get('runtime', 'CoreML')} on {d.get('compute_units', 'ALL')} at {d.get('precision', 'fp16')}"

    def describe(self) -> dict[str, Any]:
        return {**self._description, "static_batches": self.sizes, "padded_rows": self.padded_rows}
