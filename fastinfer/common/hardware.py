"""Which device and execution providers a backend should use on this machine, and how many threads.

torch and onnxruntime are imported only inside the functions that need them: the HTTP front never loads them.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

# ---- the CPU budget: the cores this process may use (affinity, then a container's cgroup v2 CPU quota) ----


@dataclass(frozen=True)
class CpuBudget:
    """How many threads this process should size its pools for: min(CPU affinity, the tightest cgroup v2 CPU quota
    rounded up); ``quota`` in CPUs or None; ``source`` says it in words (``cores_source``). A cgroup v1 host gets
    its affinity alone."""

    count: int
    affinity: int
    quota: float | None
    source: str


_CGROUP_ROOT = "/sys/fs/cgroup"  # where cgroup2 usually is when /proc/self/mountinfo does not say


def _affinity() -> tuple[int, str]:
    try:
        return max(1, len(os.sched_getaffinity(0))), "CPU affinity"
    except (AttributeError, OSError):  # macOS has no sched_getaffinity (and no cgroups)
        return max(1, os.cpu_count() or 1), "os.cpu_count()"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _inside(root: Path, absolute: str) -> Path:
    """``absolute`` (a path as the running system names it) under ``root`` ("/" on a real machine)."""
    return root / absolute.lstrip("/")


def _own_cgroup(text: str | None) -> str | None:
    """This process's cgroup v2 path, from /proc/self/cgroup's ``0::<path>`` line."""
    for line in (text or "").splitlines():
        if line.startswith("0::/"):
            return line.strip()[3:]
    return None


def _mount(text: str | None) -> tuple[str, str]:
    """(mount point, root of the mount) of the cgroup v2 hierarchy, from mountinfo: the one under /sys/fs/cgroup
    where there are several (a host's, bind-mounted elsewhere, is not ours); /sys/fs/cgroup when none is listed."""
    mounts = []
    for line in (text or "").splitlines():
        fields = line.split()
        sep = fields.index("-") if "-" in fields else 0
        if sep >= 5 and fields[sep + 1 : sep + 2] == ["cgroup2"]:
            # mountinfo writes a space, tab, newline and backslash in a path as octal (\040)
            root, point = (re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f) for f in fields[3:5])
            mounts.append((point, root))
    usual = [m for m in mounts if m[0] == _CGROUP_ROOT or m[0].startswith(_CGROUP_ROOT + "/")]
    return (usual or mounts or [(_CGROUP_ROOT, "/")])[0]


def _chain(mount: Path, mount_root: str, cgroup: str) -> list[tuple[Path, str]]:
    """The process's cgroup folder and every ancestor up to the mount point, deepest first, with the cgroup path
    each stands for. A cgroup outside the mounted part starts at the mount point: the nearest one visible."""
    root_parts = [p for p in mount_root.split("/") if p]
    parts = [p for p in cgroup.split("/") if p]
    if ".." in parts or parts[: len(root_parts)] != root_parts:
        parts = root_parts
    relative = parts[len(root_parts) :]
    return [
        (mount.joinpath(*relative[:depth]), "/" + "/".join(parts[: len(root_parts) + depth]))
        for depth in range(len(relative), -1, -1)
    ]


def _limit(folder: Path, cgroup: str) -> tuple[int, int, str] | None:
    """``cpu.max``'s "QUOTA PERIOD" as (quota µs, period µs, cgroup); "max PERIOD" or anything garbled: no limit."""
    fields = (_read(folder / "cpu.max") or "").split()
    try:
        quota, period = map(int, fields) if len(fields) == 2 else (0, 0)
    except ValueError:
        return None
    return (quota, period, cgroup) if quota > 0 and period > 0 else None


def _cgroup_limits(root: Path) -> list[tuple[int, int, str]]:
    """Every CPU quota from this process's cgroup up to the root (the tightest binds)."""
    proc = _inside(root, "/proc/self")
    cgroup = _own_cgroup(_read(proc / "cgroup"))
    if cgroup is None:
        return []
    point, mount_root = _mount(_read(proc / "mountinfo"))
    return [
        limit for folder, name in _chain(_inside(root, point), mount_root, cgroup) if (limit := _limit(folder, name))
    ]


def probe_cpu_budget(root: Path = Path("/"), affinity: int | None = None) -> CpuBudget:
    """The CPU budget, read afresh under ``root`` (tests lay cgroup files out in a folder); a garbled cgroup
    file is no limit, never an error."""
    if affinity is None:
        cores, what = _affinity()
    else:
        cores, what = max(1, affinity), "CPU affinity"
    try:
        limits = _cgroup_limits(root)
    except (OSError, ValueError):  # a path the OS refuses (too long, NUL...): no limit from it
        limits = []
    if not limits:
        return CpuBudget(cores, cores, None, f"{what} ({cores}), no cgroup CPU limit")
    quota, period, cgroup = min(limits, key=lambda limit: Fraction(limit[0], limit[1]))
    allowed = max(1, -(-quota // period))  # rounded up: 1.5 CPUs of quota → 2 threads
    limit = f"cgroup v2 cpu.max {quota}/{period}" + (f" in {cgroup}" if cgroup != "/" else "")
    if allowed < cores:
        return CpuBudget(allowed, cores, quota / period, f"{limit} → {allowed} ({what} {cores})")
    return CpuBudget(cores, cores, quota / period, f"{what} ({cores}); {limit} allows {allowed}")


@functools.lru_cache(maxsize=1)
def cpu_budget() -> CpuBudget:
    """This process's CPU budget, probed once (``cpu_budget.cache_clear()`` probes again)."""
    return probe_cpu_budget()


def cpu_count() -> int:
    """Cores this process may use: its CPU affinity, capped by its container's CPU quota (cgroups)."""
    return cpu_budget().count


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
    """OS, CPU, cores, the ISA features that matter, Apple chip/Neural Engine, MPS and CUDA (asking torch
    only with ``check_torch``: the HTTP front never imports it)."""
    system = platform.system()
    arm = platform.machine().lower() in ("arm64", "aarch64")
    if system == "Darwin":
        cpu = _sysctl("machdep.cpu.brand_string") or platform.processor()
        flags = {"asimd"} if arm else set(_sysctl("machdep.cpu.features").lower().split())
    else:
        cpu, flags = _cpu_linux()
    isa = sorted({label for flag, label in ISA_FLAGS.items() if flag in flags} | ({"neon"} if arm else set()))
    apple_silicon = system == "Darwin" and arm
    budget = cpu_budget()
    info: dict[str, object] = {
        "os": f"{system} {platform.release()}",
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": budget.count,
        "cores_source": budget.source,
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
