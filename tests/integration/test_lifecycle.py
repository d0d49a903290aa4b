"""A second server (pytorch batching off, a 3 s deadline), for what the shared one cannot show: two
servers sharing one Redis, which runner API a route really calls, corrupt models in the store, the
deadline against a slow client, a served model deleted by hand, and a graceful shutdown with a request
provably in flight. The shutdown test stops this server, so it runs last."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from PIL import Image

from fastinfer.measure import photos
from tests.servers import NO_CACHE, home_over, serve, service_pids

TIMEOUT_S = 3
CORRUPT = "resnet50-openvino-int8"
# Stored by an older build (no sha256 recorded) and cut short since: only loading it can tell.
UNRECORDED = "resnet50-onnx-int8-dynamic"
DELETED = "resnet50-onnx"  # deleted by hand while served


def cut_short(home, name: str, file: str) -> None:
    version = (home / "models" / name / "latest").read_text().strip()
    weights = home / "models" / name / version / file
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])


def runners_settled(url: str) -> bool:
    """Every runner has loaded its model or failed to (two cannot: /readyz stays 503 here)."""
    answer = httpx.get(f"{url}/backends", timeout=10)
    if answer.status_code != 200:  # the front itself still starting
        return False
    return all(b["available"] or "does not answer" not in b["reason"] for b in answer.json()["backends"])


@pytest.fixture(scope="module")
def own_home(built_models, bentoml_home, tmp_path_factory):
    # Its own BENTOML_HOME over the same model store: its files (metrics, tuned file) apart from the shared server's.
    # Two models in it are broken (a failed copy, a full disk): openvino-int8's weights file is cut
    # short, and so is onnx-int8-dynamic's model, stored without the sha256 that would tell. The onnx
    # model is a copy too: a test deletes it by hand.
    home = home_over(tmp_path_factory.mktemp("lifecycle") / "home", bentoml_home, copy=(CORRUPT, UNRECORDED, DELETED))
    cut_short(home, CORRUPT, "model.bin")
    cut_short(home, UNRECORDED, "model.onnx")
    (info,) = (home / "models" / UNRECORDED).glob("*/model.yaml")
    meta = yaml.safe_load(info.read_text())
    del meta["metadata"]["files"]
    info.write_text(yaml.safe_dump(meta, sort_keys=False))
    return home


@pytest.fixture(scope="module")
def own_server(own_home, redis_server, tmp_path_factory):
    env = {
        "REDIS_URL": redis_server.url,
        "FASTINFER_BATCHING_PYTORCH": "false",
        "FASTINFER_TIMEOUT_S": str(TIMEOUT_S),
        # The shared server runs openvino at `auto` (BF16 where the CPU has it): test_another_precision_*.
        "FASTINFER_OPENVINO_PRECISION": "f32",
    }
    with serve(tmp_path_factory.mktemp("serve-lifecycle"), env, home=own_home, ready=runners_settled) as srv:
        yield srv


def test_corrupt_models_are_unavailable_keep_the_server_not_ready_and_the_rest_serves(own_server, own_home) -> None:
    """README: ready means every runner loaded its model. The 503s say why, without the store's path
    (ONNX Runtime names the file it failed on); the server's log keeps the whole message."""
    files = {"image": ("p.jpg", photos.photo_jpeg("astronaut.png", width=301), "image/jpeg")}
    with httpx.Client(base_url=own_server.url, timeout=60) as client:
        # First /compare (before any request learnt of the failure): every other backend, this one unavailable.
        compared = client.post("/compare", files=files)
        assert compared.status_code == 200, compared.text
        assert "openvino-int8" in compared.json()["summary"]["unavailable"]
        assert {r["backend"] for r in compared.json()["results"]} >= {"openvino", "onnx-int8", "pytorch"}
        assert client.get("/readyz").status_code == 503
        said = {}
        for backend in ("openvino-int8", "onnx-int8-dynamic"):
            broken = client.post("/classify", data={"backend": backend}, files=files)
            assert broken.status_code == 503 and broken.json()["error"]["code"] == "backend_unavailable", broken.text
            said[backend] = broken.json()["error"]["message"]
        info = {b["name"]: b for b in client.get("/backends").json()["backends"]}
        reasons = {name: b["reason"] for name, b in info.items()}
        for backend in ("openvino", "onnx-int8", "pytorch"):  # the same runtime, another model, another runtime
            ok = client.post("/classify", data={"backend": backend}, files=files)
            assert ok.status_code == 200 and ok.json()["backend"] == backend, ok.text
            assert info[backend]["available"] is True
    assert info["openvino-int8"]["available"] is False
    assert "openvino-int8 could not be loaded" in said["openvino-int8"]
    assert "could not be loaded" in reasons["openvino-int8"]
    # Refused on its recorded sha256, before the runtime reads it; with the command that rebuilds it.
    assert "is corrupt: model.bin is " in said["openvino-int8"], said
    assert "rebuild it: python -m build_models --only openvino-int8 --weights random" in said["openvino-int8"]
    # No record: the runtime's own error, the file named by the model's tag instead of its path.
    assert f"Load model from {UNRECORDED}:" in said["onnx-int8-dynamic"], said
    for text in [*said.values(), reasons["openvino-int8"], reasons["onnx-int8-dynamic"]]:
        assert str(own_home) not in text and "/tmp/" not in text and "/models/" not in text, text
    assert f"{own_home}/models/{UNRECORDED}/" in own_server.log.read_text()  # the operator's copy


def test_two_servers_share_one_redis(client, own_server) -> None:
    data = photos.photo_jpeg("rocket.jpg", width=357, quality=81)  # bytes no other test sends
    first = client.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")})
    with httpx.Client(base_url=own_server.url, timeout=60) as other:
        second = other.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")})
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.json()["cached"] is False
    assert second.json()["cached"] is True  # computed by the shared server, served by this one


