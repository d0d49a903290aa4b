"""A full disk under BENTOML_HOME (fastinfer/serving/disk.py): metric files that would SIGBUS the process get
their disk blocks up front, fall back to memory when there are none, and come back; /readyz says why.

The cause itself is shown on a real full filesystem (a tmpfs, mounted as root): prometheus_client as
BentoML runs it dies by SIGBUS there, and with the guard it keeps counting.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.mmap_dict import MmapedDict

from fastinfer.front.http import FrontMiddleware
from fastinfer.serving import disk
from fastinfer.serving.disk import DiskHealth, GuardedMmapedDict, remove_stale_files
from tests.asgi import request
from tests.full_disk import small_filesystem

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def health(monkeypatch: pytest.MonkeyPatch) -> DiskHealth:
    fresh = DiskHealth(0, list)
    monkeypatch.setattr(disk, "HEALTH", fresh)
    return fresh


@pytest.fixture
def no_space(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """While ``full[0]``, giving a file blocks fails as on a full disk."""
    full = [True]
    real = disk._allocate

    def allocate(fd: int, size: int) -> None:
        if full[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, size)

    monkeypatch.setattr(disk, "_allocate", allocate)
    return full


def values_in(path: Path) -> dict[str, float]:
    return {key: value for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path))}


def test_a_metric_file_gets_all_its_blocks_before_it_is_mapped(tmp_path: Path, health: DiskHealth) -> None:
    path = tmp_path / "counter_1.db"
    metrics = GuardedMmapedDict(str(path))
    metrics.write_value("a", 1.0, 0.0)
    assert os.stat(path).st_blocks * 512 >= os.stat(path).st_size  # not sparse: no page left to fault
    for i in range(3000):  # grown several times over
        metrics.write_value(f"key-{i:04d}", float(i), 0.0)
    size = os.stat(path).st_size
    assert size > 65536 and os.stat(path).st_blocks * 512 >= size
    metrics.close()
    assert values_in(path)["key-2999"] == 2999.0
    assert health.reason() is None


def test_no_blocks_for_a_new_file_keeps_the_values_in_memory_and_says_why(
    tmp_path: Path, health: DiskHealth, no_space: list[bool], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "counter_2.db"
    with caplog.at_level("ERROR", logger="fastinfer.disk"):
        metrics = GuardedMmapedDict(str(path))
        second = GuardedMmapedDict(str(tmp_path / "histogram_2.db"))
    assert not path.exists()  # an empty file is not left for /metrics to read
    assert len([r for r in caplog.records if r.name == "fastinfer.disk"]) == 1  # said once, not per file
    for i in range(3000):
        metrics.write_value(f"key-{i:04d}", float(i), 0.0)
    second.write_value("h", 2.0, 0.0)
    assert metrics.read_value("key-2999") == (2999.0, 0.0)
    reason = health.reason()
    assert reason is not None and "full" in reason
    assert str(tmp_path) not in reason  # told to clients: no server paths

    no_space[0] = False  # space is back: the next write after the retry delay goes to the file again
    metrics._retry_at = second._retry_at = 0.0
    metrics.write_value("key-0000", 10.0, 0.0)
    assert health.reason() is not None  # one file is still in memory
    second.write_value("h", 3.0, 0.0)
    assert health.reason() is None
    metrics.close()
    second.close()
    values = values_in(path)
    assert len(values) == 3000 and values["key-0000"] == 10.0 and values["key-2999"] == 2999.0
    assert values_in(tmp_path / "histogram_2.db") == {"h": 3.0}


def test_no_blocks_to_grow_keeps_the_file_as_it_was_and_counts_on_in_memory(
    tmp_path: Path, health: DiskHealth, no_space: list[bool]
) -> None:
    no_space[0] = False
    path = tmp_path / "counter_3.db"
    metrics = GuardedMmapedDict(str(path))
    metrics.write_value("early", 1.0, 0.0)
    no_space[0] = True
    for i in range(3000):  # needs more than the first 64 KB
        metrics.write_value(f"key-{i:04d}", float(i), 0.0)
    metrics.write_value("early", 5.0, 0.0)
    assert metrics.read_value("early") == (5.0, 0.0) and metrics.read_value("key-2999") == (2999.0, 0.0)
    assert health.reason() is not None
    stale = values_in(path)  # consistent, as it was when the disk filled: /metrics can still read it
    assert "key-2999" not in stale and stale["early"] in (1.0, 5.0)


def test_low_free_space_makes_the_server_not_ready(tmp_path: Path) -> None:
    assert DiskHealth(0, lambda: [str(tmp_path)]).reason() is None
    low = DiskHealth(2**62, lambda: [str(tmp_path)]).reason()
    assert low is not None and "FASTINFER_MIN_FREE_DISK_MB" in low and str(tmp_path) not in low
    assert DiskHealth(2**62, lambda: [str(tmp_path / "missing")]).reason() is None


def test_stale_files_of_dead_processes_that_count_nothing_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    counts = GuardedMmapedDict(str(tmp_path / f"counter_{pid}.db"))
    counts.write_value("requests", 3.0, 0.0)
    counts.close()
    GuardedMmapedDict(str(tmp_path / f"histogram_{pid}.db")).close()  # opened, nothing recorded
    live = GuardedMmapedDict(str(tmp_path / f"gauge_livesum_{pid}.db"))
    live.write_value("in_flight", 2.0, 0.0)
    live.close()
    (tmp_path / f"gauge_all_{pid}.db").write_bytes(b"")  # created, never sized (killed at once)
    mine = GuardedMmapedDict(str(tmp_path / f"histogram_{os.getpid()}.db"))
    mine.close()
    (tmp_path / "unrelated.txt").write_text("x")

    assert remove_stale_files(str(tmp_path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{pid}.db", f"histogram_{os.getpid()}.db", "unrelated.txt"]
    )


# /readyz and the front's answers while the disk is full (fastinfer/front/http.py)


async def _ok(scope: dict, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _middleware(degraded: Any) -> FrontMiddleware:
    return FrontMiddleware(
        _ok,
        max_bytes=10_000,
        max_concurrency=4,
        timeout_s=5,
        route_backends={},
        max_uploads=4,
        body_idle_s=5,
        degraded=degraded,
    )


def test_readyz_answers_503_with_the_reason_while_degraded() -> None:
    reason: list[str | None] = ["the disk under BENTOML_HOME is full"]
    middleware = _middleware(lambda: reason[0])
    answer = request(middleware, "GET", "/readyz")
    assert answer.status_code == 503
    assert answer.json() == {
        "error": {"code": "degraded", "message": "Not ready: the disk under BENTOML_HOME is full."}
    }
    assert request(middleware, "GET", "/livez").status_code == 200  # alive: nothing to restart
    reason[0] = None
    assert request(middleware, "GET", "/readyz").status_code == 200


def test_a_request_that_needs_the_full_disk_gets_a_clear_503(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastinfer.front import http

    def no_space() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(http, "MEMORY_FOR_BODIES", 0)  # every body goes to a temporary file
    monkeypatch.setattr(http, "TemporaryFile", no_space)
    answer = request(_middleware(None), "POST", "/classify", content=b"x" * 2000)
    assert answer.status_code == 503
    assert "disk is full" in answer.json()["error"]["message"]


# The cause, on a real full filesystem

CHILD = """
import json, os, sys
from pathlib import Path
directory, guarded = sys.argv[1], sys.argv[2] == "guard"
os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # as bentoml serve sets it, before prometheus_client loads
if guarded:
    from fastinfer.serving import disk
    health = disk.guard_metric_files(0)
    disk.RETRY_S = 0.0
