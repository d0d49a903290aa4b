"""FastInfer's Prometheus metrics, beside BentoML's own on ``/metrics``.

Every process of ``bentoml serve`` writes to one ``PROMETHEUS_MULTIPROC_DIR``, which ``/metrics`` aggregates.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from fastinfer.catalog.family import FamilyInfo, shows_top5

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


# The family served, as a gauge at 1 with labels (Info is not kept across processes); every worker sets the same.
MODEL_FAMILY = Gauge(
    "fastinfer_model_family_info",
    "The model family this server serves (value 1): its name, class count, and where its weights came from",
    ["family", "classes", "weights", "weights_description"],
    multiprocess_mode="max",
)
MODEL_ACCURACY = Gauge(
    "fastinfer_model_accuracy",
    "Accuracy (0..1) of each backend's stored model on the labelled photos its build measured (--eval-dir)",
    ["family", "backend", "metric", "precision"],
    multiprocess_mode="max",
)
DESCRIPTION_MAX = 200  # characters of the weights' description in a label: it is a line, not a document


def record_family(family: FamilyInfo) -> None:
    """The served family's gauges: its identity, and its accuracy where the build measured it."""
    classes = "" if family.num_classes is None else str(family.num_classes)
    description = (family.weights_description or "")[:DESCRIPTION_MAX]
    MODEL_FAMILY.labels(family.name, classes, family.weights or "", description).set(1)
    metrics = ("top1", "top5") if shows_top5(family.num_classes) else ("top1",)
    for backend, figures in family.accuracy.items():
        for metric in metrics:
            if isinstance(value := figures.get(metric), int | float):
                MODEL_ACCURACY.labels(family.name, backend, metric, str(figures.get("precision", ""))).set(value)


def observe_stages(backend: str, timings_ms: dict[str, float]) -> None:
    for stage in STAGES:
        if stage in timings_ms:
            STAGE_SECONDS.labels(stage=stage, backend=backend).observe(timings_ms[stage] / 1000)
