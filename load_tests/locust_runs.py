"""One headless locust run against a server, read back: req/s, latency percentiles, errors and, with the
server's pid, the CPU each part of the server spent per request (``make bench`` and ``fastinfer tune``)."""

from __future__ import annotations

import csv
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
    prefix = out / f"locust-{scenario}-{backend}-{users}"
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "-u", str(users)]
    cmd += ["-r", str(users), "-t", f"{seconds:g}s", "--host", url, "--csv", str(prefix), "--stop-timeout", "10"]
    cmd.append(USER_CLASSES[scenario])
    summary_file = prefix.with_name(prefix.name + "_summary.json")
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
    stats = prefix.with_name(prefix.name + "_stats.csv")
    if not stats.exists():
        raise RuntimeError(f"locust wrote no stats (exit {done.returncode}): {done.stderr[-2000:]}")
    with stats.open() as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    # locust's own final totals where it wrote them: its CSV can miss the last second's requests
    final = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    count = int(final.get("requests", row["Request Count"]))
    failures = int(final.get("failures", row["Failure Count"]))
    rps = float(final.get("req_per_s", row["Requests/s"]))
    run: dict[str, Any] = {
        "scenario": scenario,
        "backend": backend,
        "users": users,
        "seconds": seconds,
        "requests": count,
        "failures": failures,
        "error_rate": round(failures / count, 4) if count else 0.0,
        "req_per_s": round(rps, 1),
        "p50_ms": float(final.get("p50_ms", row["50%"])),
        "p95_ms": float(final.get("p95_ms", row["95%"])),
        "p99_ms": float(final.get("p99_ms", row["99%"])),
    }
    if scenario == "batch":
        run["images_per_request"] = BATCH_IMAGES
        run["images_per_s"] = round(rps * (1 - run["error_rate"]) * BATCH_IMAGES, 1)
        if failures:
            run["failure_example"] = _first_failure(prefix)
    if server_pid is not None:
        # locust's own CPU and wall time from test start to stop, without its start-up (~1 s), where it wrote them:
        # one process (no --processes), so its CPU is all the load generator's while the requests ran
        client, client_wall = final.get("cpu_s"), final.get("wall_s")
        threads = cpu.by_thread(before, after)
        runner = f"runner-{SPECS[backend].runner_name if backend in SPECS else backend}"  # the process role serving it
        run["cpu"] = cpu.per_request(cpu.delta(before, after), runner, count, wall, client, threads, client_wall)
    return run


def _first_failure(prefix: Path) -> str:
    failures = prefix.with_name(prefix.name + "_failures.csv")
    if not failures.exists():
        return ""
    with failures.open() as f:
        row = next(csv.DictReader(f), None)
    return (row or {}).get("Error", "")[:300]
