"""A second server (pytorch batching off, a 3 s deadline), for what the shared one cannot show: two
servers sharing one Redis, which runner API a route really calls, a corrupt model in the store, the
deadline against a slow client, and a graceful shutdown with a request provably in flight. The shutdown test stops this
server, so it runs last."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fastinfer import photos
from tests.servers import NO_CACHE, start_server, stop_server

TIMEOUT_S = 3
CORRUPT = "resnet50-openvino-int8"


@pytest.fixture(scope="module")
def own_server(built_models, bentoml_home, redis_server, tmp_path_factory):
    # Its own BENTOML_HOME over the same model store: `bentoml serve` wipes
    # $BENTOML_HOME/prometheus_multiproc_dir at start, which would blank the shared server's metrics.
    # One model in it is broken: openvino-int8's weights file is cut short (a failed copy, a full disk).
    home = tmp_path_factory.mktemp("home-lifecycle")
    for model in (bentoml_home / "models").iterdir():
        if model.name != CORRUPT:
            (home / "models").mkdir(exist_ok=True)
            (home / "models" / model.name).symlink_to(model)
    shutil.copytree(bentoml_home / "models" / CORRUPT, home / "models" / CORRUPT)
    version = (home / "models" / CORRUPT / "latest").read_text().strip()
    weights = home / "models" / CORRUPT / version / "model.bin"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    env = {"REDIS_URL": redis_server.url, "FASTINFER_BATCHING_PYTORCH": "false", "FASTINFER_TIMEOUT_S": str(TIMEOUT_S)}
    srv = start_server(home, tmp_path_factory.mktemp("serve-lifecycle") / "serve.log", env)
    yield srv
    stop_server(srv)


def test_a_corrupt_model_makes_its_backend_unavailable_and_the_rest_serves(own_server) -> None:
    files = {"image": ("p.jpg", photos.photo_jpeg("astronaut.png", width=301), "image/jpeg")}
    with httpx.Client(base_url=own_server.url, timeout=60) as client:
        assert client.get("/readyz").status_code == 200
        # First /compare (before any request learnt of the failure): every other backend, this one unavailable.
        compared = client.post("/compare", files=files)
        assert compared.status_code == 200, compared.text
        assert "openvino-int8" in compared.json()["summary"]["unavailable"]
        assert {r["backend"] for r in compared.json()["results"]} >= {"openvino", "onnx-int8", "pytorch"}
        broken = client.post("/classify", data={"backend": "openvino-int8"}, files=files)
        assert broken.status_code == 503, broken.text
        error = broken.json()["error"]
        assert error["code"] == "backend_unavailable" and "openvino-int8 could not be loaded" in error["message"]
        info = {b["name"]: b for b in client.get("/backends").json()["backends"]}
        assert info["openvino-int8"]["available"] is False
        assert "could not be loaded" in info["openvino-int8"]["reason"]
        for backend in ("openvino", "onnx-int8", "pytorch"):  # the same runtime, another model, another runtime
            ok = client.post("/classify", data={"backend": backend}, files=files)
            assert ok.status_code == 200 and ok.json()["backend"] == backend, ok.text
            assert info[backend]["available"] is True


def test_two_servers_share_one_redis(client, own_server) -> None:
    data = photos.photo_jpeg("rocket.jpg", width=357, quality=81)  # bytes no other test sends
    first = client.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")})
    with httpx.Client(base_url=own_server.url, timeout=60) as other:
        second = other.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")})
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["cached"] is False
    assert second.json()["cached"] is True  # computed by the shared server, served by this one


def runner_calls(client: httpx.Client, backend: str) -> dict[str, int]:
    backends = {b["name"]: b for b in client.get("/backends").json()["backends"]}
    return backends[backend]["runs_on"]["calls"]


def test_predict_batched_goes_through_infer_batched(own_server) -> None:
    """pytorch batching is off here, so /predict calls `infer` and only /predict/batched `infer_batched`."""
    files = {"image": ("p.jpg", photos.photo_jpeg("coffee.png", width=333), "image/jpeg")}
    with httpx.Client(base_url=own_server.url, timeout=60) as client:
        before = runner_calls(client, "pytorch")
        assert client.post("/predict", files=files, headers=NO_CACHE).status_code == 200
        middle = runner_calls(client, "pytorch")
        assert client.post("/predict/batched", files=files, headers=NO_CACHE).status_code == 200
        after = runner_calls(client, "pytorch")
    assert (middle["infer"] - before["infer"], middle["infer_batched"] - before["infer_batched"]) == (1, 0)
    assert (after["infer"] - middle["infer"], after["infer_batched"] - middle["infer_batched"]) == (0, 1)


def multipart(image: bytes, **fields: str) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="p.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n".encode()
        + image
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def open_upload(url: str, body: bytes, content_type: str) -> socket.socket:
    """A POST /classify whose headers and first half of the body are sent; the rest is up to the caller."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST /classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    raw = b"".join(chunks)
    return int(raw.split(b" ", 2)[1]), raw.split(b"\r\n\r\n", 1)[1]


def test_a_client_too_slow_to_send_gets_our_408_before_bentomls_timeout(own_server) -> None:
    body, ctype = multipart(photos.photo_jpeg("coffee.png", width=400))
    started = time.monotonic()
    with open_upload(own_server.url, body, ctype) as sock:  # ... and the second half never comes
        status, payload = read_response(sock)
    seconds = time.monotonic() - started
    assert status == 408, payload
    assert b'"code": "request_timeout"' in payload  # ours, not BentoML's {"error": "Not able to ..."}
    assert TIMEOUT_S - 0.5 < seconds < TIMEOUT_S + 4  # BentoML's backstop would answer at TIMEOUT_S + 5


def in_flight(client: httpx.Client, route: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        ours = f'endpoint="{route}"' in line and 'service_name="fastinfer"' in line
        if line.startswith("bentoml_service_request_in_progress{") and ours:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_graceful_shutdown_finishes_every_request_in_flight(own_server) -> None:
    """Eight requests to one runner are half-uploaded when SIGTERM arrives, and the server says all
    eight are in progress: they are in flight by construction, not by timing. Every one must still be
    answered. (`bentoml serve` deletes the runners' socket files at SIGTERM; before runners/drain.py
    linked them back, a request that found a pooled connection got 200, one that needed a new one 503.)"""
    uploads = [multipart(photos.photo_jpeg("chelsea.png", width=400 + i), backend="pytorch") for i in range(8)]
    with httpx.Client(base_url=own_server.url, timeout=10) as client:
        sockets = [open_upload(own_server.url, body, ctype) for body, ctype in uploads]
        deadline = time.monotonic() + 2
        while in_flight(client, "/classify") < len(sockets) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_flight(client, "/classify") >= len(sockets), "the uploads never showed as in progress"
    # SIGTERM to `bentoml serve` itself, as docker stop and Kubernetes do (PID 1); it stops every
    # worker at once, and the runners stay until the front has drained (runners/drain.py).
    os.kill(own_server.process.pid, signal.SIGTERM)
    time.sleep(0.3)
    # All four at once, so that they need the runners at the same time: one pooled connection per
    # runner could serve them one after another, and hide the defect.
    with ThreadPoolExecutor(len(sockets)) as pool:
        for sock, (body, _) in zip(sockets, uploads, strict=True):
            pool.submit(sock.sendall, body[len(body) // 2 :])
        results = list(pool.map(read_response, sockets))
    for sock in sockets:
        sock.close()
    assert [status for status, _ in results] == [200] * len(sockets), results
    own_server.process.wait(30)
