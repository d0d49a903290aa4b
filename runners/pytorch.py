"""PyTorch eager runner: MPS on Apple, CUDA if present, else CPU."""

from __future__ import annotations

from fastinfer import hardware
from fastinfer.config import get_settings
from fastinfer.engines import Engine
from runners.base import make_runner


def _load(model_dir: str) -> Engine:
    from fastinfer.engines.pytorch import TorchEngine

    settings = get_settings()
    return TorchEngine(model_dir, threads=hardware.intra_op_threads(settings.runner_workers, settings.threads))


PytorchRunner = make_runner("pytorch", _load)
