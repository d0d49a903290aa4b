"""``python -m load_tests`` (``make bench``): measure every backend and write BENCHMARKS.md with plots.

Steps, with progress on stderr:
 1. ``fastinfer profile`` in-process (before the service starts, so nothing competes): stage costs
    and this machine's ceiling;
 2. start ``bentoml serve`` (or use ``--url``);
 3. sequential latency: N requests per backend, one 1.5 MP photo, cache bypassed;
 4. locust, headless, per backend × concurrency, photos from a 60-image pool, cache bypassed;
 5. the cache-hit scenario (one photo repeated), reported apart;
 6. optionally (``--study``) front workers × runner workers × batching, on the best backend;
 7. results.json, plots, BENCHMARKS.md headed by the machine and the exact command.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fastinfer import hardware, photos
from load_tests.report import write_markdown
from load_tests.service import ROOT, start_server, stop_server

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_locust(url: str, backend: str, users: int, seconds: float, scenario: str, out: Path) -> dict[str, Any]:
    prefix = out / f"locust-{scenario}-{backend}-{users}"
    user_class = "InferenceUser" if scenario == "inference" else "RepeatUser"
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{seconds:g}s",
        "--host",
        url,
        "--csv",
        str(prefix),
        "--stop-timeout",
        "10",
        user_class,
    ]
    env = {**os.environ, "FASTINFER_BENCH_BACKEND": backend, "FASTINFER_BENCH_IMAGES": str(out / "images")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 120, cwd=ROOT)
    stats = prefix.with_name(prefix.name + "_stats.csv")
    if not stats.exists():
        raise RuntimeError(f"locust wrote no stats (exit {done.returncode}): {done.stderr[-2000:]}")
    with stats.open() as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    count, failures = int(row["Request Count"]), int(row["Failure Count"])
    return {
        "scenario": scenario,
        "backend": backend,
        "users": users,
        "seconds": seconds,
        "requests": count,
        "failures": failures,
        "error_rate": round(failures / count, 4) if count else 0.0,
        "req_per_s": round(float(row["Requests/s"]), 1),
        "p50_ms": float(row["50%"]),
        "p95_ms": float(row["95%"]),
        "p99_ms": float(row["99%"]),
    }


def sequential(url: str, backend: str, n: int, data: bytes) -> dict[str, Any]:
    latencies, stages = [], []
    with httpx.Client(timeout=60) as client:
        for i in range(n + 3):
            t0 = time.perf_counter()
            r = client.post(
                f"{url}/classify",
                files={"image": ("photo.jpg", data, "image/jpeg")},
                data={"backend": backend},
                headers={"Cache-Control": "no-cache"},
            )
            r.raise_for_status()
            if i >= 3:  # warm-up excluded
                latencies.append((time.perf_counter() - t0) * 1000)
                stages.append(r.json()["timings_ms"])
    latencies.sort()
    return {
        "backend": backend,
        "requests": n,
        "median_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(latencies[int(0.95 * (n - 1))], 1),
        "stages_p50_ms": {k: round(statistics.median(s[k] for s in stages), 2) for k in stages[0]},
    }


def cache_hit_share(url: str, before: dict[str, Any]) -> float:
    after = httpx.get(f"{url}/cache/stats", timeout=10).json()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return round(hits / (hits + misses), 4) if hits + misses else 0.0


def profile_here(out: Path, backends: list[str]) -> dict[str, Any]:
    from fastinfer import fidelity as fid
    from fastinfer import profile as prof
    from fastinfer.backends import open_engine
    from fastinfer.plots import plot_profile
    from fastinfer.preprocess import PreprocessSpec

    engines = {name: open_engine(name) for name in backends}
    result = prof.run(engines, [1, 8], 10, PreprocessSpec())
    plot_profile(result, out / "profile.png")
    say("fidelity against FP32 PyTorch (fastinfer fidelity)")
    images = fid.fidelity_images(PreprocessSpec())
    reference = fid.run_batched(engines["pytorch"] if "pytorch" in engines else open_engine("pytorch"), images)
    result["fidelity"] = [fid.measure(n, e, images, reference) for n, e in engines.items() if n != "pytorch"]
    del engines
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m load_tests", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="benchmark a running service instead of starting one")
    parser.add_argument("--backends", help="comma-separated (default: every backend available here)")
    parser.add_argument("--users", default="1,4,10,32", help="concurrency levels")
    parser.add_argument("--duration", type=float, default=20, help="seconds per locust run")
    parser.add_argument("--sequential", type=int, default=30, help="sequential requests per backend")
    parser.add_argument("--study", action="store_true", help="also run the workers × batching study")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--plots", type=Path, default=Path("docs/bench"), help="where BENCHMARKS.md's PNGs go")
    parser.add_argument("--report-only", action="store_true", help="rewrite BENCHMARKS.md from OUT/results.json")
    args = parser.parse_args(argv)
    if args.report_only:
        write_markdown(json.loads((args.out / "results.json").read_text()), args.markdown, args.out, args.plots)
        return 0
    command = "python -m load_tests " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    args.out.mkdir(parents=True, exist_ok=True)
    say("building the 60-image pool")
    photos.benchmark_pool(args.out / "images")

    from fastinfer.backends import unavailable_reason
    from fastinfer.config import BACKENDS

    here = [b for b in BACKENDS if unavailable_reason(b) is None and b != "coreml"]
    backends = args.backends.split(",") if args.backends else here
    users = [int(u) for u in args.users.split(",")]
    results: dict[str, Any] = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware.probe(check_torch=True),
        "runs": [],
    }
    if not args.no_profile:
        say("profiling stages in-process (fastinfer profile)")
        results["profile"] = profile_here(args.out, backends)

    server = None
    url = args.url
    if url is None:
        say("starting bentoml serve")
        server = start_server(None, args.out / "serve.log", {"FASTINFER_MAX_CONCURRENCY": "256"})
        url = server.url
    try:
        data = photos.benchmark_photo()
        results["sequential"] = []
        for backend in backends:
            say(f"sequential: {args.sequential} requests on {backend}")
            results["sequential"].append(sequential(url, backend, args.sequential, data))
        for backend in backends:
            for u in users:
                say(f"locust: {backend}, {u} users, {args.duration:g}s")
                results["runs"].append(run_locust(url, backend, u, args.duration, "inference", args.out))
        say("locust: cache-hit scenario, 10 users")
        before = httpx.get(f"{url}/cache/stats", timeout=10).json()
        repeat = run_locust(url, backends[0], 10, args.duration, "repeat", args.out)
        repeat["cache_hit_share"] = cache_hit_share(url, before)
        repeat["cache_mode"] = before["mode"]
        results["runs"].append(repeat)
    finally:
        if server is not None:
            stop_server(server)
    if args.study and args.url is None:
        results["study"] = study(results, args)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    say(f"writing {args.markdown} and plots in {args.out}")
    write_markdown(results, args.markdown, args.out, args.plots)
    return 0


def study(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Front workers × runner workers × batching on/off, on the fastest backend at 10 users."""
    inference = [r for r in results["runs"] if r["scenario"] == "inference" and r["users"] == 10]
    best = max(inference, key=lambda r: r["req_per_s"])["backend"] if inference else "onnx"
    key = best.upper().replace("-", "_")
    rows = []
    for front in (1, 2):
        for runner in (1, 2):
            for batching in ("true", "false"):
                env = {
                    "FASTINFER_FRONT_WORKERS": str(front),
                    "FASTINFER_RUNNER_WORKERS": str(runner),
                    f"FASTINFER_BATCHING_{key}": batching,
                    "FASTINFER_MAX_CONCURRENCY": "256",
                }
                say(f"study: {best}, front {front}, runner {runner}, batching {batching}")
                server = start_server(None, args.out / "serve-study.log", env)
                try:
                    run = run_locust(server.url, best, 10, args.duration, "inference", args.out)
                finally:
                    stop_server(server)
                rows.append({"front_workers": front, "runner_workers": runner, "batching": batching == "true", **run})
    return rows


if __name__ == "__main__":
    sys.exit(main())
