"""Pins live with the store they pin and stay in use while any process of their server lives
(fastinfer.common.leases, fastinfer.catalog.store.in_use). Real processes: a supervisor that records its
pins and starts a worker, as ``bentoml serve`` does; the supervisor is then killed with SIGKILL. A build on
a home that shares the store by a symlink must see them, and must not delete versions orphaned workers serve."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastinfer.catalog import store
from fastinfer.common import leases

TAG = "resnet50-onnx:aaaa1111"
SUPERVISOR = f"""
TAG = {TAG!r}
import os, subprocess, sys, time
from fastinfer.catalog import store
store.record_pins({{"resnet50-onnx": TAG}})
worker = subprocess.Popen([sys.executable, "-c", "from fastinfer.catalog import store; import time; "
                           "store.hold_pins(); print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
assert worker.stdout.readline() == b"held\\n"
print(worker.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture()
def shared_store(tmp_path: Path) -> tuple[Path, Path]:
    """The store's own home, and a server's home whose ``models`` is a symlink to it."""
    store_home, server_home = tmp_path / "store", tmp_path / "server"
    (store_home / "models").mkdir(parents=True)
    server_home.mkdir()
    (server_home / "models").symlink_to(store_home / "models")
    return store_home, server_home


def _wait_until(condition, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


LATE_SUPERVISOR = f"""
import subprocess, sys, time
from fastinfer.catalog import store
store.record_pins({{"resnet50-onnx": {TAG!r}}})
worker = subprocess.Popen([sys.executable, "-c", "import sys, time; from fastinfer.catalog import store; "
                           "sys.stdin.readline(); store.hold_pins(); open(sys.argv[1], 'w').close(); time.sleep(600)",
                           sys.argv[1]], stdin=subprocess.PIPE)
print(worker.pid, flush=True)
time.sleep(600)
"""


def test_a_worker_that_starts_after_its_server_stopped_does_not_bring_the_pins_back(tmp_path, monkeypatch) -> None:
    """A worker spawned as its supervisor dies reaches its start-up seconds later: it must not take the lease
    that no one holds, or a build after that keeps the versions of a server long gone."""
    env = {**os.environ, "BENTOML_HOME": str(tmp_path), "PYTHONPATH": str(Path.cwd())}
    env.pop(store.PIN_FILE_ENV, None)
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    asked = tmp_path / "asked"
    supervisor = subprocess.Popen([sys.executable, "-c", LATE_SUPERVISOR, str(asked)], env=env, stdout=subprocess.PIPE)
    worker = int(supervisor.stdout.readline())
    try:
        (pin_file,) = (tmp_path / "models").glob(f"{store.PIN_PREFIX}*.json")
        supervisor.kill()
        supervisor.wait()
        _wait_until(lambda: not leases.held(pin_file), "the supervisor held it alone")
        with open(f"/proc/{worker}/fd/0", "w") as stdin:  # the worker starts now
            stdin.write("go\n")
        _wait_until(asked.exists, "the worker asked for the lease")
        assert store.in_use() == {}, "a worker of a server that is gone holds nothing"
    finally:
        supervisor.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def test_pins_of_a_server_on_a_symlinked_home_are_seen_until_its_last_worker_exits(shared_store, monkeypatch) -> None:
    store_home, server_home = shared_store
    env = {**os.environ, "BENTOML_HOME": str(server_home), "PYTHONPATH": str(Path.cwd())}
    env.pop(store.PIN_FILE_ENV, None)
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], env=env, stdout=subprocess.PIPE)
    worker = 0
    try:
        worker = int(supervisor.stdout.readline())
        monkeypatch.setenv("BENTOML_HOME", str(store_home))  # a build on the store's own home
        assert store.in_use() == {TAG: supervisor.pid}
        supervisor.kill()
        supervisor.wait()
        assert store.in_use() == {TAG: supervisor.pid}, "the orphaned worker still serves it"
        os.kill(worker, signal.SIGKILL)
        _wait_until(lambda: not store.in_use(), "a pin no live process holds is not in use")
        assert not list((store_home / "models").glob(f"{store.PIN_PREFIX}*")), "and its file is removed"
    finally:
        supervisor.kill()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


def test_a_pin_file_is_held_from_the_moment_it_exists(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    monkeypatch.setenv(store.PIN_FILE_ENV, "")  # record_pins sets it for the workers: restored after
    path = store.record_pins(dict(onnx=TAG))
    try:
        assert path.parent == (tmp_path / "models").resolve()
        assert json.loads(path.read_text()) == [TAG]
        assert os.environ[store.PIN_FILE_ENV] == str(path)
        assert store.in_use() == {TAG: os.getpid()}
        assert not list(path.parent.glob("*.draft")), "no draft left beside it"
    finally:
        leases.release(path)
    assert store.in_use() == {} and not path.exists()


def test_a_lease_that_cannot_be_asked_is_never_taken_for_dead(tmp_path) -> None:
    lease = tmp_path / "lease"
    assert not leases.held(lease), "gone: not held"
    lease.write_text("")
    assert not leases.held(lease), "there, but no process holds it"
    lease.unlink()
    lease.mkdir()  # cannot be opened to ask (EISDIR; as another user's 0600 file would be EACCES)
    assert leases.held(lease)


def test_each_server_has_a_pin_file_of_its_own_and_a_killed_writers_draft_is_swept(tmp_path, monkeypatch) -> None:
    """Containers sharing one store may each run their server as pid 1: each pin file has a name of its own.
    A draft left by a process killed while writing one does not stay in the store for good."""
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    monkeypatch.setenv(store.PIN_FILE_ENV, "")
    first, second = store.record_pins({"a": "a:1"}), store.record_pins({"b": "b:2"})
    stale, fresh = first.parent / ".x.json.0011.draft", first.parent / ".y.json.0022.draft"
    stale.write_text(""), fresh.write_text("")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    try:
        assert first != second and store.in_use() == {"a:1": os.getpid(), "b:2": os.getpid()}
        assert json.loads(first.read_text()) == ["a:1"]
        assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, second.name, fresh.name])
    finally:
        leases.release(first)
        leases.release(second)
