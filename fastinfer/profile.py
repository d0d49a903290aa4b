"""The cost of each stage of a request, measured in-process, and the ceiling they allow.

For each stage we measure CPU time (``time.process_time``: every thread of this process), because
on a CPU-only machine the front's decoding and the runner's inference share the same cores: the
ceiling is ``cores / CPU-seconds per request``, and the binding stage is the one that costs the
most CPU. Decode is measured per image size class; inference per backend and batch size.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fastinfer import hardware, photos
from fastinfer.postprocess import top_k
from fastinfer.preprocess import PreprocessSpec, decode, resize_and_crop

# What the HTTP path costs beyond the stages (multipart parsing, the front→runner hop with 150 KB
# pickled each way, JSON). An ESTIMATE, not measured per run: sequential requests here show the runner
# round trip ~5 ms (wall) above in-process inference and the front's total ~1 ms above its stages;
# we count 3 ms of CPU. The ceiling is therefore an estimate too, and BENCHMARKS.md says so.
HTTP_OVERHEAD_MS = 3.0


def cpu_and_wall(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median CPU ms and wall ms of ``fn`` over ``repeats`` runs (after one warm-up)."""
    fn()
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return statistics.median(cpu), statistics.median(wall)


@dataclass
class StageCost:
    stage: str
    detail: str
    cpu_ms: float
    wall_ms: float


@dataclass
class Ceiling:
    backend: str
    batch: int
    size_class: str
    cpu_ms_per_request: float
    req_per_s: float
    binding_stage: str
    shares: dict[str, float] = field(default_factory=dict)  # stage → share of the CPU per request


def profile_front(pool: list[tuple[str, bytes]], spec: PreprocessSpec, repeats: int) -> list[StageCost]:
    """Decode (by size class), preprocess and postprocess costs, one image at a time."""
    by_class: dict[str, list[bytes]] = {}
    for _, data in pool:
        img = decode(data, 10**9, 10**6)  # full decode just to learn the size
        by_class.setdefault(photos.size_class(*img.size), []).append(data)
    costs = []
    for cls, items in sorted(by_class.items()):
        sample = items[: min(len(items), 6)]
        cpu, wall = cpu_and_wall(lambda s=sample: [decode(d, 10**9, spec.resize_size) for d in s], repeats)
        costs.append(StageCost("decode", cls, cpu / len(sample), wall / len(sample)))
        decoded = [decode(d, 10**9, spec.resize_size) for d in sample]
        cpu, wall = cpu_and_wall(lambda d=decoded: [resize_and_crop(i, spec) for i in d], repeats)
        costs.append(StageCost("preprocess", cls, cpu / len(sample), wall / len(sample)))
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    categories = [str(i) for i in range(1000)]
    cpu, wall = cpu_and_wall(lambda: top_k(logits, 5, categories), repeats * 10)
    costs.append(StageCost("postprocess", "softmax + top-5", cpu, wall))
    return costs


def profile_inference(engines: dict[str, Any], batches: list[int], repeats: int) -> list[StageCost]:
    costs = []
    images = np.random.default_rng(1).integers(0, 256, (max(batches), 224, 224, 3), dtype=np.uint8)
    for name, engine in engines.items():
        for b in batches:
            cpu, wall = cpu_and_wall(lambda e=engine, x=images[:b]: e.run(x), repeats)
            costs.append(StageCost("inference", f"{name} b{b}", cpu / b, wall / b))
    return costs


def ceilings(costs: list[StageCost], cores: int, size_class: str = "medium") -> list[Ceiling]:
    """Per backend and batch size: the req/s the stages allow on ``cores`` for one image size class."""
    front = {c.stage: c.cpu_ms for c in costs if c.detail == size_class and c.stage in ("decode", "preprocess")}
    post = next((c.cpu_ms for c in costs if c.stage == "postprocess"), 0.0)
    out = []
    for c in costs:
        if c.stage != "inference":
            continue
        backend, batch = c.detail.rsplit(" b", 1)
        parts = {**front, "postprocess": post, "http": HTTP_OVERHEAD_MS, "inference": c.cpu_ms}
        total = sum(parts.values())
        out.append(
            Ceiling(
                backend=backend,
                batch=int(batch),
                size_class=size_class,
                cpu_ms_per_request=round(total, 2),
                req_per_s=round(cores * 1000 / total, 1),
                binding_stage=max(parts, key=lambda k: parts[k]),
                shares={k: round(v / total, 3) for k, v in parts.items()},
            )
        )
    return out


def best_ceiling(ceils: list[Ceiling], backend: str) -> Ceiling | None:
    mine = [c for c in ceils if c.backend == backend]
    return max(mine, key=lambda c: c.req_per_s) if mine else None


def run(engines: dict[str, Any], batches: list[int], repeats: int, spec: PreprocessSpec) -> dict[str, Any]:
    pool = photos.benchmark_pool()
    costs = profile_front(pool, spec, repeats) + profile_inference(engines, batches, repeats)
    cores = hardware.cpu_count()
    return {
        "hardware": hardware.probe(),
        "cores": cores,
        "http_overhead_ms": HTTP_OVERHEAD_MS,
        "stages": [asdict(c) for c in costs],
        "ceilings": [asdict(c) for c in ceilings(costs, cores)],
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| stage | detail | CPU ms | wall ms |", "|---|---|---|---|"]
    lines += [f"| {s['stage']} | {s['detail']} | {s['cpu_ms']:.2f} | {s['wall_ms']:.2f} |" for s in result["stages"]]
    lines += [
        "",
        f"Ceiling on {result['cores']} cores (1.5 MP-class photo, +{result['http_overhead_ms']} ms CPU for HTTP):",
        "",
    ]
    lines += ["| backend | batch | CPU ms / request | ceiling req/s | binding stage |", "|---|---|---|---|---|"]
    lines += [
        f"| {c['backend']} | {c['batch']} | {c['cpu_ms_per_request']} | {c['req_per_s']} | {c['binding_stage']} "
        f"({c['shares'][c['binding_stage']]:.0%}) |"
        for c in result["ceilings"]
    ]
    return "\n".join(lines)


def against_load_test(result: dict[str, Any], load: dict[str, Any]) -> list[dict[str, Any]]:
    """For each backend × concurrency of a load test: % of this machine's ceiling reached."""
    ceils = [Ceiling(**c) for c in result["ceilings"]]
    rows = []
    for run in load.get("runs", []):
        best = best_ceiling(ceils, run["backend"])
        if best is None or run.get("scenario") != "inference":
            continue
        rows.append(
            {
                "backend": run["backend"],
                "users": run["users"],
                "req_per_s": run["req_per_s"],
                "ceiling_req_per_s": best.req_per_s,
                "percent_of_ceiling": round(100 * run["req_per_s"] / best.req_per_s, 1),
                "binding_stage": best.binding_stage,
            }
        )
    return rows
