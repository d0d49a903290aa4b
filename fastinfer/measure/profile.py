"""The cost of each stage of a request, measured in-process in CPU time, and the ceiling they allow.

Decoding and inference share the cores, so the ceiling is ``cores / CPU-seconds per request``. The HTTP path's
cost is measured on a live server by ``python -m load_tests`` (:func:`http_cost`), else estimated.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common import hardware
from fastinfer.measure import photos, plots
from fastinfer.serving.postprocess import top_k
from fastinfer.serving.preprocess import decode, resize_and_crop

# The HTTP path's CPU per request when no server was measured: an ESTIMATE (`make bench` measured 5–13 ms).
HTTP_OVERHEAD_MS = 8.0
POOL = "pool"  # stages measured over the benchmark pool: the mix locust sends
PHOTO = "benchmark photo"  # stages measured on photos.benchmark_photo(): what the sequential step sends
SIZE_CLASSES = ("small", "medium", "phone")
POOL_PILLOW = "pool, Pillow alone"  # the pool's decode without the libjpeg-turbo path


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
    http_ms: float = HTTP_OVERHEAD_MS  # CPU per request for the HTTP path counted in this ceiling
    http_source: str = "estimate"  # "measured" (a bench on a live server) or "estimate" (HTTP_OVERHEAD_MS)


@dataclass
class HttpCost:
    """The HTTP path's CPU per request for one backend, measured on a live server: each process's CPU per
    request less its in-process stages; http_ms is their sum, clamped at 0."""

    backend: str
    users: int
    requests: int
    batch: int  # the in-process batch size whose per-image inference CPU was subtracted
    front_cpu_ms: float
    runner_cpu_ms: float
    front_stages_ms: float
    inference_ms: float
    front_overhead_ms: float
    runner_overhead_ms: float
    http_ms: float
    mean_batch: float | None = None  # rows per runner call in the run, where the server reported it


def profile_front(pool: list[tuple[str, bytes]], spec: PreprocessSpec, repeats: int) -> list[StageCost]:
    """Decode and preprocess costs per image: per size class, over the pool, for the benchmark photo; postprocess."""
    by_class: dict[str, list[bytes]] = {}
    for _, data in pool:
        by_class.setdefault(_size_class(data), []).append(data)
    groups = [(cls, items[: min(len(items), 6)]) for cls, items in sorted(by_class.items())]
    groups += [(POOL, [data for _, data in pool]), (PHOTO, [photos.benchmark_photo()])]
    everything = [data for _, data in pool]
    cpu, wall = cpu_and_wall(lambda: [decode(d, 10**9, spec.resize_size, fast_jpeg=False) for d in everything], repeats)
    costs = [StageCost("decode", POOL_PILLOW, cpu / len(everything), wall / len(everything))]
    for detail, sample in groups:
        cpu, wall = cpu_and_wall(lambda s=sample: [decode(d, 10**9, spec.resize_size) for d in s], repeats)
        costs.append(StageCost("decode", detail, cpu / len(sample), wall / len(sample)))
        decoded = [decode(d, 10**9, spec.resize_size) for d in sample]
        cpu, wall = cpu_and_wall(lambda d=decoded: [resize_and_crop(i, spec) for i in d], repeats)
        costs.append(StageCost("preprocess", detail, cpu / len(sample), wall / len(sample)))
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    categories = [str(i) for i in range(1000)]
    cpu, wall = cpu_and_wall(lambda: top_k(logits, 5, categories), repeats * 10)
    costs.append(StageCost("postprocess", "softmax + top-5", cpu, wall))
    return costs


def _size_class(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as img:  # the header alone: no decode
        return photos.size_class(*img.size)


def pool_sizes(pool: list[tuple[str, bytes]]) -> dict[str, int]:
    return dict(sorted(Counter(_size_class(data) for _, data in pool).items()))


def profile_inference(engines: dict[str, Any], batches: list[int], repeats: int) -> list[StageCost]:
    costs = []
    images = np.random.default_rng(1).integers(0, 256, (max(batches), 224, 224, 3), dtype=np.uint8)
    for name, engine in engines.items():
        for b in batches:
            cpu, wall = cpu_and_wall(lambda e=engine, x=images[:b]: e.run(x), repeats)
            costs.append(StageCost("inference", f"{name} b{b}", cpu / b, wall / b))
    return costs


def _stage(costs: list[StageCost], stage: str, detail: str, what: str = "cpu_ms") -> float | None:
    return next((getattr(c, what) for c in costs if c.stage == stage and c.detail == detail), None)


def _post(costs: list[StageCost]) -> float:
    return next((c.cpu_ms for c in costs if c.stage == "postprocess"), 0.0)


def front_stages_ms(costs: list[StageCost], detail: str = POOL) -> float | None:
    """In-process CPU of decode + preprocess + postprocess per image of ``detail`` (None if not measured)."""
    decode_ms, prep_ms = _stage(costs, "decode", detail), _stage(costs, "preprocess", detail)
    return None if decode_ms is None or prep_ms is None else decode_ms + prep_ms + _post(costs)


def in_process_latency_ms(costs: list[StageCost], backend: str) -> float | None:
    """Wall ms of decode + preprocess + inference (b1) of the sequential step's photo, in-process."""
    parts = [
        _stage(costs, "decode", PHOTO, "wall_ms"),
        _stage(costs, "preprocess", PHOTO, "wall_ms"),
        _stage(costs, "inference", f"{backend} b1", "wall_ms"),
    ]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _per_image(costs: list[StageCost], backend: str) -> list[tuple[int, float]]:
    """(batch size, inference CPU ms per image) of each profiled size of ``backend``, smallest first."""
    return sorted(
        (int(c.detail.rsplit(" b", 1)[1]), c.cpu_ms)
        for c in costs
        if c.stage == "inference" and c.detail.rsplit(" b", 1)[0] == backend
    )


