"""``FASTINFER_DEFAULT_BACKEND=auto`` resolved, once per process: the backend measured best on this machine
(`make bench`, else `fastinfer bench`), else by a rule over its ISA and accelerators; and where engines run."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastinfer.catalog.backends import (
    BACKENDS,
    RUNNERS,
    SPECS,
    env_key,
    over_accuracy_limit,
    runs_here,
    unavailable_reason,
)
from fastinfer.catalog.config import Settings, get_settings
from fastinfer.catalog.store import DEFAULT_FAMILY
from fastinfer.catalog.tuned import MACHINE_KEYS
from fastinfer.common import hardware
from fastinfer.common.home import project_root

logger = logging.getLogger("fastinfer.choice")

AUTO = "auto"
LAST_RESORT = "onnx"  # what `auto` names when nothing can run here: its 503 then says why
BENCH_RESULT = Path("artifacts") / "bench.json"  # written by `fastinfer bench`
SERVED_RESULT = Path("artifacts") / "bench" / "results.json"  # written by `make bench`
SERVED_USERS = 10  # the clients README's first example is judged at
SERVED_UNIT = f"req/s served at {SERVED_USERS} clients by `make bench`"
IN_PROCESS_UNIT = "img/s in process by `fastinfer bench`"


def _rules(hw: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """(backend, whether it applies here, why), best first; the x86 INT8 rule stands on BENCHMARKS.md's figures."""
    isa = set(hw.get("isa", []))
    x86 = hw.get("machine") in ("x86_64", "AMD64") or bool(isa & {"avx2", "avx512f", "avx512_vnni", "avx_vnni"})
    int8_units = bool(isa & {"avx512_vnni", "avx_vnni", "amx_int8"})
    int8_why = (
        "x86 integer dot-product units (VNNI/AMX): OpenVINO's static INT8 ran ~1.4× ONNX Runtime's INT8 in process"
        if int8_units
        else "x86 without integer dot-product units: OpenVINO's static INT8 still ran ~1.7× the FP32 engines "
        "and 1.3× ONNX Runtime's INT8 in process (AVX2 EPYC)"
    )
    return [
        ("coreml-batched", bool(hw.get("neural_engine")), "Apple Neural Engine via CoreML FP16, batched"),
        ("onnx", bool(hw.get("cuda")), "CUDA GPU via ONNX Runtime's CUDA EP"),
        ("openvino-int8", x86, int8_why),
        ("onnx-int8", x86, "x86: static INT8 (U8S8) runs ~1.4–2× faster than FP32 in ONNX Runtime"),
        ("openvino", bool(isa & {"avx512_bf16", "amx_bf16"}), "BF16 units: OpenVINO runs the FP32 model in BF16"),
        ("onnx", True, "ONNX Runtime FP32 on the CPU: no integer units, accelerator or faster engine found"),
    ]


def recommend(
    hw: dict[str, Any], available: list[str], measured: dict[str, float] | None = None, unit: str = "img/s"
) -> dict[str, str]:
    """The backend to use here, why, and its source: the highest ``measured`` throughput among ``available``,
    else the first rule that applies here (a measurement that left out the rule's pick cannot overrule it)."""
    rules = [(name, why) for name, applies, why in _rules(hw) if applies and name in available]
    measured = {name: rate for name, rate in (measured or {}).items() if name in available}
    if measured and (not rules or rules[0][0] in measured):
        best = max(measured, key=lambda n: measured[n])
        return {"backend": best, "why": f"highest measured throughput here ({measured[best]:.1f} {unit})",
                "source": "measured"}  # fmt: skip
    if rules:
        return {"backend": rules[0][0], "why": rules[0][1], "source": "rule"}
    if not available:
        return {"backend": "", "why": "no backend can run here: each says why", "source": "rule"}
    # No rule names one of those available (onnx is missing, say): the first, said as what it is.
    why = "the only backend available here" if len(available) == 1 else "the first available here; no rule prefers one"
    return {"backend": available[0], "why": why, "source": "rule"}


def measured_here(path: Path | None, hw: dict[str, Any]) -> tuple[dict[str, float] | None, str]:
    """Backend → its best in-process images/s from a ``fastinfer bench`` of a machine like this one, else None;
    and why (a bad or foreign file is a reason, never an error)."""

    def rows(result: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(row["backend"], row["images_per_s"]) for row in result["engines"]]

    return _rates_here(path, hw, rows, "bench result", "measured by `fastinfer bench`")


