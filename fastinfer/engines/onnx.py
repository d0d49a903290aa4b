"""ONNX Runtime engine: one session over a stored ``.onnx`` file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fastinfer import hardware

MODEL_FILE = "model.onnx"


class OnnxEngine:
    def __init__(
        self,
        model_dir: str | Path,
        providers: list[str] | None = None,
        threads: int = 0,
        cpu_only: bool = False,
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads if threads > 0 else hardware.cpu_count()
        options.inter_op_num_threads = 1
        self.requested = providers or hardware.onnx_providers(cpu_only=cpu_only)
        self.session = ort.InferenceSession(
            str(Path(model_dir) / MODEL_FILE), sess_options=options, providers=self.requested
        )
        self.threads = options.intra_op_num_threads
        self.input_name = self.session.get_inputs()[0].name

    def run(self, images: np.ndarray) -> np.ndarray:
        (logits,) = self.session.run(None, {self.input_name: np.ascontiguousarray(images, dtype=np.uint8)})
        return logits

    def describe(self) -> dict[str, Any]:
        return {
            "execution_providers": self.session.get_providers(),
            "requested_providers": self.requested,
            "threads": self.threads,
        }
