"""Locust users for FastInfer: ``InferenceUser`` posts pool photos to one backend, cache bypassed (a cached answer
fails); ``RepeatUser`` one photo again and again (the cache-hit path); ``BatchUser`` ``BATCH_IMAGES`` pool photos
per ``POST /classify/batch``. Bodies are encoded once.

Environment: ``FASTINFER_BENCH_BACKEND`` (default onnx), ``FASTINFER_BENCH_IMAGES`` (pool cache dir),
``FASTINFER_BENCH_SUMMARY`` (where to write the final totals, the first error and the CPU seconds).
"""

from __future__ import annotations

import json
import os
import random
import time
from functools import cache
from pathlib import Path
from typing import Any

from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.stats import StatsError

from fastinfer.common.client import auth_headers
from fastinfer.measure.photos import benchmark_pool
from load_tests.checks import BATCH_IMAGES, batch_failure, multipart, repeat_photo

BACKEND = os.environ.get("FASTINFER_BENCH_BACKEND", "onnx")
POOL = benchmark_pool(Path(os.environ.get("FASTINFER_BENCH_IMAGES", "artifacts/bench-images")))
SUMMARY = os.environ.get("FASTINFER_BENCH_SUMMARY")
_window: dict[str, float] = {}


@events.test_start.add_listener
def _at_start(**_: object) -> None:
    _window.update(cpu0=time.process_time(), wall0=time.perf_counter())


@events.test_stop.add_listener
def _at_stop(**_: object) -> None:
    if "cpu0" in _window:
        _window.update(cpu_s=time.process_time() - _window["cpu0"], wall_s=time.perf_counter() - _window["wall0"])


@events.quitting.add_listener
def _write_summary(environment: Any, **_: object) -> None:
    if not SUMMARY:
        return
    total = environment.stats.total
    first = next(iter(environment.stats.errors.values()), None)  # in the order they were first seen
    summary = {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "req_per_s": total.total_rps,
        **{f"p{q}_ms": total.get_response_time_percentile(q / 100) if total.num_requests else 0 for q in (50, 95, 99)},
        **{k: _window[k] for k in ("cpu_s", "wall_s") if k in _window},
        "first_failure": StatsError.parse_error(first.to_name())[:300] if first else "",  # no 0x addresses
    }
    written = Path(f"{SUMMARY}.part")
    written.write_text(json.dumps(summary))
    written.replace(SUMMARY)  # whole or not at all: run_locust reads it


AUTH = auth_headers()  # a server with API keys: FASTINFER_API_KEY
BODIES = [multipart(data, {"backend": BACKEND}) for _, data in POOL]
REPEAT_BODY = multipart(repeat_photo(POOL), {"backend": BACKEND})


@cache
def batch_bodies() -> list[tuple[bytes, str]]:
    """Bodies of BATCH_IMAGES distinct photos each (every photo in two), built only by the users that send batches."""
    step = BATCH_IMAGES // 2
    return [
        multipart([POOL[(start + j) % len(POOL)][1] for j in range(BATCH_IMAGES)], {"backend": BACKEND}, name="images")
        for start in range(0, len(POOL), step)
    ]


def _post(user: FastHttpUser, path: str, body: tuple[bytes, str], scenario: str, bypass_cache: bool = True) -> Any:
    """The request of ``scenario``, its answer judged by the caller (``catch_response``)."""
    headers = {"Content-Type": body[1], **({"Cache-Control": "no-cache"} if bypass_cache else {}), **AUTH}
    return user.client.post(path, data=body[0], headers=headers, name=f"{scenario} {BACKEND}", catch_response=True)


class InferenceUser(FastHttpUser):
    wait_time = constant(0)  # closed loop: each user sends its next request when the last one returns

    @task
    def classify(self) -> None:
        with _post(self, "/classify", random.choice(BODIES), "inference") as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            elif response.json().get("cached"):
                response.failure("a cache hit in the inference scenario")


class RepeatUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def classify_again(self) -> None:
        with _post(self, "/classify", REPEAT_BODY, "repeat", bypass_cache=False) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")


class BatchUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def classify_batch(self) -> None:
        with _post(self, "/classify/batch", random.choice(batch_bodies()), "batch") as response:
            try:
                answer = response.json() if response.status_code == 200 else None
            except ValueError:
                answer = None
            why = batch_failure(response.status_code, answer, BATCH_IMAGES)
            if why is not None:
                response.failure(why if answer is not None else f"{why}: {(response.text or '')[:200]}")
