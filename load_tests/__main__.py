"""``python -m load_tests`` (``make bench``): measure every backend and write BENCHMARKS.md with plots.

Steps, with progress on stderr (docs/benchmarks.md describes each): the in-process profile, before any server;
``bentoml serve`` (or ``--url``); sequential latency; locust per backend × concurrency; the cache-hit scenario;
``/classify/batch``; the bare BentoML baseline; the engine's placement (runner vs front worker); optionally
(``--study``) workers × batching; then the HTTP path's cost, results.json, plots and BENCHMARKS.md. The server's
CPU is read around every locust run (with ``--url``, only given ``--server-pid``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from itertools import product
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from fastinfer.catalog import store
from fastinfer.catalog.backends import env_key
from fastinfer.common import hardware
from fastinfer.common.client import BadApiKey, auth_headers
from fastinfer.common.errors import one_line
from fastinfer.common.home import use_project_store
from fastinfer.measure import photos
from load_tests.checks import BATCH_IMAGES, multipart, repeat_photo
from load_tests.locust_runs import run_locust
from load_tests.report import write_markdown
from load_tests.service import ROOT, start_server, stop_server
from load_tests.targets import best_backend, measured_runs


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def batching_seen(url: str, backend: str) -> dict[str, Any] | None:
    """The server's batching setting for ``backend`` and the batch sizes its runner has seen (GET /backends);
    None when the server does not say."""
    try:
        entry = next(b for b in from_backends(url, f"batching of {backend}", "backends") if b["name"] == backend)
        return {
            "enabled": bool(entry["batching"]["enabled"]),
            "max_batch_size": int(entry["batching"]["max_batch_size"]),
            "sizes": {int(k): int(v) for k, v in entry.get("runs_on", {}).get("batch_sizes_seen", {}).items()},
        }
    except (ValueError, KeyError, TypeError, StopIteration):
        return None


def inference_run(url: str, backend: str, users: int, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    """A locust inference run, with the server's batching setting and mean rows per runner call meanwhile."""
    before = batching_seen(url, backend)
    run = run_locust(url, backend, users, args.duration, "inference", args.out, pid)
    if (after := batching_seen(url, backend)) is not None:
        seen = {k: v - (before or {}).get("sizes", {}).get(k, 0) for k, v in after["sizes"].items()}
        calls = sum(n for n in seen.values() if n > 0)
        rows = sum(k * n for k, n in seen.items() if n > 0)
        mean = round(rows / calls, 2) if calls else None
        run["batching"] = {"enabled": after["enabled"], "max_batch_size": after["max_batch_size"], "mean_batch": mean}
    return run


def from_backends(url: str, what: str, *keys: str) -> Any:
    """GET /backends' ``keys`` (nested), None when the server does not say (``what`` is then said unknown)."""
    try:
        value = httpx.get(f"{url}/backends", headers=auth_headers(), timeout=30).json()
        for key in keys:
            value = value[key]
        return value
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        say(f"the server's {what} is unknown: {type(exc).__name__}: {exc}")
        return None


def family_of(url: str) -> str | None:
    """The model family the server serves: a bench's rates are that family's (fastinfer evaluate shows them)."""
    name = from_backends(url, "model family", "family", "name")
    return None if name is None else str(name)


