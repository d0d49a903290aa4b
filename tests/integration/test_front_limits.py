"""The front under hostile connections and a full disk, on a real ``bentoml serve`` with API keys on: silent
connections closed at the keep-alive and the cap, a flood of huge keyless headers refused 431 while keyed
clients and probes keep answering, a wedged runner's prompt 503, a full BENTOML_HOME degrading without a
crash loop, and SIGTERM closing idle connections at once. Latency ratios are printed (``pytest -s``), not asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fastinfer.measure import photos
from fastinfer.serving.disk import METRICS_ROOT
from tests.full_disk import fill, small_filesystem
from tests.servers import home_over, serve, service_pids, serving

KEY = "front-limits-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
KEEPALIVE_S = 2
HEADER_TIMEOUT_S = 3
MAX_CONNECTIONS = 150
LIMITS = {
    "FASTINFER_KEEPALIVE_S": str(KEEPALIVE_S),
    "FASTINFER_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "FASTINFER_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "FASTINFER_MIN_FREE_DISK_MB": "1",
}
HOME_MB = 64


class Front:
    def __init__(self, url: str, home: Path, full_disk: str | None, server) -> None:
        self.url = url
        self.address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        self.home = home
        self.full_disk = full_disk  # why a full disk cannot be made here, or None
        self.server = server


@pytest.fixture(scope="module")
def front(built_models, bentoml_home: Path, tmp_path_factory) -> Front:
    """Its own server over the test models, BENTOML_HOME on a small tmpfs where it can be mounted."""
    work = tmp_path_factory.mktemp("front-limits")
    home = work / "home"
    with contextlib.ExitStack() as stack:
        why_not = None
        try:
            stack.enter_context(small_filesystem(home, HOME_MB))
        except pytest.skip.Exception as skipped:
            why_not = str(skipped)
        # One backend, the one every request here names: the front is what these tests are about.
        env = {"FASTINFER_CACHE": "memory", "FASTINFER_API_KEYS": KEY, **LIMITS, **serving("onnx-int8")}
        server = stack.enter_context(serve(work, env, home=home_over(home, bentoml_home)))
        yield Front(server.url, home, why_not, server)


@pytest.fixture()
def keyed(front: Front) -> httpx.Client:
    with httpx.Client(base_url=front.url, timeout=60, headers=AUTH) as client:
        yield client


PHOTO = photos.benchmark_photo()


def classify(client: httpx.Client, **headers: str) -> httpx.Response:
    return client.post("/classify?backend=onnx-int8", content=PHOTO, headers={"Content-Type": "image/jpeg", **headers})


def p50_ms(client: httpx.Client, n: int = 30) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        answer = classify(client)
        assert answer.status_code == 200, answer.text
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def probes_answer(url: str) -> bool:
    return all(httpx.get(f"{url}{path}", timeout=10).status_code == 200 for path in ("/livez", "/readyz"))


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:  # reset
        return True


def test_silent_connections_are_closed_and_keyed_clients_and_probes_keep_answering(front: Front, keyed) -> None:
    classify(keyed)  # the photo in the cache: the p50 is the front's own path
    unloaded = p50_ms(keyed)
    silent = [socket.create_connection(front.address) for _ in range(2 * MAX_CONNECTIONS)]
    try:
        time.sleep(0.5)
        # At the cap, each new connection closed the longest-idle one: at most MAX_CONNECTIONS stay open.
        assert sum(closed_by_server(s) for s in silent) >= MAX_CONNECTIONS - 10
        loaded = p50_ms(keyed)
        assert probes_answer(front.url)
        time.sleep(KEEPALIVE_S + 1.5)
        assert all(closed_by_server(s) for s in silent)
    finally:
        for s in silent:
            s.close()
    print(f"\nkeyed /classify p50 (cache hits): {unloaded:.1f} ms alone, {loaded:.1f} ms beside "
          f"{2 * MAX_CONNECTIONS} silent connections ({loaded / unloaded:.2f}x)")  # fmt: skip
    assert "idle connections closed to make room at the cap" in front.server.log.read_text()


ATTACKER = """
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
pad = b"".join(b"X-Pad-%d: %s\\r\\n" % (i, b"b" * 1000) for i in range(640))
block = b"POST /classify HTTP/1.1\\r\\nHost: x\\r\\n" + pad + b"\\r\\n"
answers, end = {}, time.monotonic() + seconds
while time.monotonic() < end:
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(block)
            status = s.recv(64)[9:12].decode() or "closed"
    except OSError as exc:
        status = type(exc).__name__
    answers[status] = answers.get(status, 0) + 1
