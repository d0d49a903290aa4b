"""One headless locust run against a server, read back: req/s, latency percentiles, errors and, with the
server's pid, the CPU each part of the server spent per request (``make bench`` and ``fastinfer tune``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fastinfer.catalog.backends import SPECS
from load_tests import cpu
from load_tests.checks import BATCH_IMAGES
from load_tests.service import ROOT

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USER_CLASSES = {"inference": "InferenceUser", "repeat": "RepeatUser", "bare": "RepeatUser", "batch": "BatchUser"}


def run_locust(
    url: str, backend: str, users: int, seconds: float, scenario: str, out: Path, server_pid: int | None = None
) -> dict[str, Any]:
    """One headless locust run; with ``server_pid``, the CPU each part of the server used per request."""
    summary_file = out / f"locust-{scenario}-{backend}-{users}_summary.json"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "-u", str(users)]
    cmd += ["-r", str(users), "-t", f"{seconds:g}s", "--host", url, "--stop-timeout", "10", USER_CLASSES[scenario]]
    summary_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "FASTINFER_BENCH_BACKEND": backend,
        "FASTINFER_BENCH_IMAGES": str(out / "images"),
        "FASTINFER_BENCH_SUMMARY": str(summary_file),
    }
    before, t0 = cpu.snapshot(server_pid), time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    after, wall = cpu.snapshot(server_pid), time.perf_counter() - t0
    if not summary_file.exists():  # the locustfile writes it as locust quits
        raise RuntimeError(f"locust wrote no summary (exit {done.returncode}): {done.stderr[-2000:]}")
    try:
        final = json.loads(summary_file.read_text())
        count, failures, rps = int(final["requests"]), int(final["failures"]), float(final["req_per_s"])
        latencies = {k: float(final[k]) for k in ("p50_ms", "p95_ms", "p99_ms")}
    except (ValueError, KeyError, TypeError) as exc:
        said = f"locust's summary is unreadable ({exc}; exit {done.returncode}): {done.stderr[-2000:]}"
        raise RuntimeError(said) from exc
    run: dict[str, Any] = {
        "scenario": scenario,
        "backend": backend,
        "users": users,
        "seconds": seconds,
        "requests": count,
        "failures": failures,
        "error_rate": round(failures / count, 4) if count else 0.0,
        "req_per_s": round(rps, 1),
        **latencies,
    }
    if scenario == "batch":
        run["images_per_request"] = BATCH_IMAGES
        run["images_per_s"] = round(rps * (1 - run["error_rate"]) * BATCH_IMAGES, 1)
        if failures:
            run["failure_example"] = final.get("first_failure", "")
    if server_pid is not None:
        # locust's own CPU and wall time from test start to stop, without its start-up (~1 s), where it wrote them:
        # one process (no --processes), so its CPU is all the load generator's while the requests ran
        client, client_wall = final.get("cpu_s"), final.get("wall_s")
        threads = cpu.by_thread(before, after)
        runner = f"runner-{SPECS[backend].runner_name if backend in SPECS else backend}"  # the process role serving it
        run["cpu"] = cpu.per_request(cpu.delta(before, after), runner, count, wall, client, threads, client_wall)
    return run