def sequential(url: str, backend: str, n: int, data: bytes) -> dict[str, Any]:
    """One client, one request at a time, ``n`` after 3 warm-ups: the latency's p50/p95 and the server's own stages.
    The client is the standard library's keep-alive connection, cheaper than httpx (docs/benchmarks.md)."""
    latencies, stages = [], []
    body, content_type = multipart(data, {"backend": backend})
    headers = {"Content-Type": content_type, "Cache-Control": "no-cache", **auth_headers()}
    where = urlsplit(url)
    kind = http.client.HTTPSConnection if where.scheme == "https" else http.client.HTTPConnection
    client = kind(where.netloc, timeout=60)
    try:
        for i in range(n + 3):
            t0 = time.perf_counter()
            client.request("POST", f"{where.path.rstrip('/')}/classify", body=body, headers=headers)
            response = client.getresponse()
            answer = response.read()
            if response.status != 200:
                why = "set FASTINFER_API_KEY to a key it accepts" if response.status == 401 else repr(answer[:200])
                raise httpx.HTTPError(f"{response.status} from {url}/classify: {why}")
            if i >= 3:  # warm-up excluded
                latencies.append((time.perf_counter() - t0) * 1000)
                stages.append(json.loads(answer)["timings_ms"])
    except (OSError, http.client.HTTPException) as exc:  # as httpx's failures: the bench records it and goes on
        raise httpx.HTTPError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        client.close()
    latencies.sort()
    return {
        "backend": backend,
        "requests": n,
        "median_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(latencies[int(0.95 * (n - 1))], 1),
        "stages_p50_ms": {k: round(statistics.median(s[k] for s in stages), 2) for k in stages[0]},
    }


def store_repeat_answer(url: str, backend: str, data: bytes) -> None:
    """The cache-hit scenario's photo answered once beforehand, so its 10 clients' first requests are hits, not
    10 misses at once (on 2 busy cores, a third of a short run)."""
    body, content_type = multipart(data, {"backend": backend})
    headers = {"Content-Type": content_type, **auth_headers()}
    try:
        httpx.post(f"{url}/classify", content=body, headers=headers, timeout=60).raise_for_status()
    except (httpx.HTTPStatusError, httpx.TimeoutException) as exc:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 401:
            raise  # no key it takes: the bench ends, naming FASTINFER_API_KEY
        # A busy server: the scenario runs all the same, and its hit share shows the cold start.
        say(f"cache-hit scenario: its photo was not answered beforehand ({one_line(exc)}); first requests may miss")


def cache_hit_share(url: str, before: dict[str, Any]) -> dict[str, Any]:
    """Hits / (hits + misses) since ``before`` (GET /cache/stats), and the cache's errors meanwhile (a
    timed-out or failed lookup is answered without the cache: decoded and inferred)."""
    after = httpx.get(f"{url}/cache/stats", headers=auth_headers(), timeout=10).json()
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return {
        "cache_hit_share": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "cache_errors": after.get("errors", 0) - before.get("errors", 0),
    }


def profile_here(out: Path, backends: list[str], repeats: int = 10, fidelity: bool = True) -> dict[str, Any]:
    from fastinfer.catalog.backends import open_engine
    from fastinfer.catalog.store import family_spec
    from fastinfer.measure import fidelity as fid
    from fastinfer.measure import profile as prof
    from fastinfer.measure.plots import plot_profile

    engines = {name: open_engine(name) for name in backends}
    result = prof.run(engines, [1, 8], repeats, family_spec())
    plot_profile(result, out / "profile.png")
    if not fidelity:
        return result
    say("fidelity against FP32 PyTorch (fastinfer fidelity)")
    images = fid.fidelity_images(family_spec())
    reference = fid.run_batched(engines["pytorch"] if "pytorch" in engines else open_engine("pytorch"), images)
    result["fidelity"] = [fid.measure(n, e, images, reference) for n, e in engines.items() if n != "pytorch"]
    del engines
    return result


def measure_http(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The HTTP path's CPU per request, per backend: from its inference run at 10 users (else at the most
    users it ran), the server's front and runner CPU per request less the in-process stages."""
    from fastinfer.catalog.config import get_settings
    from fastinfer.measure import profile as prof

    costs = [prof.StageCost(**s) for s in results["profile"]["stages"]]
    out = []
    for backend, r in measured_runs(results).items():
        server = r.get("batching") or {}
        local = get_settings().batching_for(backend) if backend in get_settings().batching else None
        enabled = server.get("enabled", local.enabled if local else True)
        max_batch = server.get("max_batch_size", local.max_batch_size if local else 8)
        per = r["cpu"]["ms_per_request"]
        seen = (r["users"], r["requests"], per["front"], per["runner"], enabled, max_batch, server.get("mean_batch"))
        if (cost := prof.http_cost(costs, backend, *seen)) is not None:
            out.append(asdict(cost))
    return out


