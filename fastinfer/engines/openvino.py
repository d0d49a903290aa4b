"""OpenVINO engine: one compiled model over a stored IR directory (``model.xml`` + ``model.bin``).

BF16 where the CPU has AVX-512 BF16 or AMX, VNNI/AMX kernels for the static INT8 model; the runtime precision of
each layer is read from the compiled model, and layers not running as intended become sentences.

Settings, measured on a 2-core AVX-512 EPYC: one stream, ``PERFORMANCE_HINT=LATENCY``, the whole batch in one
request (two half-batch streams were 1.5-2x slower at b1 and gained only by starving the JPEG decoder);
``ENABLE_CPU_PINNING=False`` (pinned threads left the decoder 20 decodes/s instead of 35); a compiled-model
cache (``cache_dir``) that imports instead of recompiling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.common import hardware
from fastinfer.common.files import file_sha256
from fastinfer.engines import EngineUnavailable, square_side

MODEL_FILE = "model.xml"
PRECISIONS = ("auto", "bf16", "f32")  # FASTINFER_OPENVINO_PRECISION's values (fastinfer.catalog.config)
EXPECTS = ("float", "int8")
REPORTED_LAYERS = ("Convolution", "FullyConnected", "MatMul", "Pooling")
COMPUTE_LAYERS = ("Convolution", "FullyConnected", "MatMul")  # whose precision decides speed
PREFLIGHT_TIMEOUT_S = 120
MAX_REQUEST_ROWS = 32  # the reused request keeps its largest batch's buffers; beyond 8-16 rows no faster
CPU_SIGNALS = {signal.SIGFPE, signal.SIGILL, signal.SIGSEGV, signal.SIGBUS}  # a crash about this CPU


def import_openvino() -> Any:
    """``import openvino`` without its usage telemetry (which writes under ``~/intel`` and forks a child that
    posts it): openvino uses a no-op stub when openvino_telemetry cannot be imported."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


def compile_config(threads: int, precision: str) -> dict[str, Any]:
    """The CPU plugin properties (the preflight child's too, so that its cached blob is the parent's hit)."""
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
        "ENABLE_CPU_PINNING": False,
    }
    if precision != "auto":
        config["INFERENCE_PRECISION_HINT"] = precision
    return config