def inference_at(costs: list[StageCost], backend: str, batch: float) -> float | None:
    """In-process inference CPU per image at a mean batch size: ``a + o / batch`` (a per-image cost plus a
    per-call one) through the profiled sizes around it, clamped to them. None if nothing was profiled."""
    per_image = _per_image(costs, backend)
    if not per_image:
        return None
    below = [(b, ms) for b, ms in per_image if b <= batch] or per_image[:1]
    above = [(b, ms) for b, ms in per_image if b >= batch] or per_image[-1:]
    (b0, ms0), (b1, ms1) = below[-1], above[0]
    if b1 == b0:
        return ms0
    shared = (ms0 - ms1) / (1 / b0 - 1 / b1)  # o, from ms0 = a + o/b0 and ms1 = a + o/b1
    return ms1 - shared / b1 + shared / batch


@dataclass
class ServedSplit:
    """One served run against the engine's ceiling without HTTP, and the server's CPU beyond decode and inference
    by cause (CPU ms per request; the causes sum to ``beyond_ms``). ``base_from_run``: the run's own decode and
    engine threads spent less than profiled (down to :data:`DRIFT`), so its figure is the base."""

    backend: str
    users: int
    placement: str  # "runner process" or "front worker"
    req_per_s: float
    batch: float  # rows per model call in the run (1 without batching)
    decode_ms: float  # decode + preprocess per image, the pool's mix: in process, or the run's if less
    inference_ms: float  # inference per image at ``batch``: in process, or the run's engine threads' if less
    ceiling_req_per_s: float  # cores / (decode + postprocess + inference): no HTTP
    share: float  # req_per_s / ceiling
    server_ms: float  # all server processes' CPU per request
    beyond_ms: float  # server_ms − decode − postprocess − inference
    causes: dict[str, float] = field(default_factory=dict)
    run_round: int = 0  # which round of the bench's placement step (0: a main run)
    base_from_run: tuple[str, ...] = ()  # "decode", "inference": where the run spent less than the profile
    missed_processes: int = 0  # server processes the run's first CPU reading missed: its figures understate


DRIFT = 0.75  # a run may spend this share of the profiled CPU and still be the same work (VMs drift 15–35%)


