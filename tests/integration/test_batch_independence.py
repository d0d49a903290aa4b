"""An answer does not depend on the other requests: the same photo alone, in one /classify/batch with
others, and among concurrent single requests (which the runner batches) scores the same, on every
backend that runs here. Dynamic INT8 computes its activation scales over the whole batch it is given: it
must run one image at a time, or its answers move with other clients' images."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fastinfer.catalog.backends import BACKENDS, unavailable_reason
from fastinfer.measure import photos
from tests.servers import NO_CACHE

# oneDNN picks PyTorch's convolution kernels by batch size: ~3e-5 of a logit, a few millionths of a score.
TOLERANCE = {"pytorch": 1e-5}
PHOTO = photos.photo_jpeg("chelsea.png", width=300, quality=88)
OTHERS = [photos.photo_jpeg(name, width=280 + 7 * i) for i, name in enumerate(photos.PHOTOS[:7])]


def _scores(body: dict) -> list[tuple[int, float]]:
    return [(p["index"], p["score"]) for p in body["top_k"]]


def _assert_same(backend: str, got: dict, want: dict) -> None:
    got_, want_ = _scores(got), _scores(want)
    assert [i for i, _ in got_] == [i for i, _ in want_], (backend, got_, want_)
    tolerance = TOLERANCE.get(backend, 0.0)
    for (_, a), (_, b) in zip(got_, want_, strict=True):
        assert abs(a - b) <= tolerance, (backend, got_, want_)


def _single(client: httpx.Client, backend: str, data: bytes) -> dict:
    answer = client.post(
        "/classify", data={"backend": backend}, files={"image": ("p.jpg", data, "image/jpeg")}, headers=NO_CACHE
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("backend", [b for b in BACKENDS if not b.startswith("coreml")])
def test_an_answer_does_not_depend_on_its_batch(built_models, server, backend: str) -> None:
    if unavailable_reason(backend) is not None:
        pytest.skip(f"{backend} cannot run here: {unavailable_reason(backend)}")
    with httpx.Client(base_url=server.url, timeout=120) as client:
        alone = _single(client, backend, PHOTO)
        files = [("images", (f"{i}.jpg", d, "image/jpeg")) for i, d in enumerate([*OTHERS[:3], PHOTO, *OTHERS[3:]])]
        batch = client.post("/classify/batch", data={"backend": backend}, files=files, headers=NO_CACHE)
        assert batch.status_code == 200, batch.text
        _assert_same(backend, batch.json()["results"][3], alone)

        # Concurrent singles: the runner's adaptive batching puts them together (when it is on).
        with ThreadPoolExecutor(8) as pool:
            for _ in range(2):
                jobs = [pool.submit(_single, client, backend, d) for d in [PHOTO, *OTHERS]]
                _assert_same(backend, jobs[0].result(), alone)
                assert all(job.result()["backend"] == backend for job in jobs)