def decode_threads_here() -> dict[str, Any]:
    """FASTINFER_DECODE_THREADS as the shell sets it: what the bench's servers are told, so that their runs' labels
    are true."""
    from fastinfer.catalog.config import get_settings

    return {"decode_threads": get_settings().decode_threads}


def told(results: dict[str, Any]) -> dict[str, str]:
    """A server's environment for the decode pool ``results`` recorded (decode_threads_here)."""
    return {"FASTINFER_DECODE_THREADS": str(results["decode_threads"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m load_tests", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url",
        help="benchmark a running service instead of starting one (with API keys: set FASTINFER_API_KEY; "
        "an environment variable, so that the key never lands in the recorded command)",
    )
    parser.add_argument(
        "--server-pid", type=int, help="with --url: its `bentoml serve` pid, to account the CPU of its processes"
    )
    parser.add_argument("--no-bare", action="store_true", help="skip the bare BentoML baseline")
    parser.add_argument("--backends", help="comma-separated (default: every backend available here)")
    parser.add_argument("--users", default="1,4,10,32", help="concurrency levels")
    parser.add_argument("--duration", type=float, default=20, help="seconds per locust run")
    parser.add_argument("--sequential", type=int, default=30, help="sequential requests per backend")
    parser.add_argument("--study", action="store_true", help="also run the workers × batching study")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--profile-repeats", type=int, default=10, help="repeats per stage in the profile")
    parser.add_argument("--no-fidelity", action="store_true", help="profile without the fidelity check")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--plots", type=Path, default=Path("docs/bench"), help="where BENCHMARKS.md's PNGs go")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite BENCHMARKS.md from OUT/ or PLOTS/results.json"
    )
    args = parser.parse_args(argv)
    if not args.report_only:  # the load generator sends it on every request: said here, not in locust's traceback
        try:
            auth_headers()
        except BadApiKey as exc:
            parser.error(str(exc))
    use_project_store()  # the store `make` uses (servers started here inherit it), not ~/bentoml
    # The servers started here serve what their labels say: no tuned file's placement or batching under every run.
    # --url measures a server as it is.
    os.environ["FASTINFER_TUNED"] = "off"
    if args.report_only:  # OUT's last run, else the one BENCHMARKS.md was written from (beside its plots)
        saved = next((p for p in (args.out / "results.json", args.plots / "results.json") if p.exists()), None)
        if saved is None:
            parser.error(f"no results.json in {args.out} or {args.plots}")
        write_markdown(json.loads(saved.read_text()), args.markdown, args.out, args.plots)
        return 0
    command = "python -m load_tests " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    args.out.mkdir(parents=True, exist_ok=True)
    say("building the 60-image pool")
    pool = photos.benchmark_pool(args.out / "images")  # saved there for the locust processes too

    from fastinfer.catalog.backends import unavailable_reason
    from fastinfer.catalog.config import BACKENDS

    here = [b for b in BACKENDS if unavailable_reason(b) is None and b != "coreml"]
    backends = args.backends.split(",") if args.backends else here
    users = [int(u) for u in args.users.split(",")]
    results: dict[str, Any] = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware.probe(check_torch=True),
        "family": store.family(),  # FASTINFER_MODEL (make bench MODEL=...): what the servers started here serve
        "runs": [],
    }
    if not args.no_profile:
        say("profiling stages in-process (fastinfer profile)")
        results["profile"] = profile_here(args.out, backends, args.profile_repeats, not args.no_fidelity)

    server = None
    url = args.url
    pid = args.server_pid if url else None
    if url is None:
        say("starting bentoml serve")
        # Engines in their runners, whatever the shell exports: the runs are labelled "runner process".
        results.update(decode_threads_here())  # the runs' decode pool, recorded (unknown with --url: not ours)
        env = {"FASTINFER_MAX_CONCURRENCY": "256", "FASTINFER_IN_FRONT": "none", **told(results)}
        server = start_server(None, args.out / "serve.log", env)
        url, pid = server.url, server.process.pid
    if pid is None:
        say("--url without --server-pid: the server's CPU is not accounted, the HTTP cost not measured")
    try:
        results["default"] = from_backends(url, "default backend", "default_choice")
        results["family"] = family_of(url) or results["family"]
        data = photos.benchmark_photo()
        results["sequential"] = []
        for backend in backends:
            say(f"sequential: {args.sequential} requests on {backend}")
            results["sequential"].append(sequential(url, backend, args.sequential, data))
        for backend in backends:
            for u in users:
                say(f"locust: {backend}, {u} users, {args.duration:g}s")
                results["runs"].append(inference_run(url, backend, u, args, pid))
        say("locust: cache-hit scenario, 10 users")
        store_repeat_answer(url, backends[0], repeat_photo(pool))
        before = httpx.get(f"{url}/cache/stats", headers=auth_headers(), timeout=10).json()
        repeat = run_locust(url, backends[0], 10, args.duration, "repeat", args.out, pid)
        repeat.update(cache_hit_share(url, before))
        repeat["cache_mode"] = before["mode"]
        results["runs"].append(repeat)
        results["batch"] = batch_step(url, results, users, args, pid)
    except httpx.HTTPError as exc:  # a server that refuses the key (401) or fails: one line, no traceback
        parser.exit(1, f"{parser.prog}: {exc}\n")
    finally:
        if server is not None:
            stop_server(server)
    if not args.no_bare:
        results["runs"].append(bare_baseline(backends[0], args))
    if args.url is None:
        results["placement"] = placement(results, args)
    if args.study and args.url is None:
        results["study"] = study(results, args)
    if results.get("profile"):
        from fastinfer.measure import profile as prof
        from fastinfer.measure.plots import plot_profile

        results["http_cost"] = measure_http(results)
        measured = {h["backend"]: h["http_ms"] for h in results["http_cost"]}
        results["profile"] = prof.with_http(results["profile"], measured)
        if measured:
            say("HTTP path per request, measured: " + ", ".join(f"{b} {ms:g} ms CPU" for b, ms in measured.items()))
            plot_profile(results["profile"], args.out / "profile.png")  # again, with the measured HTTP cost
    (args.out / "results.json").write_text(json.dumps(results, indent=2))  # kept should the report fail
    say(f"writing {args.markdown}, its plots and results.json in {args.plots}")
    write_markdown(results, args.markdown, args.out, args.plots)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))  # with the target rows judged
    return 0