def served_split(
    costs: list[StageCost], cores: int, run: Mapping[str, Any], placement: str = "runner process"
) -> ServedSplit | None:
    """:class:`ServedSplit` of one locust run; None where the run or the profile lacks what it needs."""
    cpu = run.get("cpu") or {}
    threads = cpu.get("threads_ms_per_request") or {}
    decode_ms, prep_ms, post = _stage(costs, "decode", POOL), _stage(costs, "preprocess", POOL), _post(costs)
    batching = run.get("batching") or {}
    batch = float(batching.get("mean_batch") or 1.0) if batching.get("enabled", True) else 1.0
    inference = inference_at(costs, run["backend"], batch)
    if not cpu or decode_ms is None or prep_ms is None or inference is None or not run.get("requests"):
        return None
    per = cpu["ms_per_request"]
    server = per["front"] + per["runner"] + per["other"]
    decode_ms += prep_ms
    from_run: list[str] = []
    causes: dict[str, float] = {}
    if threads:
        front, runner = threads.get("front", {}), threads.get("runner", {})
        served_decode = front.get("decode", 0.0)
        served_engine = runner.get("engine and other threads", 0.0) + (
            front.get("engine and other threads", 0.0) if placement == "front worker" else 0.0
        )
        # The ceiling is never below what the run proved possible; further below DRIFT, the threads were not
        # told apart: the profile stands, and the negative cause withholds the verdict.
        if DRIFT * decode_ms <= served_decode < decode_ms:
            decode_ms, from_run = served_decode, [*from_run, "decode"]
        if DRIFT * inference <= served_engine < inference:
            inference, from_run = served_engine, [*from_run, "inference"]
        causes = {
            "front event loop": front.get("event loop", 0.0) - post,
            "runner event loop": runner.get("event loop", 0.0),
            "decode beyond in-process": served_decode - decode_ms,
            "engine beyond in-process": served_engine - inference,
        }
    beyond = server - decode_ms - post - inference
    if causes:
        causes["other"] = beyond - sum(causes.values())
    ceiling = cores * 1000 / (decode_ms + post + inference)
    return ServedSplit(
        backend=run["backend"],
        users=run["users"],
        placement=placement,
        req_per_s=run["req_per_s"],
        batch=round(batch, 2),
        decode_ms=round(decode_ms, 2),
        inference_ms=round(inference, 2),
        ceiling_req_per_s=round(ceiling, 1),
        share=math.floor(run["req_per_s"] / ceiling * 1000 + 1e-9) / 1000,  # down, never up to a target
        server_ms=round(server, 2),
        beyond_ms=round(beyond, 2),
        causes={k: round(v, 2) for k, v in causes.items()},
        base_from_run=tuple(from_run),
        missed_processes=int(cpu.get("missed_processes") or 0),
        run_round=int(run.get("round", 0)),
    )


def subtracted_batch(costs: list[StageCost], backend: str, batching: bool, max_batch: int = 8) -> int | None:
    """The in-process batch size whose per-image inference CPU stands for what the runner spends: the cheapest
    within ``max_batch`` (never hiding HTTP cost in "inference"), b1 without batching."""
    per_image = dict(_per_image(costs, backend))
    if not batching:
        return 1 if 1 in per_image else None
    within = {b: ms for b, ms in per_image.items() if b <= max_batch}
    return min(within, key=lambda b: (within[b], -b)) if within else None


def http_cost(
    costs: list[StageCost],
    backend: str,
    users: int,
    requests: int,
    front_cpu_ms: float,
    runner_cpu_ms: float,
    batching: bool,
    max_batch: int = 8,
    mean_batch: float | None = None,
) -> HttpCost | None:
    """The measured HTTP cost of one backend's run against the in-process stages; None if they were not profiled."""
    stages = front_stages_ms(costs, POOL)
    batch = subtracted_batch(costs, backend, batching, max_batch)
    inference = None if batch is None else _stage(costs, "inference", f"{backend} b{batch}")
    if stages is None or batch is None or inference is None:
        return None
    front = front_cpu_ms - stages
    runner = runner_cpu_ms - inference
    return HttpCost(
        backend=backend,
        users=users,
        requests=requests,
        batch=batch,
        front_cpu_ms=round(front_cpu_ms, 2),
        runner_cpu_ms=round(runner_cpu_ms, 2),
        front_stages_ms=round(stages, 2),
        inference_ms=round(inference, 2),
        front_overhead_ms=round(front, 2),
        runner_overhead_ms=round(runner, 2),
        http_ms=round(max(0.0, front + runner), 2),
        mean_batch=mean_batch,
    )


