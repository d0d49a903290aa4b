"""What each backend is, independent of serving: its stored models, where it can run, how to open it.

Runners (BentoML), the profiler, fidelity and doctor all open engines through :func:`open_engine`,
so a backend means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastinfer import hardware, store
from fastinfer.config import BACKENDS
from fastinfer.engines import Engine


@dataclass(frozen=True)
class BackendSpec:
    name: str
    artifact: str  # stored model family: resnet50-<artifact>[-b<N>]
    description: str
    static_batches: tuple[int | None, ...] = (None,)  # the models it loads (None = dynamic batch)
    needs_macos: bool = False

    def model_names(self) -> list[str]:
        return [store.model_name(self.artifact, b) for b in self.static_batches]


COREML_BATCHES = (1, 2, 4, 8)
SPECS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec("pytorch", "pytorch", "torchvision ResNet-50, eager (MPS / CUDA / CPU)"),
        BackendSpec("onnx", "onnx", "ONNX Runtime FP32 (CoreML EP / CUDA EP / CPU EP)"),
        BackendSpec("onnx-int8", "onnx-int8", "ONNX Runtime static QDQ INT8, per-channel (CPU EP)"),
        BackendSpec("onnx-int8-dynamic", "onnx-int8-dynamic", "ONNX Runtime dynamic INT8, ConvInteger (CPU EP)"),
        BackendSpec("coreml", "coreml", "CoreML FP16, batch 1 (Neural Engine / GPU / CPU)", (1,), True),
        BackendSpec("coreml-batched", "coreml", "CoreML FP16, static b1/b2/b4/b8, padded", COREML_BATCHES, True),
    )
}
assert tuple(SPECS) == BACKENDS, "fastinfer.backends.SPECS and fastinfer.config.BACKENDS must agree"


def unavailable_reason(name: str) -> str | None:
    """None when the backend can run on this machine, else why not."""
    spec = SPECS[name]
    missing = [
        n for n, b in zip(spec.model_names(), spec.static_batches, strict=True) if store.find(spec.artifact, b) is None
    ]
    if missing:
        return f"{', '.join(missing)} not in the model store; run `python -m build_models`"
    if spec.needs_macos and not hardware.is_macos():
        return f"CoreML prediction needs macOS; the models are built and stored ({', '.join(spec.model_names())})"
    return None


def model_dirs(name: str) -> dict[int | None, str]:
    spec = SPECS[name]
    found = {b: store.find(spec.artifact, b) for b in spec.static_batches}
    lost = [store.model_name(spec.artifact, b) for b, m in found.items() if m is None]
    if lost:
        raise LookupError(f"{', '.join(lost)} not in the model store; run `python -m build_models`")
    return {b: m.path for b, m in found.items() if m is not None}


def open_engine(name: str, threads: int = 0, dirs: dict[int | None, str] | None = None) -> Engine:
    """Load a backend's engine in this process, from the store (or from ``dirs``)."""
    dirs = dirs or model_dirs(name)
    if name == "pytorch":
        from fastinfer.engines.pytorch import TorchEngine

        return TorchEngine(dirs[None], threads=threads)
    if name.startswith("onnx"):
        from fastinfer.engines.onnx import OnnxEngine

        # INT8 kernels exist on the CPU EP; only FP32 goes to CoreML/CUDA EPs.
        return OnnxEngine(dirs[None], threads=threads, cpu_only=name != "onnx")
    if name.startswith("coreml"):
        from fastinfer.engines.coreml import CoreMLEngine

        return CoreMLEngine.load({b: Path(d) for b, d in dirs.items() if b is not None})
    raise KeyError(name)
