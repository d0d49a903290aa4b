"""``make bench``'s placement step runs each placement on fresh servers, each told every setting its label names;
the bench's other servers are told the decode pool they record."""

from __future__ import annotations

import argparse
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

import load_tests.__main__ as bench
from fastinfer.catalog.config import get_settings


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch):
    """FASTINFER_* as the test sets them, read afresh (get_settings caches)."""
    monkeypatch.setenv("FASTINFER_TUNED", "off")
    monkeypatch.delenv("FASTINFER_DECODE_THREADS", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


@pytest.mark.parametrize(("setting", "resolved"), [("", 0), ("3", 3)])
def test_the_bench_records_the_decode_pool_its_servers_are_told(settings, setting: str, resolved: int) -> None:
    settings.setenv("FASTINFER_DECODE_THREADS", setting)
    here = bench.decode_threads_here()
    assert here == {"decode_threads": resolved}
    assert bench.told(here) == {"FASTINFER_DECODE_THREADS": str(resolved)}


def test_the_placement_step_runs_each_placement_in_alternating_order(monkeypatch, tmp_path) -> None:
    started: list[dict[str, str]] = []

    def start(home, log, env, **_):
        started.append(env)
        return SimpleNamespace(url="http://x", process=SimpleNamespace(pid=len(started)))

    def inference_run(url, backend, users, args, pid):
        return {"scenario": "inference", "backend": backend, "users": users, "req_per_s": float(pid)}

    monkeypatch.setattr(bench, "start_server", start)
    monkeypatch.setattr(bench, "stop_server", lambda server: None)
    monkeypatch.setattr(bench, "inference_run", inference_run)
    monkeypatch.setattr(bench, "sequential", lambda url, backend, n, data: {"backend": backend, "median_ms": 20.0})
    monkeypatch.setattr(bench.photos, "benchmark_photo", lambda: b"jpeg")
    results = {
        "runs": [{"scenario": "inference", "backend": "onnx-int8", "users": 10, "req_per_s": 50.0}],
        "decode_threads": 0,
    }
    args = argparse.Namespace(duration=1.0, out=tmp_path, sequential=3)
    rows = bench.placement(results, args)
    # each round in the reverse order of the one before: a machine drifting in speed favours none
    assert [(r["placement"], r["round"]) for r in rows] == [
        ("runner process", 1),
        ("front worker", 1),
        ("front worker", 2),
        ("runner process", 2),
    ]
    assert len(rows) == 2 * bench.PLACEMENT_ROUNDS
    for n, (row, env) in enumerate(zip(rows, started, strict=True), 1):  # every label is what its server was told
        assert env["FASTINFER_DECODE_THREADS"] == "0" and "FASTINFER_SCHEDULING" not in env
        assert env["FASTINFER_IN_FRONT"] == ("onnx-int8" if row["placement"] == "front worker" else "none")
        assert env["FASTINFER_FRONT_WORKERS"] == "1" and row["decode_threads"] == 0 and "scheduling" not in row
        assert row["sequential"]["median_ms"] == 20.0 and row["req_per_s"] == float(n)  # its own server's run


class Refusing(BaseHTTPRequestHandler):
    """A server with API keys, sent none it accepts: 401 to every request."""

    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": "unauthorized"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *_: object) -> None:
        pass


def test_a_server_that_refuses_the_key_ends_the_bench_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in (("BENTOML_HOME", str(tmp_path)), ("FASTINFER_TUNED", "off")):
        monkeypatch.setenv(name, value)  # what main sets, undone after the test
    monkeypatch.delenv("FASTINFER_API_KEY", raising=False)
    monkeypatch.setattr(bench.photos, "benchmark_pool", lambda directory: [])
    monkeypatch.setattr(bench.photos, "benchmark_photo", lambda: b"jpeg")
    monkeypatch.setattr(bench.hardware, "probe", lambda **_: {})
    monkeypatch.setattr("fastinfer.catalog.backends.unavailable_reason", lambda name: "not here")  # no settings read
    url, environment = f"http://127.0.0.1:{server.server_address[1]}", dict(os.environ)
    try:
        with pytest.raises(SystemExit) as exited:
            bench.main(["--url", url, "--no-profile", "--no-bare", "--backends", "onnx", "--out", str(tmp_path)])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert exited.value.code == 1 and "Traceback" not in err and dict(os.environ) == environment
    assert f"python -m load_tests: 401 from {url}/classify: set FASTINFER_API_KEY to a key it accepts\n" in err


@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_server_before_the_cache_hit_scenario_is_said_and_the_bench_goes_on(
    status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import httpx

    answered = httpx.Response(status, request=httpx.Request("POST", "http://stub/classify"))
    monkeypatch.setattr(httpx, "post", lambda *args, **kwargs: answered)
    bench.store_repeat_answer("http://stub", "onnx", b"photo")
    said = capsys.readouterr().err
    assert "cache-hit scenario: its photo was not answered beforehand (HTTPStatusError:" in said
    assert f"'{status} " in said and "first requests may miss" in said


def test_a_refused_key_before_the_cache_hit_scenario_ends_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    answered = httpx.Response(401, request=httpx.Request("POST", "http://stub/classify"))
    monkeypatch.setattr(httpx, "post", lambda *args, **kwargs: answered)
    with pytest.raises(httpx.HTTPStatusError):
        bench.store_repeat_answer("http://stub", "onnx", b"photo")


def test_the_cache_hit_photo_is_the_one_the_locust_processes_repeat(tmp_path) -> None:
    """The bench keeps the pool it makes (or reads) and stores the answer of its cache-hit photo first; its locust
    processes read the pool back from the folder: same order, so the same photo, fresh, cached or partial."""
    from fastinfer.measure import photos
    from load_tests.checks import repeat_photo

    images = tmp_path / "images"
    made = photos.benchmark_pool(images)  # a fresh --out
    assert [name for name, _ in made] == [name for name, _ in photos.benchmark_pool(images)]
    (images / made[0][0]).unlink()  # an interrupted run's 59 files: made again
    assert (
        repeat_photo(photos.benchmark_pool(images)) == repeat_photo(photos.benchmark_pool(images)) == repeat_photo(made)
    )
