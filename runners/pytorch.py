"""PyTorch eager runner: MPS on Apple, CUDA if present, else CPU."""

from runners.base import make_runner

PytorchRunner = make_runner("pytorch")
