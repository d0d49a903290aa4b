"""What ``fastinfer tune`` chooses from, defined once: the tuner walks this space and the server takes a tuned
file only if its settings are one of its configurations."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from fastinfer.catalog.backends import BACKENDS, SPECS, env_key

GOALS = ("throughput", "latency")
# coreml-batched serves coreml's models too (batch 1 among them): the tuner measures that one row.
BACKENDS_TUNED = tuple(backend for backend in BACKENDS if backend != "coreml")
# Values the tuned file leaves out: each restates the table's value or the rule's.
PLAIN = {
    "FASTINFER_IN_FRONT": "",
    "FASTINFER_FRONT_WORKERS": "1",
    "FASTINFER_THREADS": "0",
    "FASTINFER_DECODE_THREADS": "0",
}


@dataclass(frozen=True)
class Point:
    """One configuration: the backend and the settings that decide its throughput (None / 0: the table's)."""

    backend: str
    in_front: bool = False
    max_batch: int | None = None
    max_latency_ms: int | None = None
    front_workers: int = 1
    threads: int = 0
    decode_threads: int = 0

    @property
    def key(self) -> str:
        return env_key(self.backend)

    def settings(self) -> dict[str, str]:
        """The FASTINFER_* values that make a server serve this way, the backend as its default."""
        values = {
            "FASTINFER_DEFAULT_BACKEND": self.backend,
            "FASTINFER_IN_FRONT": self.backend if self.in_front else "",
            "FASTINFER_FRONT_WORKERS": str(self.front_workers),
            "FASTINFER_THREADS": str(self.threads),
            "FASTINFER_DECODE_THREADS": str(self.decode_threads),
        }
        if self.max_batch is not None:
            values[f"FASTINFER_MAX_BATCH_SIZE_{self.key}"] = str(self.max_batch)
        if self.max_latency_ms is not None:
            values[f"FASTINFER_MAX_LATENCY_MS_{self.key}"] = str(self.max_latency_ms)
        return values


def plain(backend: str) -> Point:
    """``backend`` as an untuned server serves it: where each search begins."""
    return Point(backend)


def dimensions(backend: str, cores: int, goal: str) -> dict[str, list[Any]]:
    """The values the tuner may give each setting of ``backend`` on ``cores`` for ``goal``, the table's first."""
    spec = SPECS[backend]
    batching_on, table_batch, table_wait = spec.batching
    dims: dict[str, list[Any]] = {"in_front": [False, True]}
    if batching_on and goal == "throughput":  # at one client no batch forms: nothing to tune
        largest = max(spec.static_batches) if len(spec.static_batches) > 1 else 32
        sizes = sorted({b for b in (table_batch // 2, table_batch * 2) if 1 < b <= largest} - {table_batch})
        dims["max_batch"] = [None, *sizes]
        dims["max_latency_ms"] = [None, 5 if table_wait == 0 else 0]
    dims["front_workers"] = [1, 2] if cores >= 2 else [1]
    dims["threads"] = [0, cores - 1] if cores >= 2 else [0]
    # One per core (today's), or half the cores: while the engine runs beside the decodes, the other half is left
    # to it. One more value would cost one more served trial.
    dims["decode_threads"] = [0, max(1, cores // 2)] if cores >= 2 else [0]
    return dims


def points(backend: str, cores: int, goal: str) -> list[Point]:
    """Every configuration of ``backend``; an engine in the front only with one front worker."""
    dims = dimensions(backend, cores, goal)
    every = (Point(backend, **dict(zip(dims, values, strict=True))) for values in itertools.product(*dims.values()))
    return [point for point in every if not (point.in_front and point.front_workers != 1)]


def written(settings: dict[str, str]) -> dict[str, str]:
    """Settings as a tuned file holds them: stripped, without the plain ones."""
    stripped = {name: value.strip() for name, value in settings.items()}
    return {name: value for name, value in stripped.items() if PLAIN.get(name) != value}


def why_not(settings: dict[str, str], cores: int) -> str:
    """Why ``settings`` are not one configuration the tuner chooses from on ``cores`` ("" if they are)."""
    backend = settings.get("FASTINFER_DEFAULT_BACKEND", "").strip()
    if not backend:
        return "it names no backend: it sets no FASTINFER_DEFAULT_BACKEND"
    if backend not in BACKENDS_TUNED:
        return f"it names no backend `fastinfer tune` chooses: {backend[:40]!r}"
    every = [point.settings() for goal in GOALS for point in points(backend, cores, goal)]
    for name, value in settings.items():
        choices = sorted({point[name] for point in every if name in point}, key=lambda v: (len(v), v))
        if not choices:
            return f"`fastinfer tune` never sets {name[:60]} (tuning {backend} on {cores} cores)"
        if value.strip() not in choices:
            shown = ", ".join(repr(v) for v in choices)
            where = f"for {backend} on {cores} cores ({shown})"
            return f"{name}={value[:20]!r} is not a value `fastinfer tune` chooses {where}"
    if written(settings) not in [written(point) for point in every]:
        return f"{', '.join(sorted(settings))[:200]} together are no configuration `fastinfer tune` chooses"
    return ""