def test_another_precision_never_serves_the_other_servers_answer(client, own_server) -> None:
    """The same stored openvino model at `auto` (the shared server) and at f32 (this one), on one Redis: an
    answer is shared only where both engines compute at the same precision. On a CPU with BF16 they differ
    and each computes its own; on one without, `auto` is f32 and they share."""
    data = photos.photo_jpeg("rocket.jpg", width=359, quality=82)  # bytes no other test sends
    files = {"image": ("p.jpg", data, "image/jpeg")}
    first = client.post("/classify", data={"backend": "openvino"}, files=files).json()
    with httpx.Client(base_url=own_server.url, timeout=60) as other:
        second = other.post("/classify", data={"backend": "openvino"}, files=files).json()
        described = {b["name"]: b for b in other.get("/backends").json()["backends"]}["openvino"]["runs_on"]
    assert first["model"] == second["model"] and first["cached"] is False
    assert " on CPU at f32; CPU instructions " in second["engine"] and described["engine"] == second["engine"]
    if first["engine"] != second["engine"]:  # BF16 here: computed again, at its own precision
        assert " at bf16; " in first["engine"]
        assert second["cached"] is False and second["timings_ms"]["inference"] > 0
    else:
        assert second["cached"] is True


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


def test_work_answered_504_is_dropped_by_the_runner(own_server) -> None:
    """More pytorch work than the 3 s deadline allows: past it, 504, and the runner computes no more than what
    was answered 200 and the runs under way at the deadlines (two at most: each deadline runs from its request's
    arrival, spread over less than one run of 32 images); the rest is dropped (``expired_images``, or cancelled)."""
    from concurrent.futures import ThreadPoolExecutor

    # Small photos (their decoding is nearly free, so every request reaches the runner at once), 32 a
    # request: ~400 images of pytorch queue behind one another, far more than 3 s of work. Each a width of its
    # own, made from the sample photos decoded and shrunk once (photo_jpeg decodes its source on every call).
    shrunk = [img.resize((160, round(img.height * 160 / img.width))) for img in map(photos.load, photos.PHOTOS)]

    def small(i: int, width: int) -> bytes:
        img = shrunk[i % len(shrunk)]
        return photos.encode(img.resize((width, round(img.height * width / img.width)), Image.Resampling.LANCZOS))

    requests = [
        [("images", (f"{i}.jpg", small(i, 64 + r + 2 * i), "image/jpeg")) for i in range(32)] for r in range(12)
    ]
    with httpx.Client(base_url=own_server.url, timeout=60) as client:

        def computed() -> tuple[int, int]:
            runs_on = {b["name"]: b for b in client.get("/backends").json()["backends"]}["pytorch"]["runs_on"]
            return sum(int(n) * c for n, c in runs_on["batch_sizes_seen"].items()), runs_on["expired_images"]

        before, expired_before = computed()

        def send(files):
            return client.post("/classify/batch", data={"backend": "pytorch"}, files=files, headers=NO_CACHE)

        with ThreadPoolExecutor(len(requests)) as pool:
            statuses = [answer.status_code for answer in pool.map(send, requests)]
        assert 504 in statuses and set(statuses) <= {200, 504}, statuses
        settled, last = time.monotonic(), computed()
        while time.monotonic() - settled < 3:  # until the runner has been idle for 3 s
            time.sleep(0.5)
            if (now := computed()) != last:
                settled, last = time.monotonic(), now
        images, expired = last[0] - before, last[1] - expired_before
    sent, answered = sum(len(files) for files in requests), statuses.count(200)
    assert images <= 32 * (answered + 2) and images + expired <= sent, (images, expired, answered, sent)


def test_a_pinned_version_deleted_by_hand_is_a_503_naming_it(own_server, own_home) -> None:
    with httpx.Client(base_url=own_server.url, timeout=60, headers=NO_CACHE) as client:
        tag = {x["name"]: x for x in client.get("/backends").json()["backends"]}["onnx"]["model"]
        env = {**os.environ, "BENTOML_HOME": str(own_home)}
        bentoml_cli = Path(sys.executable).parent / "bentoml"
        subprocess.run([str(bentoml_cli), "models", "delete", tag, "-y"], env=env, check=True, capture_output=True)
        for pid in service_pids(own_server, "runner-onnx"):
            os.kill(pid, signal.SIGKILL)
        photo = {"image": ("p.jpg", photos.photo_jpeg("camera.png", width=301, quality=83), "image/jpeg")}
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline:  # until the runner is back and has failed to load it
            answer = client.post("/classify", data={"backend": "onnx"}, files=photo)
            if answer.status_code == 503 and tag in answer.json()["error"]["message"]:
                break
            time.sleep(0.25)
        assert answer is not None and answer.status_code == 503, answer.text if answer else None
        message = answer.json()["error"]["message"]
        assert tag in message and "no longer in the model store" in message, message
        assert str(own_home) not in message
        # Other backends still answer.
        ok = client.post("/classify", data={"backend": "onnx-int8"}, files=photo)
        assert ok.status_code == 200, ok.text


def in_flight(client: httpx.Client, route: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        ours = f'endpoint="{route}"' in line and 'service_name="fastinfer"' in line
        if line.startswith("bentoml_service_request_in_progress{") and ours:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_graceful_shutdown_finishes_every_request_in_flight(own_server) -> None:
    """Eight requests to one runner are half-uploaded when SIGTERM arrives, and the server says all eight are in
    progress: in flight by construction, not by timing. Every one must still be answered (runners/drain.py)."""
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
