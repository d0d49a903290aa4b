"""Two servers on one BENTOML_HOME whose model store is shared by a symlink (as README allows): neither blanks
the other's /metrics, and a build on the store's own home keeps the models a running server pinned, even after
that server's supervisor is killed while its workers go on serving."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import httpx
import psutil

from fastinfer.catalog import store
from fastinfer.measure import photos
from tests.servers import home_over, serve, serving

REQUESTS = 'fastinfer_requests_total{backend="onnx",route="/classify",status="200"}'


def _counted(url: str) -> bool:
    return REQUESTS in httpx.get(f"{url}/metrics", timeout=10).text


def test_two_servers_on_one_home_keep_their_metrics_and_pins(built_models, bentoml_home, tmp_path, monkeypatch):
    home, env = home_over(tmp_path / "home", bentoml_home), {"FASTINFER_CACHE": "memory", **serving("onnx")}
    with serve(tmp_path, env, home=home, name="first") as first:
        data = photos.photo_jpeg(width=320, quality=81)
        answer = httpx.post(f"{first.url}/classify", data={"backend": "onnx"}, files={"image": ("a.jpg", data)})
        assert answer.status_code == 200, answer.text
        assert _counted(first.url)

        with serve(tmp_path, env, home=home, name="second") as second:
            assert _counted(first.url), "the second server's start must not blank the first one's metrics"
            assert not _counted(second.url)

            monkeypatch.setenv("BENTOML_HOME", str(bentoml_home))  # a build on the store's own home
            served = answer.json()["model"]
            assert served in _pinned_by(first.process.pid) and served in _pinned_by(second.process.pid)
        assert not _pinned_by(second.process.pid), "a server that stopped keeps nothing"
        workers = _descendants(first.process.pid)
        assert workers
        os.kill(first.process.pid, signal.SIGKILL)  # the supervisor only: its workers serve on, unsupervised
        first.process.wait()
        again = httpx.post(f"{first.url}/classify", data={"backend": "onnx"}, files={"image": ("b.jpg", data)})
        assert again.status_code == 200, again.text
        assert served in _pinned_by(first.process.pid), "its orphaned workers still serve what it pinned"
        # Not in the supervisor's process group: gone with it only when it stops them (or, should the test
        # fail before this, when serve's stop finds them by their mark).
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _pinned_by(first.process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pinned_by(first.process.pid), "once its last process is gone, nothing of it is pinned"


def _pinned_by(supervisor: int) -> set[str]:
    """What a build sees pinned by the server whose supervisor had this pid (store.in_use's view: a pin
    file that no live process holds is removed by looking)."""
    store.in_use()
    return {tag for path in store.models_folder().glob(f"{store.PIN_PREFIX}{supervisor}-*.json")
            for tag in json.loads(path.read_text())}  # fmt: skip


def _descendants(root: int) -> list[int]:
    """Every process under ``root`` now."""
    return [process.pid for process in psutil.Process(root).children(recursive=True)]
