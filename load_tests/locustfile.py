"""Locust users for FastInfer.

* ``InferenceUser`` posts photos drawn from a pool of 60 distinct JPEGs (small, 1.5 MP and ~8 MP
  phone-size; see fastinfer.photos.benchmark_pool) to one backend, with the cache bypassed: every
  request is decoded and inferred. A response that says ``cached`` counts as a failure.
* ``RepeatUser`` posts one photo again and again without bypass: the cache-hit path, always
  reported apart from inference.

Environment: ``FASTINFER_BENCH_BACKEND`` (default onnx), ``FASTINFER_BENCH_IMAGES`` (pool cache dir).
Bodies are encoded once at start-up, so the client spends its CPU on sending, not on encoding.
"""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

from fastinfer.photos import benchmark_pool

BACKEND = os.environ.get("FASTINFER_BENCH_BACKEND", "onnx")
POOL = benchmark_pool(Path(os.environ.get("FASTINFER_BENCH_IMAGES", "artifacts/bench-images")))


def multipart(data: bytes, fields: dict[str, str]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="photo.jpg"\r\n'
        f"Content-Type: image/jpeg\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


BODIES = [multipart(data, {"backend": BACKEND}) for _, data in POOL]
REPEAT_BODY = multipart(POOL[len(POOL) // 2][1], {"backend": BACKEND})


class InferenceUser(FastHttpUser):
    wait_time = constant(0)  # closed loop: each user sends its next request when the last one returns

    @task
    def classify(self) -> None:
        body, ctype = random.choice(BODIES)
        headers = {"Content-Type": ctype, "Cache-Control": "no-cache"}
        with self.client.post(
            "/classify", data=body, headers=headers, name=f"inference {BACKEND}", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            elif response.json().get("cached"):
                response.failure("a cache hit in the inference scenario")


class RepeatUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def classify_again(self) -> None:
        body, ctype = REPEAT_BODY
        with self.client.post(
            "/classify", data=body, headers={"Content-Type": ctype}, name=f"repeat {BACKEND}", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
