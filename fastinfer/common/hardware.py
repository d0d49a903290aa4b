"""Which device and execution providers a backend should use on this machine, and how many threads.

torch and onnxruntime are imported only inside the functions that need them: the HTTP front never loads them.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

# ---- the CPU budget: the cores this process may use (affinity, then a container's CPU quota) ----


@dataclass(frozen=True)
class CpuBudget:
    """How many threads this process should size its pools for: min(CPU affinity, the tightest cgroup CPU quota
    rounded up); ``quota`` in CPUs or None; ``source`` says it in words (``cores_source``)."""

    count: int
    affinity: int
    quota: float | None
    source: str


@dataclass(frozen=True)
class _Limit:
    """One cgroup's CPU quota: ``quota`` µs of CPU time every ``period`` µs."""

    version: int
    cgroup: str  # the cgroup's path as the process sees it ("/" inside a container's namespace)
    quota: int
    period: int

    @property
    def cpus(self) -> Fraction:
        return Fraction(self.quota, self.period)

    def describe(self) -> str:
        where = f" in {self.cgroup}" if self.cgroup != "/" else ""
        if self.version == 2:
            return f"cgroup v2 cpu.max {self.quota}/{self.period}{where}"
        return f"cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us {self.quota}/{self.period}{where}"


_CGROUP_ROOT = "/sys/fs/cgroup"  # where the hierarchies usually are when /proc/self/mountinfo does not say
_V1_FALLBACKS = ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")


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


def _own_cgroups(text: str | None) -> tuple[str | None, str | None]:
    """This process's cgroup paths from /proc/self/cgroup: the v2 one and the v1 one with the ``cpu`` controller."""
    v2 = v1 = None
    for line in (text or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "" and v2 is None:
            v2 = path
        elif "cpu" in controllers.split(",") and v1 is None:
            v1 = path
    return v2, v1


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal (``\\040``)."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def _mounts(text: str | None) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(mount point, root of the mount) of the cgroup v2 and the v1 ``cpu`` hierarchies, from mountinfo."""
    v2: list[tuple[str, str]] = []
    v1: list[tuple[str, str]] = []
    for line in (text or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 4:
            continue
        root, point, fstype, options = _unescape(fields[3]), _unescape(fields[4]), fields[sep + 1], fields[sep + 3]
        if fstype == "cgroup2":
            v2.append((point, root))
        elif fstype == "cgroup" and "cpu" in options.split(","):
            v1.append((point, root))
    return _usual(v2), _usual(v1)


def _usual(mounts: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The mount under /sys/fs/cgroup where there are several (a host's, bind-mounted elsewhere, is not ours)."""
    usual = [m for m in mounts if m[0] == _CGROUP_ROOT or m[0].startswith(_CGROUP_ROOT + "/")]
    return (usual or mounts or [None])[0]


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


def _limit(version: int, cgroup: str, quota: str, period: str) -> _Limit | None:
    """Anything but two positive integers is no limit."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return _Limit(version, cgroup, q, p) if q > 0 and p > 0 else None


def _v2_limit(folder: Path, cgroup: str) -> _Limit | None:
    """``cpu.max``: "QUOTA PERIOD", or "max PERIOD" for no limit."""
    fields = (_read(folder / "cpu.max") or "").split()
    return _limit(2, cgroup, *fields) if len(fields) == 2 and fields[0] != "max" else None


def _v1_limit(folder: Path, cgroup: str) -> _Limit | None:
    """``cpu.cfs_quota_us`` (-1: no limit) over ``cpu.cfs_period_us``."""
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    return None if quota is None or period is None else _limit(1, cgroup, quota.strip(), period.strip())


def _cgroup_limits(root: Path) -> list[_Limit]:
    """Every CPU quota from this process's cgroups up to their roots (the tightest binds), in v2 and v1."""
    proc = _inside(root, "/proc/self")
    v2_path, v1_path = _own_cgroups(_read(proc / "cgroup"))
    v2_mount, v1_mount = _mounts(_read(proc / "mountinfo"))
    if v2_path is not None and v2_mount is None:
        v2_mount = (_CGROUP_ROOT, "/")
    if v1_path is not None and v1_mount is None:
        v1_mount = (next((p for p in _V1_FALLBACKS if _inside(root, p).is_dir()), _V1_FALLBACKS[-1]), "/")
    limits: list[_Limit] = []
    for path, mount, limit_of in ((v2_path, v2_mount, _v2_limit), (v1_path, v1_mount, _v1_limit)):
        if path is not None and mount is not None:
            chain = _chain(_inside(root, mount[0]), mount[1], path)
            limits += [limit for folder, cgroup in chain if (limit := limit_of(folder, cgroup))]
    return limits


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
    tightest = min(limits, key=lambda limit: limit.cpus)
    allowed = max(1, -(-tightest.quota // tightest.period))  # rounded up: 1.5 CPUs of quota → 2 threads
    quota = float(tightest.cpus)
    if allowed < cores:
        return CpuBudget(allowed, cores, quota, f"{tightest.describe()} → {allowed} ({what} {cores})")
    return CpuBudget(cores, cores, quota, f"{what} ({cores}); {tightest.describe()} allows {allowed}")


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
