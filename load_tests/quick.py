"""A quick measurement of a running service: single-client latency and N-client throughput.

``python -m load_tests.quick --url http://127.0.0.1:3000 --backends pytorch,onnx``

Every request posts the same JPEG to ``/classify`` uncached (``--cache``: the cache-hit path, reported apart).
The client shares the machine and its CPU. A server with API keys: set FASTINFER_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from fastinfer.common.client import BadApiKey, auth_headers
from fastinfer.measure import photos
from load_tests.bodies import multipart

HEADERS = {"Cache-Control": "no-cache"}


def _post(client: httpx.Client, url: str, body: tuple[bytes, str]) -> dict:
    """POST a multipart body encoded once (load_tests/bodies.py), the bytes the bench's clients send."""
    content, content_type = body
    r = client.post(
        f"{url}/classify", content=content, headers={**HEADERS, **auth_headers(), "Content-Type": content_type}
    )
    r.raise_for_status()
    return r.json()


def sequential(url: str, data: bytes, backend: str, n: int) -> dict:
    body = multipart(data, {"backend": backend})
    with httpx.Client(timeout=60) as client:
        for _ in range(5):  # warm-up
            _post(client, url, body)
        latencies, stages = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            answer = _post(client, url, body)
            latencies.append((time.perf_counter() - t0) * 1000)
            stages.append(answer["timings_ms"])
    return {
        "p50_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(sorted(latencies)[int(0.95 * (n - 1))], 1),
        "server_stage_p50_ms": {k: round(statistics.median(s[k] for s in stages), 1) for k in stages[0]},
    }


def concurrent(url: str, data: bytes, backend: str, clients: int, seconds: float) -> dict:
    body = multipart(data, {"backend": backend})
    done, errors = [0] * clients, [0] * clients
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        with httpx.Client(timeout=60) as client:
            while time.perf_counter() < stop:
                try:
                    _post(client, url, body)
                    done[i] += 1
                except httpx.HTTPError:
                    errors[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"clients": clients, "req_per_s": round(sum(done) / elapsed, 1), "errors": sum(errors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m load_tests.quick", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--backends", default="pytorch,onnx")
    parser.add_argument("--requests", type=int, default=40, help="sequential requests per backend")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--cache", action="store_true", help="let the response cache answer (measures hits)")
    args = parser.parse_args(argv)
    try:
        auth_headers()
    except BadApiKey as exc:
        parser.error(str(exc))
    if args.cache:
        HEADERS.clear()
    data = photos.benchmark_photo()
    results = {}
    for backend in args.backends.split(","):
        print(f"{backend}: {args.requests} sequential requests ...", file=sys.stderr, flush=True)
        seq = sequential(args.url, data, backend, args.requests)
        print(f"{backend}: {args.clients} clients for {args.seconds:.0f}s ...", file=sys.stderr, flush=True)
        results[backend] = {
            "sequential": seq,
            "concurrent": concurrent(args.url, data, backend, args.clients, args.seconds),
        }
    print(json.dumps({"photo_bytes": len(data), "cache": args.cache, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
