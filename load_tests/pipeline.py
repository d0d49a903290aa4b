"""The serving pipeline in one process, without HTTP: the real decode pool, micro-batcher, turns and engine, fed by
closed-loop clients over the benchmark pool, cache never asked. What each FASTINFER_SCHEDULING and decode pool size
gives where nothing but decoding and inference share the cores (docs/tuning.md#scheduling). The variants run in
turn, in the opposite order every other round, so that neither drift nor going first favours one of them.

    python -m load_tests.pipeline [--backend openvino-int8] [--images 250] [--clients 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.catalog import scheduling, store
from fastinfer.catalog.backends import SPECS, NotStored, open_engine
from fastinfer.catalog.config import get_settings
from fastinfer.common import hardware
from fastinfer.common.home import use_project_store
from fastinfer.engines import Engine, warm_up
from fastinfer.measure.photos import benchmark_pool
from fastinfer.serving.batching import MicroBatcher
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.preprocess import prepare
from fastinfer.serving.turns import Turns, make_lock_files

# Engines whose batch runs as one call (the runner splits the others into one call per image).
BACKENDS = [name for name, spec in SPECS.items() if spec.rows_independent]


async def serve_pool(
    engine: Engine, backend: str, pool: list[bytes], mode: str, decode_threads: int, images: int, clients: int
) -> dict[str, Any]:
    """``images`` photos of ``pool`` through decode → batch → engine by ``clients`` callers, as a front worker with
    its engine (FASTINFER_IN_FRONT) does them: images/s, CPU ms per image, turns not taken."""
    with tempfile.TemporaryDirectory(prefix="fastinfer-pipeline-") as folder:
        turns = Turns(True, make_lock_files(Path(folder))) if mode == "turns" else Turns(False)
        batching = get_settings().batching_for(backend)
        cpu = CpuPool(decode_threads, turns=turns)

        def infer(batch: np.ndarray) -> np.ndarray:
            with turns.inferring():
                return engine.run(batch)

        before = turns.after_decodes if turns.enabled else None  # as RunnerCore: nothing on the path for `shared`
        batcher = MicroBatcher(infer, batching.max_batch_size, batching.max_latency_ms, before)
        try:
            wall, used = await _closed_loop(cpu, batcher, pool, images, clients)
        finally:
            cpu.close()
            batcher.close()
        return {
            "scheduling": mode,
            "decode_threads": decode_threads,
            "images_per_s": round(images / wall, 1),
            "cpu_ms_per_image": round(used / images * 1000, 2),
            "turns_not_taken": turns.overdue,
        }


async def _closed_loop(
    cpu: CpuPool, batcher: MicroBatcher, pool: list[bytes], images: int, clients: int
) -> tuple[float, float]:
    """Wall and process CPU seconds (every thread's) for ``images`` requests, each client sending its next as soon
    as its last is answered."""
    settings, spec = get_settings(), store.family_spec()
    sent = 0

    async def client() -> None:
        nonlocal sent
        while sent < images:
            data = pool[sent % len(pool)]
            sent += 1
            pixels = await cpu.run(lambda data=data: prepare(data, spec, settings.max_pixels).pixels, decode=True)
            await batcher.submit(pixels[np.newaxis])

    started, cpu_started = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - started, time.process_time() - cpu_started


def sizes(text: str) -> list[int]:
    return [int(n) for n in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load_tests.pipeline", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backend", default="openvino-int8", choices=BACKENDS)
    parser.add_argument("--schedulings", default=",".join(scheduling.MODES), help="comma-separated")
    parser.add_argument(
        "--decode-threads", default=[0], type=sizes, help="comma-separated pool sizes (default 0: one per core)"
    )
    parser.add_argument("--images", type=int, default=250, help="photos per variant and round")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.schedulings.split(",") if m.strip()]
    if not modes or any(m not in scheduling.MODES for m in modes):
        parser.error(f"--schedulings: one or more of {', '.join(scheduling.MODES)}")
    threads = [n or hardware.cpu_count() for n in args.decode_threads]
    if min(args.images, args.clients, args.rounds, *threads) < 1:
        parser.error("--images, --clients, --rounds and --decode-threads must be positive (0: one per core)")
    use_project_store()
    os.environ["FASTINFER_TUNED"] = "off"  # the defaults and the environment, as `make bench` measures
    settings = get_settings()
    try:
        engine = open_engine(args.backend, hardware.intra_op_threads(1, settings.threads))
    except (NotStored, ImportError, RuntimeError) as exc:
        parser.error(f"{args.backend} cannot run here: {exc}")
    warm_up(engine, (1, settings.batching_for(args.backend).max_batch_size))
    pool = [data for _, data in benchmark_pool()]
    variants = list(product(modes, threads))
    rows = []
    for round_ in range(1, args.rounds + 1):
        for mode, size in variants if round_ % 2 else variants[::-1]:
            print(f"round {round_}: {mode}, {size} decode threads ...", file=sys.stderr, flush=True)
            row = asyncio.run(serve_pool(engine, args.backend, pool, mode, size, args.images, args.clients))
            rows.append({"round": round_, **row})
    print(f"{args.backend}, {args.clients} clients, {args.images} images per row, {hardware.cpu_count()} cores")
    print("| round | scheduling | decode threads | images/s | CPU ms per image | turns not taken |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['scheduling']} | {r['decode_threads']} | {r['images_per_s']} | "
              f"{r['cpu_ms_per_image']} | {r['turns_not_taken']} |")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"backend": args.backend, "clients": args.clients, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
