"""FASTINFER_IN_FRONT through a real ``bentoml serve``: the engine runs in the front worker (no runner process),
answers as its runner would, batches, keeps every bad-input 4xx; its crash takes the front worker down until it
restarts."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from fastinfer.measure import photos
from load_tests.service import Server
from tests import images
from tests.servers import NO_CACHE, serve, service_pids, serving

IN_FRONT = "onnx-int8"
SERVED = ("onnx", IN_FRONT)  # onnx: the default backend, in its runner beside the engine in front


@pytest.fixture(scope="module")
def in_front_server(built_models, bentoml_home: Path, tmp_path_factory) -> Server:
    env = {"FASTINFER_IN_FRONT": IN_FRONT, "FASTINFER_CACHE": "memory"}
    env |= serving(*SERVED)
    with serve(tmp_path_factory.mktemp("in-front"), env, store=bentoml_home) as srv:
        yield srv


def classify(client: httpx.Client, data: bytes, backend: str = IN_FRONT) -> httpx.Response:
    return client.post(
        "/classify", data={"backend": backend}, files={"image": ("p.jpg", data, "image/jpeg")}, headers=NO_CACHE
    )


def test_the_engine_runs_in_the_front_and_answers_as_its_runner_does(in_front_server: Server, server: Server) -> None:
    data = photos.photo_jpeg("coffee.png", width=640)
    with httpx.Client(base_url=in_front_server.url, timeout=60) as here, httpx.Client(base_url=server.url) as there:
        ours, theirs = classify(here, data), classify(there, data)
        assert ours.status_code == 200 == theirs.status_code, ours.text
        ours, theirs = ours.json(), theirs.json()
        assert ours["model"] == theirs["model"]
        assert [p["index"] for p in ours["top_k"]] == [p["index"] for p in theirs["top_k"]]
        scores = [[p["score"] for p in answer["top_k"]] for answer in (ours, theirs)]
        np.testing.assert_allclose(*scores, atol=1e-4)
        backends = {b["name"]: b for b in here.get("/backends").json()["backends"]}
    assert backends[IN_FRONT]["runs_on"]["placement"] == "front worker"
    assert backends["onnx"]["runs_on"]["placement"] == "runner process"
    assert not service_pids(in_front_server, f"runner-{IN_FRONT}")  # no process started for it
    assert service_pids(in_front_server, "runner-onnx")


def test_a_backend_left_out_of_fastinfer_backends_has_no_runner_and_answers_503(in_front_server: Server) -> None:
    with httpx.Client(base_url=in_front_server.url, timeout=60) as client:
        listed = {b["name"]: b for b in client.get("/backends").json()["backends"]}
        refused = classify(client, photos.photo_jpeg("coffee.png", width=320), backend="pytorch")
    assert sorted(name for name, b in listed.items() if b["available"]) == sorted(SERVED)
    reason = listed["pytorch"]["reason"]
    assert reason.startswith(f"switched off: FASTINFER_BACKENDS={','.join(SERVED)} leaves it out"), reason
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == {"code": "backend_unavailable", "message": reason}
    for name in listed.keys() - set(SERVED):
        assert not service_pids(in_front_server, f"runner-{name}"), name


def test_concurrent_requests_are_batched_in_the_front_and_bad_input_stays_4xx(in_front_server: Server) -> None:
    pool = [photos.photo_jpeg(name, width=320 + 17 * i) for i, name in enumerate(photos.PHOTOS[:8])]
    with httpx.Client(base_url=in_front_server.url, timeout=60) as client:
        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(lambda data: classify(client, data), pool * 3))
        assert [a.status_code for a in answers] == [200] * len(answers)
        seen = {b["name"]: b for b in client.get("/backends").json()["backends"]}[IN_FRONT]["runs_on"]
        assert sum(int(n) * c for n, c in seen["batch_sizes_seen"].items()) >= len(answers)
        assert max(int(n) for n in seen["batch_sizes_seen"]) > 1  # concurrent requests ran together
        assert seen["calls"]["infer_batched"] >= len(answers)
        for bad in (images.truncated_jpeg(), b"not an image", images.bomb_png(8000)):
            refused = classify(client, bad)
            assert 400 <= refused.status_code < 500 and "error" in refused.json(), refused.text


def test_an_engine_crash_takes_the_front_worker_down_until_it_restarts(in_front_server: Server) -> None:
    """SIGSEGV, as a crash in the engine's native code would: the worker dies with everything it serves
    (the API page, probes and cache hits included), and BentoML starts a new one."""
    front = service_pids(in_front_server, "fastinfer")
    assert len(front) == 1
    os.kill(front[0], signal.SIGSEGV)
    deadline = time.monotonic() + 180
    with httpx.Client(base_url=in_front_server.url, timeout=10) as client:
        while time.monotonic() < deadline:
            now = service_pids(in_front_server, "fastinfer")
            if now and now != front:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"the front worker did not come back:\n{in_front_server.log_tail()}")
        answer = client.post(
            "/classify",
            data={"backend": IN_FRONT},
            files={"image": ("p.jpg", photos.photo_jpeg("astronaut.png", width=300), "image/jpeg")},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
