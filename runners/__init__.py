"""The registry: backend name → the runner that serves it, and how (``infer`` or ``infer_batched``).

Several backends may share one runner: ``coreml`` and ``coreml-batched`` are the same CoreML
runner called without and with batching. What a backend *is* (models, platform) lives in
fastinfer/backends.py; this module only adds the serving side.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastinfer import hardware
from fastinfer.backends import SPECS, BackendSpec
from fastinfer.backends import unavailable_reason as unavailable_reason
from fastinfer.config import get_settings


@dataclass(frozen=True)
class Backend:
    spec: BackendSpec
    runner: str  # attribute of the front service that holds the runner (bentoml.depends)

    @property
    def name(self) -> str:
        return self.spec.name

    def method(self, batched: bool | None = None) -> str:
        """``infer_batched`` when batching is on for this backend (or forced), else ``infer``."""
        on = get_settings().batching_for(self.name).enabled if batched is None else batched
        return "infer_batched" if on else "infer"


RUNNER_OF = {
    "pytorch": "pytorch",
    "onnx": "onnx",
    "onnx-int8": "onnx_int8",
    "onnx-int8-dynamic": "onnx_int8_dynamic",
    "coreml": "coreml",
    "coreml-batched": "coreml",
}
REGISTRY: dict[str, Backend] = {name: Backend(spec, RUNNER_OF[name]) for name, spec in SPECS.items()}


def runs_here(runner: str) -> bool:
    """Whether a runner process should be started on this machine at all."""
    return any(b.runner == runner and not (b.spec.needs_macos and not hardware.is_macos()) for b in REGISTRY.values())