print(json.dumps(answers))
"""


def test_a_flood_of_huge_headers_is_refused_cheaply_and_probes_keep_answering(front: Front, keyed) -> None:
    """Four keyless clients sending 640 KB header blocks in a loop, as in the review, each its own process."""
    classify(keyed)
    unloaded = p50_ms(keyed)
    host, port = front.address
    attackers = [
        subprocess.Popen([sys.executable, "-c", ATTACKER, host, str(port), "8"], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    try:
        time.sleep(1.0)
        loaded = p50_ms(keyed)
        assert probes_answer(front.url)
    finally:
        outputs = [a.communicate(timeout=60)[0] for a in attackers]
    answers: dict[str, int] = {}
    for output in outputs:
        for status, n in json.loads(output).items():
            answers[status] = answers.get(status, 0) + n
    print(f"\nkeyed /classify p50 (cache hits): {unloaded:.1f} ms alone, {loaded:.1f} ms beside 4 clients "
          f"sending 640 KB headers ({loaded / unloaded:.2f}x); their answers: {answers}")  # fmt: skip
    assert answers.get("431", 0) > 0
    assert set(answers) <= {"431", "closed", "ConnectionResetError", "BrokenPipeError"}  # never 401, never served


def test_a_wedged_runner_gets_readyz_a_prompt_503_that_names_it(front: Front) -> None:
    """A runner that accepts connections but never answers (SIGSTOP, as a hung engine or a paging host
    would): before, each /readyz hung 35 s (BentoML's outer timeout) and then got a plain-text 500
    "ASGI callable returned without starting response", every probe holding a busy connection."""
    (runner,) = service_pids(front.server, "runner-onnx-int8")
    with httpx.Client(base_url=front.url, timeout=60) as client:
        assert client.get("/readyz").status_code == 200
        os.kill(runner, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answers = [client.get("/readyz") for _ in range(3)]
            seconds = (time.monotonic() - started) / len(answers)
        finally:
            os.kill(runner, signal.SIGCONT)
        for answer in answers:
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "not_ready" and "runner-onnx-int8 did not answer within" in error["message"]
        assert seconds < 3.5, seconds  # within the probe's bound (2 s), not BentoML's 35 s
        deadline = time.monotonic() + 30
        while (ready := client.get("/readyz")).status_code != 200:  # the runner answers again
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.5)


# RFC 9112 6.1: a transfer coding the server does not know (gzip before chunked) SHOULD be answered 501.
# The 400s (Transfer-Encoding: gzip, 101 trailer fields): tests/unit/test_front_limits.py, through FrontProtocol.
GZIP_CHUNKED = b"POST /classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"


def test_a_transfer_coding_the_front_does_not_take_gets_501_in_our_shape(front: Front) -> None:
    with socket.create_connection(front.address, timeout=20) as sock:
        sock.sendall(GZIP_CHUNKED)  # one small read: nothing is left unread to reset the connection
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501"), answer
    assert json.loads(body)["error"]["code"] == "not_implemented", body


def test_a_full_disk_under_bentoml_home_degrades_instead_of_crash_looping(front: Front, keyed) -> None:
    """Runs after the others but the shutdown: it fills the server's BENTOML_HOME, then frees it."""
    if front.full_disk is not None:
        pytest.skip(front.full_disk)
    assert classify(keyed).status_code == 200  # cached from the tests above, or now
    (worker,) = service_pids(front.server, "fastinfer")  # the front worker
    metrics_dir = front.home / METRICS_ROOT / str(front.server.process.pid)  # this server's own (serving/disk.py)
    files_before = len(list(metrics_dir.iterdir()))
    filler = fill(front.home)
    try:
        # New paths are new metric labels (BentoML labels its request metrics with the path): new pages
        # of the front's metric files, which a full disk would answer with SIGBUS.
        for i in range(400):
            answer = keyed.get(f"/no-such-route-{i}")
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "not_found"
        assert httpx.get(f"{front.url}/livez", timeout=10).status_code == 200
        ready = httpx.get(f"{front.url}/readyz", timeout=10)
        assert ready.status_code == 503
        message = ready.json()["error"]["message"]
        assert "disk under BENTOML_HOME is full" in message and "held in memory" in message
        assert str(front.home) not in message
        hit = classify(keyed)
        assert hit.status_code == 200 and hit.json()["cached"] is True
        assert classify(keyed, **{"Cache-Control": "no-cache"}).status_code == 200  # the runner still infers
        assert httpx.get(f"{front.url}/metrics", timeout=10).status_code == 200
        assert service_pids(front.server, "fastinfer") == [worker]  # never restarted
        assert "disk: cannot give" in front.server.log.read_text()
    finally:
        filler.unlink()
    deadline = time.monotonic() + 30
    while httpx.get(f"{front.url}/readyz", timeout=10).status_code != 200:  # each request retries the files
        assert time.monotonic() < deadline, httpx.get(f"{front.url}/readyz", timeout=10).text
        time.sleep(0.5)
    assert "disk: space is back" in front.server.log.read_text()
    assert len(list(metrics_dir.iterdir())) <= files_before + 2  # no pile of dead workers' files


def test_sigterm_closes_idle_connections_and_refuses_new_ones_within_seconds(front: Front) -> None:
    """Stops the server: runs last. Idle keep-alive connections get a FIN at SIGTERM, and once nothing is
    in flight the server is gone in seconds, so a new connection is refused: an abandoned upload must not
    hold the front for BentoML's timeout (35 s) while new connections wait in the listening socket."""
    idle = []
    for _ in range(5):
        sock = socket.create_connection(front.address, timeout=10)
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\n\n"):  # /livez answers "\n"
            chunk = sock.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer
        idle.append(sock)
    with socket.create_connection(front.address, timeout=10) as abandoned:  # half an upload, then gone
        abandoned.sendall(
            b"POST /classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n" + PHOTO[:1000]
        )  # fmt: skip
        time.sleep(0.5)
    started = time.monotonic()
    os.kill(front.server.process.pid, signal.SIGTERM)  # as docker stop does (bentoml serve is PID 1)
    for sock in idle:
        assert sock.recv(4096) == b"", "an idle connection was not closed (or was reset) at SIGTERM"
        sock.close()
    closed_s = time.monotonic() - started
    failures: list[str] = []
    refused_s = None
    while refused_s is None and time.monotonic() - started < 60:
        try:
            with socket.create_connection(front.address, timeout=5) as sock:
                sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.recv(4096)  # answered (still draining), or waits in the listening socket's backlog
        except ConnectionRefusedError:
            refused_s = round(time.monotonic() - started, 2)
        except OSError as exc:  # reset as that socket closes (a moment's window), or the long wait of before
            failures.append(f"{type(exc).__name__} at {time.monotonic() - started:.1f} s")
        time.sleep(0.2)
    print(
        f"\nSIGTERM: idle connections closed after {closed_s:.2f} s, new ones refused after {refused_s} s; {failures}"
    )
    assert refused_s is not None and refused_s < 5, failures
    assert not [f for f in failures if f.startswith("TimeoutError")], failures
    front.server.process.wait(30)
