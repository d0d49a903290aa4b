"""Servers for the integration and browser tests: a real ``bentoml serve`` of service:FastInfer on a
free port over the test model store, a real redis-server, and a fake Groq on loopback."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fastinfer.catalog.backends import BACKENDS
from load_tests.service import Server, free_port, stop_server
from load_tests.service import start_server as _start
from tests.fake_groq import FakeGroq

SERVER_ENV = {
    # The tests' requests that name no backend were written for onnx, and some servers here serve a store
    # with a model corrupted on purpose; `auto` is tested on its own (tests/unit/test_choice.py,
    # tests/integration/test_tune.py).
    "FASTINFER_DEFAULT_BACKEND": "onnx",
    # Every engine in its runner, as the tests of runners (their processes, faults, batching) were written for;
    # the default placement (the default backend's engine in the front worker) is tested on its own
    # (tests/integration/test_tune.py, tests/unit/test_in_front.py).
    "FASTINFER_IN_FRONT": "none",
    "FASTINFER_MAX_BYTES": str(5_000_000),
    "FASTINFER_MAX_PIXELS": str(40_000_000),
    "FASTINFER_MAX_CONCURRENCY": "16",
    "FASTINFER_CACHE": "redis",
    # The /analyze guard is tested on locked_server; on the shared server it must not refuse a test.
    "FASTINFER_ANALYZE_PER_MINUTE": "1000",
    "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "1000",
}
NO_CACHE = {"Cache-Control": "no-cache"}


def serving(*backends: str) -> dict[str, str]:
    """The environment of a server that serves ``backends`` alone (FASTINFER_BACKENDS): no runner process for
    the others, which answer 503 "switched off". Requests that name no backend go to SERVER_ENV's default,
    or, where that one is left out, to the first of ``backends``."""
    env = {"FASTINFER_BACKENDS": ",".join(backends)}
    if SERVER_ENV["FASTINFER_DEFAULT_BACKEND"] not in backends:
        env["FASTINFER_DEFAULT_BACKEND"] = backends[0]
    return env


def wait_for_port(port: int, process: subprocess.Popen) -> None:
    """Return once the redis-server ``process`` takes connections on loopback ``port`` (15 s at most)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        assert process.poll() is None, "redis-server exited"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


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
        wait_for_port(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_server(
    home: Path | None,
    log: Path,
    extra_env: dict[str, str] | None = None,
    base: dict[str, str] = SERVER_ENV,
    **start: Any,
) -> Server:
    """A test server: ``base`` (the test limits) plus ``extra_env``; ``start``: load_tests.service.start_server's
    rest. The caller stops it (stop_server); serve() does that itself."""
    return _start(home, log, {**base, **(extra_env or {})}, **start)


def home_over(home: Path, store: Path, copy: Collection[str] = (), only: Collection[str] | None = None) -> Path:
    """``home`` made a BENTOML_HOME of its own over the models of the home ``store``: its files (metrics,
    tuned file, pins) apart from other servers'. The models folder is linked whole, or, where models are to
    be broken, deleted or rebuilt here, model by model: those in ``copy`` copied, the rest (of ``only``) linked."""
    home.mkdir(parents=True, exist_ok=True)
    if not copy:
        (home / "models").symlink_to(store / "models")
        return home
    (home / "models").mkdir()
    for model in (store / "models").iterdir():
        if model.name in copy:
            shutil.copytree(model, home / "models" / model.name)
        elif only is None or model.name in only:
            (home / "models" / model.name).symlink_to(model)
    return home


@contextlib.contextmanager
def serve(
    work: Path,
    env: dict[str, str] | None = None,
    *,
    home: Path | None = None,
    store: Path | None = None,
    name: str = "serve",
    base: dict[str, str] = SERVER_ENV,
    **start: Any,
) -> Iterator[Server]:
    """The one way the tests run a server: ``bentoml serve`` with ``base`` (the test limits) plus ``env``,
    logging to work/NAME.log, on ``home`` (None: BENTOML_HOME's), or on a home of its own at work/home over
    ``store``'s models; stopped, every process of it, when the block ends. ``start``: as start_server's."""
    if store is not None:
        home = home_over(work / "home", store)
    srv = start_server(home, work / f"{name}.log", env, base, **start)
    try:
        yield srv
    finally:
        stop_server(srv)


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
    env = {
        "REDIS_URL": redis_server.url,
        "GROQ_API_KEY": GROQ_KEY,
        "GROQ_BASE_URL": fake_groq.url,
        "FASTINFER_GROQ_TIMEOUT_S": "2",
    }
    with serve(tmp_path_factory.mktemp("serve"), env, home=bentoml_home) as srv:
        yield srv


API_KEYS = ("test-key-one-0123456789abcdef", "test-key-two-fedcba9876543210")
ANALYZE_LIMITS = {"FASTINFER_ANALYZE_PER_MINUTE": "2", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "3"}
REDIS_PASSWORD = "redis-pw-never-shown-4c1d"
HMAC_KEY = "cache-signing-key-never-shown-0123456789abcdef"
# locked_server's: every backend the API page's examples call (tests/integration/test_api_page.py runs each
# one on it: pytorch, onnx, onnx-int8, openvino, openvino-int8, and CoreML's, whose 503 must say "needs macOS",
# not "switched off"; they start no runner off macOS). onnx-int8-dynamic, which nothing sent to it names, is
# left out: tests/integration/test_access.py checks what a switched-off backend answers behind the key.
LOCKED_OFF = "onnx-int8-dynamic"
LOCKED_BACKENDS = tuple(name for name in BACKENDS if name != LOCKED_OFF)


@pytest.fixture(scope="session")
def locked_redis(tmp_path_factory) -> Iterator[RedisServer]:
    """A redis-server behind REDIS_PASSWORD."""
    srv = RedisServer(tmp_path_factory.mktemp("locked-redis"))
    srv.start()
    with redis.Redis.from_url(srv.url) as admin:
        admin.config_set("requirepass", REDIS_PASSWORD)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def locked_server(
    built_models, bentoml_home: Path, tmp_path_factory, fake_groq: FakeGroq, locked_redis: RedisServer
) -> Server:
    """A server as a public deploy (deploy/k8s) runs it: API keys on, /analyze limited to 2 per client and
    3 in all per minute (against the fake Groq), a Redis behind a password with entries signed; the keys,
    the password and the signing key given as secret files. Its own home over the test models; it serves
    LOCKED_BACKENDS."""
    work = tmp_path_factory.mktemp("locked")
    files = {"api_keys": "\n".join(API_KEYS), "redis-password": REDIS_PASSWORD, "cache-hmac-key": HMAC_KEY}
    for file, value in files.items():
        (work / file).write_text(value + "\n")
    env = {
        "FASTINFER_API_KEYS_FILE": str(work / "api_keys"),
        "REDIS_URL": locked_redis.url,  # no password in it: it comes from the secret file
        "FASTINFER_REDIS_PASSWORD_FILE": str(work / "redis-password"),
        "FASTINFER_CACHE_HMAC_KEY_FILE": str(work / "cache-hmac-key"),
        "GROQ_API_KEY": GROQ_KEY,
        "GROQ_BASE_URL": fake_groq.url,
        **ANALYZE_LIMITS,
        **serving(*LOCKED_BACKENDS),
    }
    with serve(work, env, store=bentoml_home) as srv:
        yield srv


@pytest.fixture()
def client(server: Server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c
