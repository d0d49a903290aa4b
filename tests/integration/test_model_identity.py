"""Every answer and every cache entry names the model that computed it: across ``onnx`` rebuilt under a running
server, its runner and a front worker killed (SIGKILL) and restarted, and a second server on the new version
over the same Redis, each checked against what its named model computes in this process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from fastinfer.catalog.backends import open_engine
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure import photos
from fastinfer.serving.postprocess import top_k
from fastinfer.serving.preprocess import prepare
from load_tests.service import Server, stop_server
from tests.family_data import build_here
from tests.servers import home_over, serve, service_pids, serving

REBUILT = "resnet50-onnx"
SPEC = PreprocessSpec(resize_size=232, crop_size=224)


def _photo(name: str, width: int) -> bytes:
    return photos.photo_jpeg(name, width=width, quality=83)  # bytes no other test sends


@pytest.fixture(scope="module")
def home(built_models, bentoml_home: Path, tmp_path_factory) -> Path:
    """A store of its own holding the onnx model alone (a copy): a family of one backend, which a rebuild
    with other weights replaces whole (the servers serve onnx alone: the other backends are switched off)."""
    return home_over(tmp_path_factory.mktemp("identity") / "home", bentoml_home, copy=(REBUILT,), only=())


def _other_weights(path: Path) -> Path:
    """A state_dict unlike the test store's seeded init: the rebuilt model answers differently."""
    import torch
    from torchvision.models import resnet50

    torch.manual_seed(12345)
    torch.save(resnet50(weights=None).state_dict(), path)
    return path


def _versions(home: Path) -> list[str]:
    folder = home / "models" / REBUILT
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


@functools.cache
def _engine(home: Path, tag: str) -> Any:
    name, version = tag.split(":")
    return open_engine("onnx", 1, {None: home / "models" / name / version}, cpu_only=True)


def _expected(home: Path, tag: str, data: bytes, k: int = 5) -> list[tuple[int, float]]:
    """What the model stored under ``tag`` answers for ``data``, computed here."""
    logits = _engine(home, tag).run(prepare(data, SPEC, 10**9).pixels[np.newaxis])[0]
    return [(p.index, p.score) for p in top_k(logits, k, [])]


def _answered(body: dict) -> list[tuple[int, float]]:
    return [(p["index"], p["score"]) for p in body["top_k"]]


def _same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    return [i for i, _ in got] == [i for i, _ in want] and np.allclose(
        [s for _, s in got], [s for _, s in want], rtol=1e-4, atol=1e-6
    )