class OpenVinoEngine:
    def __init__(
        self,
        model_dir: str | Path,
        threads: int = 0,
        precision: str = "auto",
        cache_dir: str | Path | None = None,
        expect: str = "float",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"OpenVINO precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        if expect not in EXPECTS:
            raise ValueError(f"expect must be one of {', '.join(EXPECTS)}, not {expect!r}")
        self.xml = Path(model_dir) / MODEL_FILE
        if not self.xml.is_file():
            raise FileNotFoundError(f"no OpenVINO IR at {self.xml}; run `python -m build_models`")
        self.threads = threads if threads > 0 else hardware.cpu_count()
        self.precision_requested = precision
        self.expect = expect
        self.cache_dir = usable_cache_dir(cache_dir)

        ov = import_openvino()
        core = ov.Core()
        check_precision(core, precision)
        if self.cache_dir:
            core.set_property({"CACHE_DIR": self.cache_dir})
        started = time.perf_counter()
        try:
            # From the path, not a read_model(): with a cache hit OpenVINO then never parses the IR.
            self.compiled = core.compile_model(str(self.xml), "CPU", compile_config(self.threads, precision))
        except RuntimeError as e:
            raise RuntimeError(f"OpenVINO could not compile {self.xml}: {openvino_message(e)}") from e
        self.compile_s = time.perf_counter() - started
        self.loaded_from_cache = bool(self.compiled.get_property("LOADED_FROM_CACHE"))
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
        self.streams = int(self.compiled.get_property("NUM_STREAMS"))
        self.layers = layer_precision(self.compiled.get_runtime_model())
        dims = self.compiled.input(0).get_partial_shape()
        self.input_size = square_side([d.get_length() if d.is_static else None for d in dims])  # the crop size
        self.runtime = f"OpenVINO {core.get_versions('CPU')['CPU'].build_number}"
        self.cpu = str(core.get_property("CPU", "FULL_DEVICE_NAME"))
        # One request, reused; concurrent callers take turns, which is all one stream could do anyway.
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, dirs: Mapping[int | None, str], threads: int = 0, **options: Any) -> OpenVinoEngine:
        """``dirs[None]`` is the model directory; ``preflight=True`` first compiles in a child (:func:`preflight`)."""
        model_dir = dirs[None]
        if options.get("cache_dir"):
            options["cache_dir"] = str(Path(cache_folder(options["cache_dir"], model_dir)) / content_key(model_dir))
        precision = options.get("precision", "auto")
        if options.pop("preflight", False):
            if precision == "bf16":  # refused at once, not after a child's compile
                check_precision(import_openvino().Core(), precision)
            preflight(model_dir, threads, precision, options.get("cache_dir"))
        return cls(model_dir, threads=threads, **options)

    def run(self, images: np.ndarray) -> np.ndarray:
        if len(images) > MAX_REQUEST_ROWS:  # the request keeps its largest buffers: bound them
            return np.concatenate(
                [self.run(images[i : i + MAX_REQUEST_ROWS]) for i in range(0, len(images), MAX_REQUEST_ROWS)]
            )
        x = np.ascontiguousarray(images, dtype=np.uint8)
        with self._lock:
            # share_outputs=False: the result is a copy, not the request's buffer that the next call overwrites.
            return self._request.infer({0: x}, share_inputs=True, share_outputs=False)[0]

    def fallbacks(self) -> list[str]:
        return fallbacks(self.layers, self.expect, self.precision)

    def identity(self) -> str:
        return f"{self.runtime} on CPU at {self.precision}"

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "device": f"CPU ({self.cpu})",
            "threads": self.threads,
            "streams": self.streams,
            "performance_hint": "LATENCY",
            "precision": self.precision,
            "precision_requested": self.precision_requested,
            "expect": self.expect,
            "layer_precision": {t: summary(self.layers[t]) for t in REPORTED_LAYERS if t in self.layers},
            "fallbacks": self.fallbacks(),
            "compile_s": round(self.compile_s, 3),
            "cache_dir": self.cache_dir,
            "loaded_from_cache": self.loaded_from_cache,
        }


def check_precision(core: Any, precision: str) -> None:
    """Refuse bf16 on a CPU without native BF16, which OpenVINO would emulate (slower) or ignore silently."""
    capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if precision == "bf16" and "BF16" not in capabilities:
        raise EngineUnavailable(
            f"precision 'bf16' needs a CPU with native BF16 (AVX-512 BF16, AMX or AVX2-VNNI-2); this one "
            f"offers {', '.join(capabilities)}. Use 'auto' (f32 here) or 'f32'"
        )


def cache_folder(cache_root: str | Path, model_dir: str | Path) -> str:
    """One cache folder per stored model version (``<root>/<name>/<version>``), removed with the model."""
    return str(Path(cache_root) / Path(model_dir).parent.name / Path(model_dir).name)


def content_key(model_dir: str | Path) -> str:
    """The IR's files' content, as a cache sub-folder name: OpenVINO keys its blobs by path, not by weights."""
    xml = Path(model_dir) / MODEL_FILE
    return (file_sha256(xml)[:8] + file_sha256(xml.with_suffix(".bin"))[:8]) if xml.is_file() else "none"


def usable_cache_dir(cache_dir: str | Path | None) -> str | None:
    """The cache folder, created, or None where it cannot be written: then it compiles at every start."""
    if not cache_dir:
        return None
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(cache_dir) if os.access(cache_dir, os.W_OK) else None