def ceilings(
    costs: list[StageCost], cores: int, size_class: str = POOL, http: Mapping[str, float] | None = None
) -> list[Ceiling]:
    """Per backend and batch size: the req/s the stages allow on ``cores`` for one image mix, with ``http``'s
    measured HTTP cost per backend, else the estimate HTTP_OVERHEAD_MS."""
    front = {c.stage: c.cpu_ms for c in costs if c.detail == size_class and c.stage in ("decode", "preprocess")}
    measured = http or {}
    out = []
    for c in (c for c in costs if c.stage == "inference"):
        backend, batch = c.detail.rsplit(" b", 1)
        http_ms = measured.get(backend, HTTP_OVERHEAD_MS)
        parts = {**front, "postprocess": _post(costs), "http": http_ms, "inference": c.cpu_ms}
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
                http_ms=round(http_ms, 2),
                http_source="measured" if backend in measured else "estimate",
            )
        )
    return out


def _ceilings(costs: list[StageCost], cores: int, http: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The ceilings for the pool's mix, and for each size class alone (all small photos, all 1.5 MP, all phone-size)."""
    present = {c.detail for c in costs if c.stage == "decode"}
    by_size = [c for cls in SIZE_CLASSES if cls in present for c in ceilings(costs, cores, cls, http)]
    return {"ceilings": [asdict(c) for c in ceilings(costs, cores, http=http)],
            "ceilings_by_size": [asdict(c) for c in by_size]}  # fmt: skip


def best_ceiling(ceils: list[Ceiling], backend: str, size_class: str | None = None) -> Ceiling | None:
    mine = [c for c in ceils if c.backend == backend and (size_class is None or c.size_class == size_class)]
    return max(mine, key=lambda c: c.req_per_s) if mine else None


def with_http(result: dict[str, Any], http: Mapping[str, float]) -> dict[str, Any]:
    """``result`` (of :func:`run`) with its ceilings recomputed with the measured HTTP cost per backend."""
    costs = [StageCost(**s) for s in result["stages"]]
    measured = {b: round(v, 2) for b, v in http.items()}
    return {**result, "http_measured_ms": measured, **_ceilings(costs, result["cores"], http)}


def run(engines: dict[str, Any], batches: list[int], repeats: int, spec: PreprocessSpec) -> dict[str, Any]:
    pool = photos.benchmark_pool()
    costs = profile_front(pool, spec, repeats) + profile_inference(engines, batches, repeats)
    cores = hardware.cpu_count()
    return {
        "hardware": hardware.probe(),
        "cores": cores,
        "pool": pool_sizes(pool),
        "http_overhead_ms": HTTP_OVERHEAD_MS,  # the estimate; a bench adds http_measured_ms
        "stages": [asdict(c) for c in costs],
        **_ceilings(costs, cores),
    }


def http_note(result: dict[str, Any]) -> str:
    """How the ceilings counted the HTTP path: measured per backend, or the estimate (and where)."""
    ceils = [Ceiling(**c) for c in result["ceilings"]]
    measured = {c.backend: c.http_ms for c in ceils if c.http_source == "measured"}
    estimated = sorted({c.backend for c in ceils if c.http_source != "measured"})
    listed = ", ".join(f"{b} {ms:g} ms" for b, ms in measured.items())
    parts = [f"the HTTP path's CPU MEASURED on a live server ({listed})"] if measured else []
    if estimated:
        whose = f" for {', '.join(estimated)}" if measured else ""
        parts.append(f"an ESTIMATED {result['http_overhead_ms']:g} ms of CPU for the HTTP path{whose} (not measured: "
                     "no server ran; `make bench` measures it)")  # fmt: skip
    return " and ".join(parts)


def table(result: dict[str, Any]) -> str:
    stages = [[s["stage"], s["detail"], f"{s['cpu_ms']:.2f}", f"{s['wall_ms']:.2f}"] for s in result["stages"]]
    mix = result.get("pool")
    said = (
        f"Ceiling on {result['cores']} cores for the benchmark pool's mix"
        + (f" ({', '.join(f'{n} {cls}' for cls, n in mix.items())})" if mix else "")
        + f", with {http_note(result)}:"
    )
    ceils = [[c["backend"], c["batch"], c["cpu_ms_per_request"], c["req_per_s"],
              f"{c['binding_stage']} ({c['shares'][c['binding_stage']]:.0%})",
              f"{c.get('http_ms', result['http_overhead_ms'])} ({c.get('http_source', 'estimate')})"]
             for c in result["ceilings"]]  # fmt: skip
    head = ["backend", "batch", "CPU ms / request", "ceiling req/s", "binding stage", "HTTP ms"]
    return "\n\n".join([plots.table(["stage", "detail", "CPU ms", "wall ms"], stages), said, plots.table(head, ceils)])
