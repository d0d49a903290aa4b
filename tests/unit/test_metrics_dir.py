"""Each server's Prometheus files in a folder of its own (fastinfer/serving/disk.py own_metrics_dir and
claim_metrics_dir): what BentoML's serve prepares is that folder, and a server's start removes only the
folders of servers that are gone: another server on the same home keeps its `fastinfer_requests_total`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from bentoml._internal.configuration.containers import BentoMLContainer

from fastinfer.common import leases
from fastinfer.serving import disk


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    yield tmp_path
    BentoMLContainer.prometheus_multiproc_dir.reset()
    monkeypatch.setattr(disk, "_own_dir", None)


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_bentoml_prepares_this_servers_own_folder(home) -> None:
    """The assumption: BentoML's serve prepares (and empties) the folder its provider names, read when called."""
    from bentoml.serving import ensure_prometheus_dir

    disk.own_metrics_dir()
    own = home / disk.METRICS_ROOT / str(os.getpid())
    assert ensure_prometheus_dir() == str(own) and own.is_dir(), "BentoML no longer reads this provider"


def test_a_start_removes_only_the_folders_of_servers_that_are_gone(home) -> None:
    root = home / disk.METRICS_ROOT
    gone, orphaned = root / str(_dead_pid()), root / str(_dead_pid())
    for folder in (gone, orphaned):
        folder.mkdir(parents=True)
        (folder / "counter_1.db").write_bytes(b"x")
    (orphaned / disk.LEASE).write_text("")
    worker = subprocess.Popen(  # a worker whose supervisor died still holds its server's lease
        [sys.executable, "-c", "import os, sys, time; from pathlib import Path; from fastinfer.common import leases; "
         "assert leases.hold(Path(sys.argv[1]), os.getppid()); print('held', flush=True); time.sleep(60)",
         str(orphaned / disk.LEASE)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    strays = [root / "99999999999999999999", root / "²", root / "notes"]
    for folder in strays:
        folder.mkdir()
    try:
        assert worker.stdout.readline() == b"held\n"
        disk.own_metrics_dir()
        own = root / str(os.getpid())
        own.mkdir()  # as BentoML's serve makes it
        disk.claim_metrics_dir()
        assert not gone.exists(), "a gone server's folder is removed"
        assert orphaned.is_dir(), "one whose workers still run is kept"
        assert all(folder.is_dir() for folder in strays), "what no server named is left alone, and no crash"
        assert leases.held(own / disk.LEASE)
    finally:
        worker.kill()
        worker.wait()
        leases.release(root / str(os.getpid()) / disk.LEASE)
    time.sleep(0.1)
    assert not leases.held(orphaned / disk.LEASE)
