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


# ---- the hardware probe: what this machine offers, and which backend it should use ----

ISA_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx",
    "amx_int8": "amx_int8",
    "avx512_bf16": "avx512_bf16",
    "amx_bf16": "amx_bf16",
    "asimd": "neon",
}


# What each feature means for the backends (shown by GET /backends and `fastinfer doctor`). Measured
# figures are from BENCHMARKS.md (AMD EPYC, AVX-512 VNNI + BF16); the AMX ones are published figures.
ISA_MEANING = {
    "avx512_vnni": "INT8 dot products: static INT8 (openvino-int8, onnx-int8) ran 2.7-3.8× FP32 ONNX in process",
    "avx_vnni": "INT8 dot products (256-bit): static INT8 (openvino-int8, onnx-int8) beats FP32",
    "amx_int8": "AMX tiles for INT8: openvino-int8 uses them (oneDNN); published ~170-200 img/s/core",
    "avx512_bf16": "BF16 dot products: openvino runs the FP32 model in BF16 (auto precision), ~2× its FP32",
    "amx_bf16": "AMX tiles for BF16: openvino's BF16 runs on them; published ~70-110 img/s/core (FP32 ~14-17)",
    "neon": "ARM SIMD: ONNX Runtime's FP32 and INT8 kernels (OpenVINO's INT8 kernels are x86-only)",
}


def _cpu_linux() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def _sysctl(name: str) -> str:
    import subprocess

    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def probe(check_torch: bool = False) -> dict[str, object]:
    """OS, CPU, cores, the ISA features that matter, Apple chip/Neural Engine, MPS and CUDA.

    ``check_torch`` imports torch to ask it about MPS and CUDA; without it CUDA is inferred from
    the device files and MPS from the platform (the HTTP front never imports torch).
    """
    system = platform.system()
    arm = platform.machine().lower() in ("arm64", "aarch64")
    if system == "Darwin":
        cpu = _sysctl("machdep.cpu.brand_string") or platform.processor()
        flags = {"asimd"} if arm else set(_sysctl("machdep.cpu.features").lower().split())
    else:
        cpu, flags = _cpu_linux()
    isa = sorted({label for flag, label in ISA_FLAGS.items() if flag in flags} | ({"neon"} if arm else set()))
    apple_silicon = system == "Darwin" and arm
    info: dict[str, object] = {
        "os": f"{system} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": cpu_count(),
        "isa": isa,
        "isa_meaning": {label: ISA_MEANING[label] for label in isa if label in ISA_MEANING},
        "apple_chip": cpu if apple_silicon else None,
        "neural_engine": apple_silicon,  # every Apple Silicon chip has one
        "cuda": _cuda_device_present(),
        "mps": apple_silicon,
        "source": "rule" if not check_torch else "torch",
    }
    if check_torch:
        try:
            import torch

            info["cuda"] = bool(torch.cuda.is_available())
            info["cuda_device"] = torch.cuda.get_device_name(0) if info["cuda"] else None
            info["mps"] = bool(torch.backends.mps.is_available())
        except ImportError:
            pass
    return info


def recommend(hw: dict[str, object], available: list[str], profile: dict[str, float] | None = None) -> dict[str, str]:
    """The backend to use here and why: measured throughput when a profile exists, else by rule."""
    if profile:
        measured = {name: rps for name, rps in profile.items() if name in available}
        if measured:
            best = max(measured, key=lambda n: measured[n])
            return {"backend": best, "why": f"highest measured throughput here ({measured[best]:.1f} img/s, profile)"}
    isa = set(hw.get("isa", []))  # type: ignore[arg-type]
    int8_units = bool(isa & {"avx512_vnni", "avx_vnni", "amx_int8"})
    rules = [
        ("coreml-batched", bool(hw.get("neural_engine")), "Apple Neural Engine via CoreML FP16, batched"),
        ("onnx", bool(hw.get("cuda")), "CUDA GPU via ONNX Runtime's CUDA EP"),
        (
            "openvino-int8",
            int8_units,
            "x86 integer dot-product units (VNNI/AMX): OpenVINO's static INT8 ran ~1.4× ONNX Runtime's in process",
        ),
        ("onnx-int8", int8_units, "x86 integer dot-product units (VNNI/AMX) run static INT8 ~2× faster than FP32"),
        ("openvino", bool(isa & {"avx512_bf16", "amx_bf16"}), "BF16 units: OpenVINO runs the FP32 model in BF16"),
        ("openvino", hw.get("machine") in ("x86_64", "AMD64"), "OpenVINO FP32 on an x86 CPU without INT8/BF16 units"),
        ("onnx", True, "ONNX Runtime FP32 on the CPU: no integer dot-product units or accelerator found"),
    ]
    for name, applies, why in rules:
        if applies and name in available:
            return {"backend": name, "why": f"{why} (rule)"}
    return {"backend": available[0] if available else "", "why": "the only backend available here"}
