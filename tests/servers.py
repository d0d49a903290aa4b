"""Servers for the integration and browser tests: a real ``bentoml serve`` of service:FastInfer on a
free port over the test model store, a real redis-server, and a fake Groq on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.fake_groq import FakeGroq

ROOT = Path(__file__).resolve().parents[1]
SERVER_ENV = {
    "FASTINFER_MAX_BYTES": str(5_000_000),
    "FASTINFER_MAX_PIXELS": str(40_000_000),
    "FASTINFER_MAX_CONCURRENCY": "16",
    "FASTINFER_CACHE": "redis",
}
NO_CACHE = {"Cache-Control": "no-cache"}


class RedisServer:
    """A real redis-server on a free loopback port, with no persistence; can be stopped and restarted."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does)")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def flush(self) -> None:
        import redis

        redis.Redis(port=self.port).flushall()


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    home: Path,
    log: Path,
    extra_env: dict[str, str] | None = None,
    timeout: float = 240,
    target: str = "service:FastInfer",
    cwd: Path = ROOT,
) -> Server:
    """``bentoml serve TARGET`` (the source tree by default, or a built bento's tag)."""
    port = free_port()
    env = {**os.environ, "BENTOML_HOME": str(home), **SERVER_ENV, **(extra_env or {})}
    bentoml_cli = Path(sys.executable).parent / "bentoml"
    process = subprocess.Popen(
        [str(bentoml_cli), "serve", target, "--host", "127.0.0.1", "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so that stopping it stops its runner processes too
    )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"bentoml serve exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"bentoml serve not ready after {timeout}s:\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    if server.process.poll() is not None:
        return
    os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> RedisServer:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv
    srv.stop()


GROQ_KEY = "test-groq-key-never-logged-7f3a"


@pytest.fixture(scope="session")
def fake_groq() -> FakeGroq:
    with FakeGroq() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _groq_back_to_ok(request) -> None:
    if "fake_groq" in request.fixturenames:
        request.getfixturevalue("fake_groq").mode = "ok"


@pytest.fixture(scope="session")
def server(
    built_models, bentoml_home: Path, tmp_path_factory, redis_server: RedisServer, fake_groq: FakeGroq
) -> Server:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {
        "REDIS_URL": redis_server.url,
        "GROQ_API_KEY": GROQ_KEY,
        "FASTINFER_GROQ_BASE_URL": fake_groq.url,
        "FASTINFER_GROQ_TIMEOUT_S": "2",
    }
    srv = start_server(bentoml_home, log, env)
    yield srv
    stop_server(srv)


@pytest.fixture()
def client(server: Server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
