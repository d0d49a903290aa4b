"""Which device and execution providers a backend should use on this machine, and how many threads.

Kept free of heavy imports at module level: torch and onnxruntime are imported only by the
functions that need them, so the HTTP front never loads them.
"""

from __future__ import annotations

import os
import platform


def cpu_count() -> int:
    """Cores this process may use (honours CPU affinity / cgroup-pinned sets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def intra_op_threads(workers: int, override: int = 0) -> int:
    """Threads per inference process, so that ``workers`` processes do not oversubscribe the cores."""
    if override > 0:
        return override
    return max(1, cpu_count() // max(1, workers))


def is_macos() -> bool:
    return platform.system() == "Darwin"


def torch_device() -> str:
    """MPS on Apple, then CUDA, then CPU."""
    import torch

    if torch.backends.mps.is_available():
        return "mps"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def onnx_providers(available: list[str] | None = None, cpu_only: bool = False) -> list[str]:
    """ONNX Runtime providers in preference order: CoreML EP on macOS, CUDA EP when present, CPU."""
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    chosen: list[str] = []
    if not cpu_only:
        if is_macos() and "CoreMLExecutionProvider" in available:
            chosen.append("CoreMLExecutionProvider")
        if "CUDAExecutionProvider" in available and _cuda_device_present():
            chosen.append("CUDAExecutionProvider")
    chosen.append("CPUExecutionProvider")
    return chosen


def _cuda_device_present() -> bool:
    """The CUDA EP is in the GPU wheel even without a GPU; only ask for it when a device exists."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl")) or platform.system() == "Windows"