def batch_step(
    url: str, results: dict[str, Any], users: list[int], args: argparse.Namespace, pid: int | None
) -> dict[str, Any]:
    """``POST /classify/batch`` on the best backend, 8 photos a request, at 10 users (or at the most users
    of this bench, so that the single-request run it is compared with had as many)."""
    best = best_backend(results)
    n = 10 if 10 in users else max(users)
    if best is None:
        return {"skipped": "no inference run to pick a backend from"}
    say(f"locust: batch API, {best}, {BATCH_IMAGES} images a request, {n} users, {args.duration:g}s")
    run = run_locust(url, best, n, args.duration, "batch", args.out, pid)
    results["runs"].append(run)
    return {"backend": best, "users": n}


def bare_baseline(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """The bare BentoML service, started here, under the cache-hit scenario's body, users and duration."""
    say("starting the bare BentoML baseline (load_tests/bare_service.py)")
    # Its own BENTOML_HOME (it needs no models): `bentoml serve` empties the home's Prometheus directory at
    # start-up, which would wipe the counters of a FastInfer server running over the same home (--url).
    home = (args.out / "bare-bentoml-home").resolve()  # the server runs in load_tests/
    home.mkdir(parents=True, exist_ok=True)
    bare = start_server(home, args.out / "serve-bare.log", target="bare_service:Bare", cwd=ROOT / "load_tests")
    try:
        say(f"locust: bare BentoML baseline, 10 users, {args.duration:g}s")
        return run_locust(bare.url, backend, 10, args.duration, "bare", args.out, bare.process.pid)
    finally:
        stop_server(bare)


PLACEMENT_ROUNDS = 2  # one run each cannot rank two configurations (docs/benchmarks.md#the-placement-step)


def placement(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The best backend at 10 users, its engine in a runner process or in the front worker (FASTINFER_IN_FRONT),
    for PLACEMENT_ROUNDS rounds, each run a fresh server."""
    best = best_backend(results)
    if best is None:
        return []
    rows = []
    # Set, not inherited from the shell: the labels must be true, and the front worker needs a single worker.
    configs = [(where, {"FASTINFER_IN_FRONT": engine, "FASTINFER_FRONT_WORKERS": "1", **told(results)})
               for where, engine in (("runner process", "none"), ("front worker", best))]  # fmt: skip
    # Each round in the reverse order of the one before: a machine that drifts in speed favours none.
    order = [(r, c) for r in range(1, PLACEMENT_ROUNDS + 1) for c in (configs if r % 2 else configs[::-1])]
    for round_, (where, env) in order:
        say(f"placement: {best} in the {where} (round {round_}), one client, then 10 users for {args.duration:g}s")
        env = {"FASTINFER_MAX_CONCURRENCY": "256", "FASTINFER_BACKENDS": best, "FASTINFER_DEFAULT_BACKEND": best, **env}
        server = start_server(None, args.out / "serve-placement.log", env)
        try:
            # One client first, on the idle server, as the sequential step does: the hop a placement saves
            # is most of what a single request pays beyond decode and inference.
            try:
                alone = sequential(server.url, best, args.sequential, photos.benchmark_photo())
            except httpx.HTTPError as exc:  # recorded, as locust records its failures: the bench goes on
                alone = {"backend": best, "error": f"{type(exc).__name__}: {exc}"[:300]}
                say(f"placement: one client on {best} failed: {alone['error']}")
            run = inference_run(server.url, best, 10, args, server.process.pid)
        finally:
            stop_server(server)
        row = {"placement": where, "decode_threads": results["decode_threads"], "round": round_}
        rows.append({**row, **run, "sequential": alone})
    return rows


def study(results: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Front workers × runner workers × batching on/off, on the fastest backend at 10 users."""
    best = best_backend(results) or "onnx"
    key = env_key(best)
    rows = []
    for front, runner, batching in product((1, 2), (1, 2), ("true", "false")):
        env = {
            "FASTINFER_FRONT_WORKERS": str(front),
            "FASTINFER_RUNNER_WORKERS": str(runner),
            f"FASTINFER_BATCHING_{key}": batching,
            "FASTINFER_MAX_CONCURRENCY": "256",
            "FASTINFER_IN_FRONT": "none",  # engines in their runners, whatever the shell exports
            "FASTINFER_BACKENDS": best,  # no idle runner beside the one measured
            "FASTINFER_DEFAULT_BACKEND": best,
            **told(results),  # the main runs' decode pool (decode_threads_here), recorded with them
        }
        say(f"study: {best}, front {front}, runner {runner}, batching {batching}")
        server = start_server(None, args.out / "serve-study.log", env)
        try:
            run = run_locust(server.url, best, 10, args.duration, "inference", args.out, server.process.pid)
        finally:
            stop_server(server)
        config = {"front_workers": front, "runner_workers": runner, "batching": batching == "true"}
        config["decode_threads"] = results["decode_threads"]  # told(results): the main runs'
        rows.append({**config, **run})
    return rows


if __name__ == "__main__":
    sys.exit(main())
