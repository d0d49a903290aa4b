"""One real headless locust run against a stub that refuses every request (401): what run_locust reads back."""

from __future__ import annotations

import threading
import types
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from load_tests import locust_runs
from load_tests.locust_runs import run_locust
from tests.unit.test_bench_placement import Refusing


def test_a_batch_run_whose_requests_all_fail_is_read_back_with_its_first_failure(tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run = run_locust(f"http://127.0.0.1:{server.server_port}", "onnx", 1, 1, "batch", tmp_path)
    finally:
        server.shutdown()
    assert run["requests"] > 0 and run["failures"] == run["requests"] and run["images_per_s"] == 0, run
    assert "HTTP 401" in run["failure_example"], run["failure_example"]


def test_a_torn_summary_is_said_with_locusts_exit_and_stderr(tmp_path, monkeypatch) -> None:
    def killed(cmd: list[str], env: dict[str, str], **_: object) -> types.SimpleNamespace:
        Path(env["FASTINFER_BENCH_SUMMARY"]).write_text('{"requests": 12')
        return types.SimpleNamespace(returncode=-9, stderr="Killed\n")

    monkeypatch.setattr(locust_runs.subprocess, "run", killed)
    with pytest.raises(RuntimeError, match=r"summary is unreadable .*exit -9.*Killed"):
        run_locust("http://127.0.0.1:9", "onnx", 1, 1, "inference", tmp_path)
