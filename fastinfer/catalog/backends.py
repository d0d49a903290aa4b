"""The one table of backends: what each is, where it can run, how to open it, how it is served.

A backend is one row of :data:`SPECS`; the API's names, the batching settings, the runners and the tools derive
from it. An engine's module is imported only when the engine is opened.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastinfer.catalog import holdings, store
from fastinfer.catalog.store import StoredModelInfo
from fastinfer.common import hardware
from fastinfer.common.home import bentoml_home
from fastinfer.engines import Engine
from fastinfer.engines.openvino import PRECISIONS as OPENVINO_PRECISIONS  # without importing openvino

if TYPE_CHECKING:
    from bentoml import Model


def anywhere() -> str | None:
    return None


def macos_only() -> str | None:
    return None if hardware.is_macos() else "CoreML prediction needs macOS"


@cache
def openvino_missing() -> str | None:
    """Why OpenVINO cannot run here, without importing it (the HTTP front stays light)."""
    if importlib.util.find_spec("openvino") is None:
        return "OpenVINO is not installed (pip install openvino; see pyproject.toml for the version)"
    return None


def openvino_cache_dir() -> str:
    """Compiled OpenVINO models, kept beside the model store so that a restart does not recompile."""
    return str(bentoml_home() / "cache" / "openvino")


def openvino_precision() -> str:
    """FASTINFER_OPENVINO_PRECISION, or ValueError (read here: the settings are built from this table)."""
    value = os.environ.get("FASTINFER_OPENVINO_PRECISION", "auto").strip().lower() or "auto"
    if value not in OPENVINO_PRECISIONS:
        raise ValueError(f"FASTINFER_OPENVINO_PRECISION must be one of {', '.join(OPENVINO_PRECISIONS)}")
    return value


def _cpu_only() -> dict[str, Any]:
    return {"cpu_only": True}  # INT8 kernels exist on the CPU EP only


def _openvino(expect: str) -> Callable[[], dict[str, Any]]:
    def options() -> dict[str, Any]:
        precision = openvino_precision() if expect == "float" else "auto"
        return {"precision": precision, "cache_dir": openvino_cache_dir(), "expect": expect, "preflight": True}

    return options


@dataclass(frozen=True)
class BackendSpec:
    name: str  # an API value
    artifact: str  # its stored models: <family>-<artifact>[-b<N>]
    description: str
    engine: str  # "module:Class"; the class's ``open(dirs, threads, **options)`` loads the models
    options: Callable[[], Mapping[str, Any]] = dict  # engine options, read when the engine is opened
    static_batches: tuple[int | None, ...] = (None,)  # the models it loads (None = dynamic batch)
    platform: Callable[[], str | None] = anywhere  # None when this machine can run it, else why not
    runner: str = ""  # the backend whose runner serves this one ("" = its own)
    batching: tuple[bool, int, int] = (True, 8, 0)  # default (enabled, max batch size, max latency ms)
    rows_independent: bool = True  # False: scales per batch (dynamic INT8), so each image runs on its own

    def model_names(self) -> list[str]:
        return [store.model_name(self.artifact, b) for b in self.static_batches]

    @property
    def runner_name(self) -> str:
        return self.runner or self.name


COREML_BATCHES = (1, 2, 4, 8)
TORCH = "fastinfer.engines.pytorch:TorchEngine"
ONNX = "fastinfer.engines.onnx:OnnxEngine"
COREML = "fastinfer.engines.coreml:CoreMLEngine"
OPENVINO = "fastinfer.engines.openvino:OpenVinoEngine"

# Batching defaults measured (docs: batching); under load batches form from the requests queued meanwhile.
SPECS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec("pytorch", "pytorch", "torchvision ResNet-50, eager (MPS / CUDA / CPU)", TORCH),
        BackendSpec("onnx", "onnx", "ONNX Runtime FP32 (CoreML EP / CUDA EP / CPU EP)", ONNX),
        BackendSpec("onnx-int8", "onnx-int8", "ONNX Runtime static QDQ INT8, per-channel (CPU EP)", ONNX, _cpu_only),
        BackendSpec(
            "onnx-int8-dynamic",
            "onnx-int8-dynamic",
            "ONNX Runtime dynamic INT8, ConvInteger (CPU EP); one image per run: its scales are per batch",
            ONNX,
            _cpu_only,
            batching=(False, 1, 0),
            rows_independent=False,
        ),
        BackendSpec(
            "openvino",
            "openvino",
            "OpenVINO IR of the FP32 model at the CPU's best precision (BF16 on AVX-512 BF16 / AMX)",
            OPENVINO,
            _openvino("float"),
            platform=openvino_missing,
        ),
        BackendSpec(
            "openvino-int8",
            "openvino-int8",
            "OpenVINO IR of the static QDQ INT8 model (VNNI / AMX-INT8)",
            OPENVINO,
            _openvino("int8"),
            platform=openvino_missing,
        ),
        BackendSpec(
            "coreml",
            "coreml",
            "CoreML FP16, batch 1 (Neural Engine / GPU / CPU)",
            COREML,
            static_batches=(1,),
            platform=macos_only,
            runner="coreml-batched",  # the same runner, called without batching: the batch-1 model as sent
            batching=(False, 1, 0),
        ),
        BackendSpec(
            "coreml-batched",
            "coreml",
            "CoreML FP16, static b1/b2/b4/b8, padded",
            COREML,
            static_batches=COREML_BATCHES,
            platform=macos_only,
        ),
    )
}

BACKENDS: tuple[str, ...] = tuple(SPECS)  # API values, in the order they are shown
RUNNERS: tuple[str, ...] = tuple(dict.fromkeys(s.runner_name for s in SPECS.values()))  # those owning a runner


SERVED_ENV = "FASTINFER_BACKENDS"


def switched_on(raw: str | None = None) -> tuple[str, ...]:
    """FASTINFER_BACKENDS (or ``raw``, its value): the backends this server serves, in the table's order (unset: every
    one), or ValueError (read here, as the engines' options are: the settings are built from this table)."""
    raw = (os.environ.get(SERVED_ENV, "") if raw is None else raw).strip()
    if not raw or raw.lower() == "all":
        return BACKENDS
    names = backend_names(raw, f"{SERVED_ENV} ")
    if not names:  # "," serves nothing, yet would say ready
        raise ValueError(f"{SERVED_ENV} names no backend: {raw[:40]!r}; valid: all, {', '.join(BACKENDS)}")
    return tuple(name for name in BACKENDS if name in names)


def backend_names(raw: str, said: str = "") -> list[str]:
    """Comma-separated backend names, or ValueError naming those that are none (after ``said``)."""
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if unknown := [name for name in names if name not in SPECS]:
        raise ValueError(
            f"{said}names no backend: {', '.join(repr(n[:40]) for n in unknown)}; valid: {', '.join(BACKENDS)}"
        )
    return names


def runs_here(runner: str) -> bool:
    """Whether a runner process should be started at all: one of its backends is switched on and runs here."""
    on = switched_on()
    return any(s.runner_name == runner and s.name in on and s.platform() is None for s in SPECS.values())


def unavailable_reason(name: str) -> str | None:
    """None when the backend can run on this machine, else why not (switched off first, then the platform)."""
    if name not in (on := switched_on()):
        return f"switched off: {SERVED_ENV}={','.join(on)} leaves it out, so no runner serves it here"
    spec = SPECS[name]
    reason = spec.platform()
    try:
        missing = stored_models(spec)[1]
    except store.PinnedModelGone as exc:
        return reason or str(exc)
    if reason is not None:
        stored = "" if missing else f"; the models are built and stored ({', '.join(spec.model_names())})"
        return reason + stored
    if missing:
        if len(missing) == len(spec.static_batches) and (no_family := holdings.missing_reason()) is not None:
            return no_family
        if store.pins() is not None:  # a server: what it serves was fixed when it started
            return (
                f"{', '.join(missing)} was not in the model store when this server started; "
                f"{holdings.build_hint()} if it still is not, then restart the server"
            )
        return f"{', '.join(missing)} not in the model store; {holdings.build_hint()}"
    return None


def served_models() -> dict[str, StoredModelInfo]:
    """Backend → the stored model answering its batch-1 requests, for each backend whose model is stored."""
    return {
        name: store.describe(model)
        for name, spec in SPECS.items()
        if (model := holdings.serving_or_none(spec.artifact, spec.static_batches[0])) is not None
    }


def over_accuracy_limit(name: str) -> str | None:
    """Why ``auto`` and ``fastinfer tune`` pass over a backend: its build measured it losing more top-1 than the
    family's limit. None where it did not, or nothing was measured."""
    spec = SPECS[name]
    model = holdings.serving_or_none(spec.artifact, spec.static_batches[0])
    measured = store.describe(model).accuracy if model is not None else None
    if not isinstance(measured, dict):
        return None
    top1, reference, limit = (measured.get(k) for k in ("top1", "reference_top1", "max_accuracy_drop_pp"))
    shares = (top1, reference) if all(type(v) in (int, float) for v in (top1, reference, limit)) else ()
    if not shares or not all(0 <= v <= 1 for v in shares) or not 0 <= limit <= 100:  # NaN fails both
        return None  # not what a build writes: nothing measured, as far as the choice goes
    drop = round(100 * (reference - top1), 6)  # fractions of the same photos: 0.96 - 0.95 is not 1.0000000000000009
    if drop <= limit:
        return None
    return (f"its build measured a top-1 drop of {drop:.2f} pp against PyTorch on {measured.get('images')} photos, "
            f"over the family's limit of {limit:g} pp")  # fmt: skip


def env_key(backend: str) -> str:
    """A backend's name as its per-backend variables end: onnx-int8 → ONNX_INT8 (…_MAX_BATCH_SIZE_ONNX_INT8)."""
    return backend.upper().replace("-", "_")


class NotStored(LookupError):
    """A backend's model is not in the store this process uses: said in one line, where to look included."""


def stored_models(spec: BackendSpec) -> tuple[dict[int | None, Model], list[str]]:
    """A backend's stored model per batch size (holdings.serving), and the store names of those missing."""
    found = {b: holdings.serving(spec.artifact, b) for b in spec.static_batches}
    missing = [store.model_name(spec.artifact, b) for b, m in found.items() if m is None]
    return {b: m for b, m in found.items() if m is not None}, missing


def model_dirs(name: str) -> dict[int | None, str]:
    found, lost = stored_models(SPECS[name])
    if lost:
        raise NotStored(
            holdings.missing_reason()
            or f"{', '.join(lost)} not in the model store ({bentoml_home() / 'models'}); {holdings.build_hint()}"
        )
    return {b: m.path for b, m in found.items()}


def engine_class(name: str) -> Any:
    module, _, cls = SPECS[name].engine.partition(":")
    return getattr(importlib.import_module(module), cls)


def open_engine(
    name: str, threads: int = 0, dirs: Mapping[int | None, str | Path] | None = None, **overrides: Any
) -> Engine:
    """Load a backend's engine in this process, from the store (or ``dirs``), ``overrides`` over its options."""
    spec = SPECS[name]
    dirs = {b: str(d) for b, d in (dirs or model_dirs(name)).items()}
    return engine_class(name).open(dirs, threads, **{**spec.options(), **overrides})