from prometheus_client import Counter
from tests.full_disk import fill

requests = Counter("requests", "Requests", ["route"])
requests.labels(route="/livez").inc()  # the first page, written while there was room
filler = fill(Path(directory))
for i in range(2000):  # new labels: new pages of the sparse file
    requests.labels(route=f"/route-{i}").inc()
result = {"reason": health.reason(), "value": requests.labels(route="/route-1999")._value.get()}
filler.unlink()
requests.labels(route="/livez").inc()  # space is back: written to the file again
result["back"] = health.reason()
result["files"] = sorted(os.listdir(directory))
print(json.dumps(result))
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["prometheus_client as is", "guarded"])
def test_a_full_disk_kills_a_metric_writer_by_sigbus_unless_guarded(tmp_path: Path, guarded: bool) -> None:
    with small_filesystem(tmp_path / "prometheus", 1) as directory:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(directory), "guard" if guarded else "plain"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if not guarded:  # the review's crash loop: no exception, no log line, just the signal
            assert done.returncode == -signal.SIGBUS, done.stdout + done.stderr
            return
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        assert result["value"] == 1.0
        assert "full" in result["reason"]
        assert result["back"] is None
        assert len(result["files"]) == 1 and result["files"][0].startswith("counter_")  # no empty file left
        files = [f for f in os.listdir(directory) if f.endswith(".db")]
        assert len(files) == 1
        assert len(values_in(directory / files[0])) == 2001  # every value, now on disk