def layer_precision(runtime_model: Any) -> dict[str, Counter[str]]:
    """layerType -> Counter(runtimePrecision) over the compiled (runtime) graph's ops."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for op in runtime_model.get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and "runtimePrecision" in info:
            counts[_text(info["layerType"])][_text(info["runtimePrecision"])] += 1
    return dict(counts)


def _text(value: Any) -> str:  # rt_info values are OVAny: astype(str) gives the text
    return value.astype(str) if hasattr(value, "astype") else str(value)


def summary(counts: Counter[str]) -> str:
    """``Counter({"u8": 50, "f32": 3})`` -> ``"u8 50/53, f32 3/53"``."""
    total = sum(counts.values())
    return ", ".join(f"{p} {n}/{total}" for p, n in counts.most_common())


def fallbacks(counts: Mapping[str, Counter[str]], expect: str, precision: str) -> list[str]:
    """Sentences for the compute layers not running at the intended precision (u8/i8, or a reduced float one)."""
    if expect == "int8":
        wanted, intent = {"u8", "i8"}, "INT8"
    elif precision in ("bf16", "f16"):
        wanted, intent = {precision}, precision
    else:
        return []
    if not counts.get("Convolution"):
        return ["OpenVINO reported no Convolution layers in the runtime graph: their precision is unknown"]
    out = []
    for layer in COMPUTE_LAYERS:
        off = {p: n for p, n in counts.get(layer, Counter()).items() if p not in wanted}
        if off:
            total = sum(counts[layer].values())
            where = ", ".join(f"{n} in {p}" for p, n in sorted(off.items()))
            out.append(f"{sum(off.values())}/{total} {layer} layers do not run in {intent}: {where}")
    return out


def openvino_message(error: BaseException) -> str:
    """OpenVINO's own words from an exception, without its 'Exception from file:line' trail."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [
        line
        for line in lines
        if line
        and not line.startswith("Exception from ")
        and not (line.startswith("Check '") and " failed at " in line)
    ]
    return " ".join(kept) or str(error).strip()


_PREFLIGHT = """
import json, sys
sys.modules["openvino_telemetry"] = None
import numpy as np
import openvino as ov
a = json.loads(sys.argv[1])
try:
    core = ov.Core()
    if a["cache_dir"]:
        core.set_property({"CACHE_DIR": a["cache_dir"]})
    compiled = core.compile_model(a["xml"], "CPU", a["config"])
    print("compiled", flush=True)
    image = [d.get_length() for d in compiled.input(0).get_partial_shape()[1:]]  # the family's [S,S,3]
    compiled.create_infer_request().infer({0: np.zeros((1, *image), np.uint8)})
except Exception as e:
    print(json.dumps({"error": str(e)}), flush=True)
    sys.exit(3)
"""


def preflight(
    model_dir: str | Path, threads: int = 0, precision: str = "auto", cache_dir: str | Path | None = None
) -> None:
    """Compile the model and run one image in a child process (~0.7 s), filling ``cache_dir``: OpenVINO has crashed
    whole processes on some CPUs (SIGFPE). EngineUnavailable for a crash on an instruction (not retried),
    RuntimeError for anything else."""
    xml = Path(model_dir) / MODEL_FILE
    if not xml.is_file():
        raise FileNotFoundError(f"no OpenVINO IR at {xml}; run `python -m build_models`")
    threads = threads if threads > 0 else hardware.cpu_count()
    cache_dir = usable_cache_dir(cache_dir)
    args = {"xml": str(xml), "config": compile_config(threads, precision), "cache_dir": str(cache_dir or "")}
    try:
        child = subprocess.run(
            [sys.executable, "-c", _PREFLIGHT, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"OpenVINO did not compile {xml} within {PREFLIGHT_TIMEOUT_S} s") from e
    except OSError as e:  # the interpreter could not be started (permissions, memory)
        raise RuntimeError(f"the OpenVINO preflight could not start {sys.executable}: {e}") from e
    if child.returncode == 0:
        return
    stage = "the first inference" if "compiled" in child.stdout.split() else "compile_model"
    if child.returncode < 0:
        try:
            sig = signal.Signals(-child.returncode)
        except ValueError:
            raise RuntimeError(f"OpenVINO {stage} was killed by signal {-child.returncode}") from None
        if sig in CPU_SIGNALS:
            raise EngineUnavailable(f"OpenVINO {stage} crashed with {sig.name} on this CPU")
        memory = " (out of memory?)" if sig == signal.SIGKILL else ""
        raise RuntimeError(f"OpenVINO {stage} was killed by {sig.name}{memory}")
    for line in reversed(child.stdout.splitlines()):
        if line.startswith("{"):
            message = openvino_message(RuntimeError(json.loads(line)["error"]))
            raise RuntimeError(f"OpenVINO {stage} failed for {xml}: {message}")
    tail = child.stderr.strip().splitlines()[-1:] or [f"exit status {child.returncode}"]
    raise RuntimeError(f"OpenVINO {stage} failed: {tail[0]}")
