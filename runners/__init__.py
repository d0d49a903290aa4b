"""The registry: backend name → which runner serves it, how, and whether it can run here.

A backend is a (runner, method) pair: several backends may share one runner (for example
batched and unbatched calls to the same model). Availability is decided here, once, so that
``/backends``, the routes and the dashboard all give the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastinfer import store
from fastinfer.config import BACKENDS, get_settings


@dataclass(frozen=True)
class Backend:
    name: str
    runner: str  # attribute of the front service that holds the runner (bentoml.depends)
    description: str

    @property
    def batched(self) -> bool:
        return get_settings().batching_for(self.name).enabled

    @property
    def method(self) -> str:
        return "infer_batched" if self.batched else "infer"


REGISTRY: dict[str, Backend] = {
    "pytorch": Backend("pytorch", "pytorch", "torchvision ResNet-50, eager (MPS / CUDA / CPU)"),
    "onnx": Backend("onnx", "onnx", "ONNX Runtime FP32 (CoreML EP / CUDA EP / CPU EP)"),
}
assert tuple(REGISTRY) == BACKENDS, "runners.REGISTRY and fastinfer.config.BACKENDS must agree"


def unavailable_reason(name: str) -> str | None:
    """None when the backend can run on this machine, else why not (checked at startup)."""
    if store.find(name) is None:
        return f"{store.model_name(name)} is not in the model store; run `python -m build_models`"
    return None
