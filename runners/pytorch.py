"""PyTorch eager runner: MPS on Apple, CUDA if present, else CPU."""

from __future__ import annotations

from fastinfer import hardware
from fastinfer.config import get_settings
from runners.base import make_runner


def _load(model_dir: str):  # noqa: ANN202 - returns an Engine; torch stays a lazy import
    from fastinfer.engines.pytorch import TorchEngine

    settings = get_settings()
    return TorchEngine(model_dir, threads=hardware.intra_op_threads(settings.runner_workers, settings.threads))


PytorchRunner = make_runner("pytorch", _load)
