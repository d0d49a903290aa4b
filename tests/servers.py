"""Servers for the integration and browser tests: a real ``bentoml serve`` of service:FastInfer on a
free port over the test model store, a real redis-server, and a fake Groq on loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from load_tests.service import ROOT, Server, free_port, stop_server
from load_tests.service import start_server as _start
from tests.fake_groq import FakeGroq

SERVER_ENV = {
    # The tests' requests that name no backend were written for onnx, and some servers here serve a store
    # with a model corrupted on purpose; `auto` is tested on its own (tests/unit/test_choice.py,
    # tests/integration/test_tune.py).
    "FASTINFER_DEFAULT_BACKEND": "onnx",
    "FASTINFER_MAX_BYTES": str(5_000_000),
    "FASTINFER_MAX_PIXELS": str(40_000_000),
    "FASTINFER_MAX_CONCURRENCY": "16",
    "FASTINFER_CACHE": "redis",
    # The /analyze guard is tested on locked_server; on the shared server it must not refuse a test.
    "FASTINFER_ANALYZE_PER_MINUTE": "1000",
    "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "1000",
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
            pytest.fail("redis-server is not installed (apt-get install redis-server; make test does)")
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


def start_server(
    home: Path,
    log: Path,
    extra_env: dict[str, str] | None = None,
    timeout: float = 240,
    target: str = "service:FastInfer",
    cwd: Path = ROOT,
    ready: Callable[[str], bool] | None = None,
) -> Server:
    """A test server: the test limits (SERVER_ENV) plus ``extra_env``."""
    return _start(home, log, {**SERVER_ENV, **(extra_env or {})}, timeout, target, cwd, ready)


def service_pids(server: Server, service_name: str) -> list[int]:
    """The processes under ``server`` that run ``service_name``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue

    def under_server(pid: int) -> bool:
        while pid > 1:
            if pid == server.process.pid:
                return True
            pid = parents.get(pid, 0)
        return False

    found = []
    for pid in parents:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        named = b"--service-name" in args[:-1] and args[args.index(b"--service-name") + 1] == service_name.encode()
        if named and under_server(pid):
            found.append(pid)
    return found


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


API_KEYS = ("test-key-one-0123456789abcdef", "test-key-two-fedcba9876543210")
ANALYZE_LIMITS = {"FASTINFER_ANALYZE_PER_MINUTE": "2", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "3"}


@pytest.fixture(scope="session")
def locked_server(built_models, bentoml_home: Path, tmp_path_factory, fake_groq: FakeGroq) -> Server:
    """A server as a public deploy runs it: API keys on, /analyze limited to 2 per client and 3 in all
    per minute (against the fake Groq), the keys given as a secret file like Compose's. Memory cache."""
    work = tmp_path_factory.mktemp("locked")
    # Its own BENTOML_HOME over the same models: its files (metrics, tuned file) apart from the shared server's.
    home = work / "home"
    home.mkdir()
    (home / "models").symlink_to(bentoml_home / "models")
    keys = work / "api_keys"
    keys.write_text("\n".join(API_KEYS) + "\n")
    env = {
        "FASTINFER_CACHE": "memory",
        "FASTINFER_API_KEYS_FILE": str(keys),
        "GROQ_API_KEY": GROQ_KEY,
        "FASTINFER_GROQ_BASE_URL": fake_groq.url,
        **ANALYZE_LIMITS,
    }
    srv = start_server(home, work / "serve.log", env)
    yield srv
    stop_server(srv)


@pytest.fixture()
def client(server: Server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
