"""ONNX Runtime engine: one session over a stored ``.onnx`` file (FP32 or INT8).

It reports where the graph's nodes actually run, from ORT's profile of one run: an execution provider that
takes fewer than all of them (CoreML EP leaving ops to the CPU) is otherwise a silent fallback.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.common import hardware
from fastinfer.engines import square_side

MODEL_FILE = "model.onnx"


class OnnxEngine:
    def __init__(
        self, model_dir: str | Path, providers: list[str] | None = None, threads: int = 0, cpu_only: bool = False
    ) -> None:
        import onnxruntime as ort

        self.version = ort.__version__
        self.requested = providers or hardware.onnx_providers(cpu_only=cpu_only)
        self.threads = threads if threads > 0 else hardware.cpu_count()
        path = str(Path(model_dir) / MODEL_FILE)
        with tempfile.TemporaryDirectory() as tmp:
            # One profiled run tells which provider executed each node; profiling then stops.
            self.session = ort.InferenceSession(path, self._options(ort, Path(tmp)), providers=self.requested)
            declared = self.session.get_inputs()[0]
            self.input_name = declared.name
            self.input_size = square_side(declared.shape)  # the crop size the graph was exported at
            self.run(np.zeros((1, self.input_size, self.input_size, 3), dtype=np.uint8))
            self.node_placement = placement_from_profile(Path(self.session.end_profiling()))

    @classmethod
    def open(cls, dirs: Mapping[int | None, str], threads: int = 0, **options: Any) -> OnnxEngine:
        return cls(dirs[None], threads=threads, **options)

    def _options(self, ort: Any, profile_dir: Path) -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        # Idle threads spin by default, burning the cores decoding needs (FP32 b1: 62 vs 99 ms of CPU).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "ort")
        return options

    def run(self, images: np.ndarray) -> np.ndarray:
        (logits,) = self.session.run(None, {self.input_name: np.ascontiguousarray(images, dtype=np.uint8)})
        return logits

    def fallbacks(self) -> list[str]:
        """Human sentences for every requested accelerator that did not take the whole graph."""
        total = sum(self.node_placement.values())
        out = []
        for provider in self.requested:
            if provider == "CPUExecutionProvider":
                continue
            taken = self.node_placement.get(provider, 0)
            if taken < total:
                out.append(f"{provider} took {taken}/{total} nodes; the rest run on the CPU")
        return out

    def identity(self) -> str:
        # The precision is the stored graph's own (named by its tag); the providers that run it decide the rest.
        return f"ONNX Runtime {self.version} on {'+'.join(self.session.get_providers())}"

    def describe(self) -> dict[str, Any]:
        total = sum(self.node_placement.values())
        return {
            "execution_providers": self.session.get_providers(),
            "requested_providers": self.requested,
            "node_placement": {p: f"{n}/{total} nodes" for p, n in self.node_placement.items()},
            "fallbacks": self.fallbacks(),
            "threads": self.threads,
        }


def placement_from_profile(profile: Path) -> dict[str, int]:
    """Count distinct graph nodes per execution provider in an ORT profile (JSON trace)."""
    nodes: dict[str, str] = {}
    for event in json.loads(profile.read_text()):
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args:
            node = event["name"].removesuffix("_kernel_time").removesuffix("_fence_before").removesuffix("_fence_after")
            nodes[node] = args["provider"]
    return dict(Counter(nodes.values()))