def _kill_and_wait(server: Server, service_name: str, client: httpx.Client) -> None:
    before = service_pids(server, service_name)
    assert before, f"no {service_name} process found"
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = service_pids(server, service_name)
        if now and not set(now) & set(before):
            try:
                if client.get("/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    raise AssertionError(f"{service_name} did not come back:\n{server.log_tail()}")


def _classify(client: httpx.Client, data: bytes) -> dict:
    answer = client.post("/classify", data={"backend": "onnx"}, files={"image": ("p.jpg", data, "image/jpeg")})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _check_every_answer(client: httpx.Client, home: Path, tag: str, data: bytes) -> None:
    """/classify, /classify/batch and /compare name ``tag`` and answer what ``tag`` computes."""
    want = _expected(home, tag, data)
    single = _classify(client, data)
    assert single["model"] == tag and _same(_answered(single), want), (single, want)
    batch = client.post("/classify/batch", data={"backend": "onnx"}, files=[("images", ("a.jpg", data, "image/jpeg"))])
    assert batch.status_code == 200, batch.text
    (item,) = batch.json()["results"]
    assert item["model"] == tag and _same(_answered(item), want), (item, want)
    compared = client.post("/compare", files={"image": ("p.jpg", data, "image/jpeg")})
    assert compared.status_code == 200, compared.text
    (onnx,) = [r for r in compared.json()["results"] if r["backend"] == "onnx"]
    assert onnx["model"] == tag and _same(_answered(onnx), want), (onnx, want)
    runner = {b["name"]: b for b in client.get("/backends").json()["backends"]}["onnx"]
    assert runner["model"] == tag and runner["models"] == [tag], runner


def _wait_until_released(home: Path, supervisor: int, timeout_s: float = 30) -> None:
    from fastinfer.common import leases

    deadline = time.monotonic() + timeout_s
    while held := [p for p in (home / "models").glob(f".fastinfer-pinned-{supervisor}-*.json") if leases.held(p)]:
        holders = [pid.name for pid in Path("/proc").iterdir() if pid.name.isdigit() and _holds(pid, held[0])]
        assert time.monotonic() < deadline, f"{held[0].name} still held by processes {holders} after A stopped"
        time.sleep(0.5)


def _holders(home: Path, *servers: Server | None) -> str:
    """Who holds each pin file of ``home`` now, for a failure's message: pid, parent, command, server."""
    import psutil

    from load_tests.service import SERVER_MARK

    marks = {s.mark: f"server {chr(65 + i)} (pid {s.process.pid})" for i, s in enumerate(servers) if s is not None}
    lines = []
    for pin in sorted((home / "models").glob(".fastinfer-pinned-*.json")):
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _holds(proc, pin):
                try:
                    p = psutil.Process(int(proc.name))
                    whose = marks.get(p.environ().get(SERVER_MARK, ""), "no server of this test")
                    lines.append(f"{pin.name}: pid {p.pid} ppid {p.ppid()} {whose}: {' '.join(p.cmdline())[:160]}")
                except psutil.Error as exc:
                    lines.append(f"{pin.name}: pid {proc.name}: {exc}")
    return "\nholders:\n" + "\n".join(lines or ["none found"])


def _holds(proc: Path, path: Path) -> bool:
    try:
        return any(os.readlink(fd) == str(path) for fd in (proc / "fd").iterdir())
    except OSError:
        return False


def _rebuild(home: Path, weights: Path, force: bool = True) -> str:
    """The build command of onnx alone into ``home``'s store; what it said."""
    return build_here(home, ["--weights", str(weights), "--only", "onnx", *["--force"][:force]])


def test_answers_and_cache_entries_name_the_model_that_computed_them(home, redis_server, tmp_path) -> None:
    env = {"REDIS_URL": redis_server.url, **serving("onnx")}
    with contextlib.ExitStack() as servers:
        a = servers.enter_context(serve(tmp_path, env, home=home, name="a"))
        with httpx.Client(base_url=a.url, timeout=60) as client:
            old = {x["name"]: x for x in client.get("/backends").json()["backends"]}["onnx"]["model"]
            first = _photo("chelsea.png", 333)
            _check_every_answer(client, home, old, first)

            # Rebuilt under the running server: the version it serves stays in the store.
            out = _rebuild(home, _other_weights(tmp_path / "other.pth"))
            assert f"kept {old}" in out, out
            assert len(_versions(home)) == 2
            new = f"{REBUILT}:{(home / 'models' / REBUILT / 'latest').read_text().strip()}"
            assert new != old
            assert _expected(home, new, first)[0] != _expected(home, old, first)[0]  # they answer differently

            # Its runner restarts: it loads the pinned version, not the rebuilt one.
            _kill_and_wait(a, "runner-onnx", client)
            second = _photo("coffee.png", 347)
            _check_every_answer(client, home, old, second)
            # A front worker restarts: it names the pinned version too.
            _kill_and_wait(a, "fastinfer", client)
            third = _photo("rocket.jpg", 311)
            _check_every_answer(client, home, old, third)
            assert _classify(client, first)["cached"] is True

        # A second server, started after the rebuild, on the same Redis: the new version, never A's entries.
        b = servers.enter_context(serve(tmp_path, env, home=home, name="b"))
        with httpx.Client(base_url=b.url, timeout=60) as other:
            for data in (first, second, third):
                answer = _classify(other, data)
                assert answer["cached"] is False and answer["model"] == new
                assert _same(_answered(answer), _expected(home, new, data))

        # Every entry either server wrote pairs its model with that model's output.
        sent = {hashlib.sha256(data).hexdigest(): data for data in (first, second, third)}
        r = redis.Redis.from_url(redis_server.url)
        checked = 0
        for key in r.scan_iter(match="fastinfer:*"):
            if r.type(key) != b"string":
                continue
            body = json.loads(r.get(key)).get("body", {})
            digest = key.decode().rsplit(":", 1)[1]
            if body.get("model") not in (old, new) or digest not in sent:
                continue  # another test's server (the shared store's onnx model is `old` too)
            data = sent[digest]
            assert _same(_answered(body), _expected(home, body["model"], data, len(body["top_k"]))), key
            checked += 1
        assert checked >= 6

        # Server A gone, the next build (nothing to rebuild) removes the version it kept. Gone means every
        # process of it: its pins hold while one lives (fastinfer.common.leases).
        stop_server(a)
        assert not a.processes(), "stop_server leaves no process of A"
        _wait_until_released(home, a.process.pid)
        out = _rebuild(home, tmp_path / "other.pth", force=False)
        assert f"removed {old}" in out and _versions(home) == [new.split(":")[1]], out + _holders(home, a, b)
