"""ONNX Runtime FP32 runner: CoreML EP on macOS, CUDA EP when a GPU is present, else CPU EP."""

from __future__ import annotations

from fastinfer import hardware
from fastinfer.config import get_settings
from fastinfer.engines import Engine
from runners.base import make_runner


def _load(model_dir: str) -> Engine:
    from fastinfer.engines.onnx import OnnxEngine

    settings = get_settings()
    return OnnxEngine(model_dir, threads=hardware.intra_op_threads(settings.runner_workers, settings.threads))


OnnxRunner = make_runner("onnx", _load)