def served_here(
    path: Path | None, hw: dict[str, Any], family_name: str | None = None
) -> tuple[dict[str, float] | None, str]:
    """Backend → req/s it served at SERVED_USERS clients without an error in a ``make bench`` of a machine
    like this one (of ``family_name``, if given); else None; and why."""

    def rows(result: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [
            (run["backend"], run["req_per_s"])
            for run in result["runs"]
            if run.get("scenario") == "inference" and run.get("users") == SERVED_USERS and not run.get("failures")
        ]

    return _rates_here(path, hw, rows, "served bench", "served by `make bench`", family_name)


def _rates_here(
    path: Path | None,
    hw: dict[str, Any],
    rows: Callable[[dict[str, Any]], list[tuple[Any, Any]]],
    what: str,
    used: str,
    family_name: str | None = None,
) -> tuple[dict[str, float] | None, str]:
    """Each backend's best rate among ``rows`` of the result at ``path``, if it matches ``hw``; else None; and why."""
    if path is None or not path.is_file():
        return None, f"no {what} ({path})" if path else f"no {what}"
    try:
        result = json.loads(path.read_text())
        ran_on = result["hardware"]
        if not isinstance(ran_on, dict):
            raise TypeError("its hardware is not an object")
        served = str(result.get("family") or DEFAULT_FAMILY)
        rates: dict[str, float] = {}
        for backend, value in rows(result):
            name, rate = str(backend), float(value)
            if name in BACKENDS and 0 < rate < math.inf:
                rates[name] = max(rate, rates.get(name, 0.0))
    except Exception as exc:  # unreadable, not JSON, nested past the parser's depth, odd shapes: a reason
        return None, f"{path} is not a {what} ({type(exc).__name__}); ignored"
    if differs := [key for key in MACHINE_KEYS if ran_on.get(key) != hw.get(key)]:
        return None, f"{path} was measured on another machine ({', '.join(differs)} differ); ignored"
    if family_name is not None and served != family_name:
        return None, f"{path} measured model family {served!r}, not {family_name!r}; ignored"
    return (rates or None), f"{used} ({path})"


def measurements(hw: dict[str, Any]) -> tuple[dict[str, float] | None, str]:
    """This machine's measured throughput per backend and its unit: served (``make bench``) where one exists,
    else in process (``fastinfer bench``), else (None, why not)."""
    served, _ = served_here(served_result(), hw)
    measured, why = measured_here(bench_result(), hw)
    if served and set(measured or {}) <= set(served):  # a bench of fewer backends does not hide the others
        return served, SERVED_UNIT
    return measured, IN_PROCESS_UNIT if measured else why


@dataclass(frozen=True)
class DefaultChoice:
    """The backend of requests that name none, and where that came from."""

    backend: str
    requested: str  # FASTINFER_DEFAULT_BACKEND as set: ``auto`` or a backend's name
    source: str  # environment (named by the operator) | measured | rule
    why: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def describe(self) -> str:
        if self.source == "environment":
            return f"`{self.backend}` (FASTINFER_DEFAULT_BACKEND)"
        if self.source == "tuned":
            return f"`{self.backend}` (tuned: {self.why})"
        return f"`{self.backend}` (FASTINFER_DEFAULT_BACKEND=auto, {self.source}: {self.why})"


def choose_default(
    requested: str,
    hw: dict[str, Any],
    available: list[str],
    measured: dict[str, float] | None = None,
    named_by: str = "environment",
    unit: str = "img/s",
) -> DefaultChoice:
    """``requested`` as it stands (``named_by``: environment or tuned) unless ``auto``: then the recommendation."""
    if requested != AUTO:
        why = "measured best by `fastinfer tune` on this machine" if named_by == "tuned" else "named by the operator"
        return DefaultChoice(requested, requested, named_by, why)
    rec = recommend(hw, available, measured, unit)
    if not rec["backend"]:
        return DefaultChoice(LAST_RESORT, AUTO, "rule", rec["why"])
    return DefaultChoice(rec["backend"], AUTO, rec["source"], rec["why"])


def bench_result() -> Path | None:
    """Where ``fastinfer bench`` leaves its result in this project (None outside a source checkout)."""
    return None if (root := project_root()) is None else root / BENCH_RESULT


def served_result() -> Path | None:
    """Where ``make bench`` leaves its result in this project (None outside a source checkout)."""
    return None if (root := project_root()) is None else root / SERVED_RESULT


@lru_cache(maxsize=8)
def _resolved(requested: str, named_by: str) -> DefaultChoice:
    if requested != AUTO:
        return choose_default(requested, {}, [], named_by=named_by)
    hw = hardware.probe()
    runnable = [name for name in BACKENDS if unavailable_reason(name) is None]
    lossy = {name: why for name in runnable if (why := over_accuracy_limit(name)) is not None}
    measured, unit = measurements(hw)
    within = [name for name in runnable if name not in lossy]
    if not within:  # nothing else can run: serving one over the limit beats a 503 for every request
        lossy = {}
    chosen = choose_default(requested, hw, within or runnable, measured, unit=unit)
    if not lossy:
        return chosen
    passed = "; ".join(f"{name}: {why}" for name, why in lossy.items())
    return replace(chosen, why=f"{chosen.why}; passed over for accuracy: {passed}")


def default_choice(kept: bool = True) -> DefaultChoice:
    """This process's default backend, resolved once per FASTINFER_DEFAULT_BACKEND value and source; ``kept=False``:
    resolved afresh and not kept (the front's class is made before the served versions are pinned)."""
    settings = get_settings()
    given = (settings.default_backend, settings.sources.get("FASTINFER_DEFAULT_BACKEND", "environment"))
    return _resolved(*given) if kept else _resolved.__wrapped__(*given)


def default_now(
    chosen: DefaultChoice, hw: dict[str, Any], backends: list[str], cannot_answer: Callable[[str], str | None]
) -> DefaultChoice:
    """``chosen`` at start-up, unless this machine chose it and it cannot answer now (its engine failed to load,
    say): then the next choice among the backends that can, rather than a 503 for every request naming none."""
    if chosen.source == "environment" or (why := cannot_answer(chosen.backend)) is None:
        return chosen
    instead = recommend(hw, [name for name in backends if cannot_answer(name) is None])["backend"]
    if not instead:
        return chosen
    return replace(chosen, backend=instead, why=f"{chosen.backend} cannot answer here ({why[:120]}); next choice")


PLACED_ENV = "FASTINFER_IN_FRONT_PLACED"  # set by `bentoml serve` for its own workers (service.py): not a setting


def engines_in_front(settings: Settings, default_backend: Callable[[], str]) -> tuple[frozenset[str], str]:
    """The runners whose engine the front worker holds, and where that was decided: FASTINFER_IN_FRONT or a tuned
    file in force where either says; else, with one front worker and one worker per runner, the default
    backend's (``default_backend()``, asked only then), where it served most in `make bench`'s placement step
    on every CPU measured (docs/architecture.md); else none."""
    if "FASTINFER_IN_FRONT" in settings.sources or settings.tuned.get("status") == "in force":
        return settings.in_front, settings.sources.get("FASTINFER_IN_FRONT", "tuned")
    if settings.front_workers != 1 or settings.runner_workers != 1:
        return frozenset(), "default"
    runner = SPECS[default_backend()].runner_name
    return (frozenset({runner}) if runs_here(runner) else frozenset()), "default"


def placement(settings: Settings, default_backend: Callable[[], str] | None = None) -> tuple[frozenset[str], str]:
    """engines_in_front for this process: in a worker of `bentoml serve`, as its parent decided it (PLACED_ENV,
    honoured only from the parent that set it), so that every worker, a restarted one too, holds the engines whose
    runners were not started; elsewhere decided now, by ``default_backend`` (default: ``auto`` resolved afresh and
    not kept, as the served versions are not pinned yet)."""
    if placed := os.environ.get(PLACED_ENV):
        with contextlib.suppress(ValueError, TypeError, KeyError, RecursionError):
            fields = json.loads(placed)
            runners, source, pid = fields["runners"], fields["source"], fields["pid"]
            valid = isinstance(runners, list) and set(runners) <= set(RUNNERS) and type(pid) is int
            if valid and source in ("default", "environment", "tuned", "bento") and pid == os.getppid():
                return frozenset(runners), source  # else exported elsewhere, stale or not ours: decided here
        logger.warning("%s was not set by this server's parent: ignored, the placement is decided here", PLACED_ENV)
    return engines_in_front(settings, default_backend or (lambda: default_choice(kept=False).backend))


def keep_placement(placed: tuple[frozenset[str], str]) -> None:
    """Fix, for every process this one starts from now on (a server's workers), the placement it decided."""
    os.environ[PLACED_ENV] = json.dumps({"runners": sorted(placed[0]), "source": placed[1], "pid": os.getpid()})


def configuration(settings: Settings, default: DefaultChoice) -> dict[str, dict[str, str]]:
    """The settings that decide served throughput, each with its value and source (tuned, environment, rule,
    default)."""

    def count(name: str, value: int, zero: str = "") -> tuple[str, str]:
        """A count's value and source; ``zero``: what 0 means, decided by rule."""
        by_rule = bool(zero) and not value
        source = settings.sources.get(name) or ("rule" if by_rule else "default")
        return (f"0 ({zero})" if by_rule else str(value)), source

    in_front, in_front_source = placement(settings, lambda: default.backend)
    shown = {
        "FASTINFER_DEFAULT_BACKEND": (default.backend, default.source),
        "FASTINFER_FRONT_WORKERS": count("FASTINFER_FRONT_WORKERS", settings.front_workers),
        "FASTINFER_RUNNER_WORKERS": count("FASTINFER_RUNNER_WORKERS", settings.runner_workers),
        "FASTINFER_THREADS": count("FASTINFER_THREADS", settings.threads, "the cores ÷ runner workers"),
        "FASTINFER_IN_FRONT": (",".join(sorted(in_front)) or "(none)", in_front_source),
        "FASTINFER_DECODE_THREADS": count("FASTINFER_DECODE_THREADS", settings.decode_threads, "one per core"),
    }
    for backend in BACKENDS:
        key = env_key(backend)
        names = [f"FASTINFER_{what}_{key}" for what in ("BATCHING", "MAX_BATCH_SIZE", "MAX_LATENCY_MS")]
        if set(names) & settings.sources.keys():  # per backend only where something else than the table set it
            batching = settings.batching_for(backend)
            values = (str(batching.enabled).lower(), str(batching.max_batch_size), str(batching.max_latency_ms))
            shown |= {
                name: (value, settings.sources.get(name, "default")) for name, value in zip(names, values, strict=True)
            }
    return {name: {"value": value, "source": where} for name, (value, where) in shown.items()}
