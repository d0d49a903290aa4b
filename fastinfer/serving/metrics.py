"""FastInfer's Prometheus metrics, beside BentoML's own on ``/metrics``.

``bentoml serve`` points every process (front workers and runners) at one
``PROMETHEUS_MULTIPROC_DIR``; metrics created with ``prometheus_client`` write there and BentoML's
``/metrics`` aggregates them, so the numbers are right with any number of workers.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

STAGES = ("read", "cache", "decode", "preprocess", "inference", "total")

# Milliseconds to seconds: a cache hit is ~1 ms, a CPU inference 10-300 ms, a queue may take seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REQUESTS = Counter(
    "fastinfer_requests",
    "Requests answered by the front, by route, backend and HTTP status",
    ["route", "backend", "status"],
)
STAGE_SECONDS = Histogram(
    "fastinfer_stage_seconds",
    "Time per request stage (inference = runner round trip)",
    ["stage", "backend"],
    buckets=_LATENCY_BUCKETS,
)
CACHE_EVENTS = Counter(
    "fastinfer_cache_events",
    "Response cache lookups: hit, miss, invalid (a bad entry, also a miss), error, bypass",
    ["event"],
)
BATCH_SIZE = Histogram(
    "fastinfer_batch_size",
    "Images per model call in a runner",
    ["backend"],
    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32),
)


def observe_stages(backend: str, timings_ms: dict[str, float]) -> None:
    for stage in STAGES:
        if stage in timings_ms:
            STAGE_SECONDS.labels(stage=stage, backend=backend).observe(timings_ms[stage] / 1000)
