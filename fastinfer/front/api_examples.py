"""Examples for the API page (/docs.json): a request and an answer per API, and its curl command.

Recorded from a real ``bentoml serve`` (AMD EPYC, 2 cores, 2026-12-03), only shortened; random-init
weights, so the labels are meaningless and the timings real (api_page.md says so). The /analyze text is
written by hand (no Groq there). tests/unit/test_api_page.py validates each answer against its model.
"""

from __future__ import annotations

import json
from typing import Any

from fastinfer.catalog.config import Settings
from fastinfer.common.errors import BackendUnavailable, ImageTooLarge, InvalidImage
from fastinfer.front import http, image_api
from fastinfer.front.access import ANALYZE_ROUTE, NO_KEY, analyze_guard, rate_limited, unauthorized
from fastinfer.front.analysis import GroqFailed, GroqTimeout, GroqUnavailable
from fastinfer.front.image_routes import ROUTES
from fastinfer.serving.preprocess import NOT_AN_IMAGE

BASE_URL = "http://127.0.0.1:3000"
ORT_ENGINE = "ONNX Runtime 1.32.0 on CPUExecutionProvider; CPU instructions avx2+avx512+avx512_bf16+avx512_vnni"
TORCH_ENGINE = "PyTorch 2.14.1 on cpu at fp32; CPU instructions avx2+avx512+avx512_bf16+avx512_vnni"
OV_ENGINE = (
    "OpenVINO 2026.4.1-22982-e213a147257-releases/2026/4 on CPU at bf16; CPU instructions "
    "avx2+avx512+avx512_bf16+avx512_vnni"
)

CLASSIFY: dict[str, Any] = {
    "class": "photocopier",
    "class_index": 713,
    "confidence": 0.5485,
    "top_k": [
        {"label": "photocopier", "index": 713, "score": 0.5485},
        {"label": "beer bottle", "index": 440, "score": 0.29},
        {"label": "fur coat", "index": 568, "score": 0.081},
    ],
    "backend": "onnx-int8",
    "model": "resnet50-onnx-int8:2f3zw3xoxoptuax4",
    "weights": "random-init",
    "engine": ORT_ENGINE,
    "latency_ms": 35.538,
    "timings_ms": {"read": 0.064, "cache": 0.018, "decode": 6.201, "preprocess": 1.429, "inference": 26.875,
                   "total": 35.538},
    "cached": False,
}  # fmt: skip

BATCH: dict[str, Any] = {
    "results": [
        {
            **CLASSIFY,
            "confidence": 0.5115,
            "top_k": [
                {"label": "photocopier", "index": 713, "score": 0.5115},
                {"label": "beer bottle", "index": 440, "score": 0.2704},
            ],
            "backend": "openvino-int8",
            "model": "resnet50-openvino-int8:h7gprvxo46xtmax4",
            "engine": OV_ENGINE,
            "latency_ms": 71.724,
            "timings_ms": {"read": 0.055, "cache": 0.02, "decode": 10.524, "preprocess": 2.369, "inference": 21.141,
                           "total": 71.724},
        },
        {"error": {"code": "invalid_image", "message": NOT_AN_IMAGE}},
    ]
}  # fmt: skip


def _compared(
    backend: str, model: str, engine: str, confidence: float, inference: float, total: float
) -> dict[str, Any]:
    return {
        "class": "photocopier",
        "class_index": 713,
        "confidence": confidence,
        "top_k": [{"label": "photocopier", "index": 713, "score": confidence}],
        "backend": backend,
        "model": model,
        "weights": "random-init",
        "engine": engine,
        "latency_ms": total,
        "timings_ms": {"read": 0.0, "cache": 0.0, "decode": 2.575, "preprocess": 2.377, "inference": inference,
                       "total": total},
        "cached": False,
    }  # fmt: skip


COMPARE: dict[str, Any] = {
    "results": [
        _compared("pytorch", "resnet50-pytorch:yocroihoxoptuax4", TORCH_ENGINE, 0.877, 127.446, 132.399),
        _compared("onnx", "resnet50-onnx:zebza3xoxoptuax4", ORT_ENGINE, 0.877, 61.825, 66.777),
        _compared("onnx-int8", "resnet50-onnx-int8:2f3zw3xoxoptuax4", ORT_ENGINE, 0.931, 24.469, 29.422),
        _compared(
            "onnx-int8-dynamic", "resnet50-onnx-int8-dynamic:2iiwomhoxoptuax4", ORT_ENGINE, 0.887, 82.191, 87.143
        ),
        _compared("openvino", "resnet50-openvino:hzntbpho46xtmax4", OV_ENGINE, 0.8688, 31.93, 36.883),
        _compared("openvino-int8", "resnet50-openvino-int8:h7gprvxo46xtmax4", OV_ENGINE, 0.9334, 19.28, 24.233),
    ],
    "summary": {
        "fastest": "openvino-int8",
        "slowest": "pytorch",
        "all_agree_top1": True,
        "top1": {
            "pytorch": "photocopier",
            "onnx": "photocopier",
            "onnx-int8": "photocopier",
            "onnx-int8-dynamic": "photocopier",
            "openvino": "photocopier",
            "openvino-int8": "photocopier",
        },
        "unavailable": ["coreml", "coreml-batched"],
    },
    "total_ms": 361.253,
}

ANALYZE_REQUEST: dict[str, Any] = {
    "results": [CLASSIFY],
    "question": "Is INT8 worth it on this machine?",
}
ANALYZE: dict[str, Any] = {
    "text": "onnx-int8 answered in 35.5 ms, 26.9 ms of it inference, so the model dominates and decode "
    "(6.2 ms) is a small share. Static INT8 uses the CPU's integer dot-product units: compare it with "
    "onnx on /compare before choosing. The weights are a random init, so the label says nothing.",
    "model": "llama-3.1-8b-instant",
}

BACKENDS: dict[str, Any] = {
    "family": {
        "name": "resnet50",
        "stored": True,
        "num_classes": 1000,
        "weights": "random-init",
        "weights_description": "seeded random init (seed 0); torchvision's ImageNet weights could not be downloaded",
        "preprocess": {
            "resize_size": 232,
            "crop_size": 224,
            "mean": [0.485, 0.456, 0.406],
            "std": [0.229, 0.224, 0.225],
        },
        "accuracy": {},
        "missing": None,
    },
    "default": "openvino-int8",
    "default_choice": {
        "backend": "openvino-int8",
        "requested": "auto",
        "source": "rule",
        "why": "x86 integer dot-product units (VNNI/AMX): OpenVINO's static INT8 ran ~1.4× ONNX Runtime's INT8 in "
        "process",
    },
    "configuration": {
        "FASTINFER_DEFAULT_BACKEND": {"value": "openvino-int8", "source": "rule"},
        "FASTINFER_FRONT_WORKERS": {"value": "1", "source": "default"},
        "FASTINFER_RUNNER_WORKERS": {"value": "1", "source": "default"},
        "FASTINFER_THREADS": {"value": "0 (the cores ÷ runner workers)", "source": "rule"},
        "FASTINFER_IN_FRONT": {"value": "(none)", "source": "default"},
        "FASTINFER_DECODE_THREADS": {"value": "0 (one per core)", "source": "rule"},
        "FASTINFER_RUNNER_TELEMETRY": {"value": "false", "source": "default"},
    },
    "tuned": {
        "path": "$BENTOML_HOME/tuned/tuned.json",
        "status": "none",
        "why": "no tuned file: `fastinfer tune` writes one",
        "created": "",
        "goal": "",
        "settings": {},
    },
    "hardware": {
        "os": "Linux 6.18.44",
        "machine": "x86_64",
        "cpu": "AMD EPYC",
        "cores": 2,
        "cores_source": "CPU affinity (2), no cgroup CPU limit",
        "isa": ["avx2", "avx512", "avx512_bf16", "avx512_vnni"],
        "apple_chip": None,
        "neural_engine": False,
        "cuda": False,
        "mps": False,
    },
    "recommended": {
        "backend": "openvino-int8",
        "why": "x86 integer dot-product units (VNNI/AMX): OpenVINO's static INT8 ran ~1.4× ONNX Runtime's INT8 in "
        "process",
        "source": "rule",
    },
    "backends": [
        {
            "name": "openvino",
            "description": "OpenVINO IR of the FP32 model at the CPU's best precision (BF16 on AVX-512 BF16 / AMX)",
            "available": True,
            "reason": None,
            "model": "resnet50-openvino:hzntbpho46xtmax4",
            "models": ["resnet50-openvino:hzntbpho46xtmax4"],
            "weights": "random-init",
            "accuracy": None,
            "runs_on": {
                "device": "CPU (AMD EPYC)",
                "threads": 2,
                "precision": "bf16",
                "precision_requested": "auto",
                "layer_precision": {"Convolution": "bf16 53/53", "FullyConnected": "bf16 1/1", "Pooling": "bf16 1/1"},
                "fallbacks": [],
            },
            "batching": {"enabled": True, "max_batch_size": 8, "max_latency_ms": 0},
        },
        {
            "name": "coreml",
            "description": "CoreML FP16, batch 1 (Neural Engine / GPU / CPU)",
            "available": False,
            "reason": "CoreML prediction needs macOS; the models are built and stored (resnet50-coreml-b1)",
            "model": "resnet50-coreml-b1:2svviehoxoptuax4",
            "models": ["resnet50-coreml-b1:2svviehoxoptuax4"],
            "weights": "random-init",
            "runs_on": {},
            "batching": {"enabled": False, "max_batch_size": 1, "max_latency_ms": 0},
        },
    ],
}

CACHE_STATS: dict[str, Any] = {
    "mode": "redis",
    "healthy": True,
    "degraded": None,
    "hits": 1,
    "misses": 3,
    "errors": 0,
    "invalid": 0,
    "bypasses": 0,
    "writes_refused": 0,
    "write_errors": 0,
    "too_large": 0,
    "signed": False,
    "hit_rate": 0.25,
    "keys": 2,
    "since": "2026-12-03T13:57:30Z",
}

LIVE_STATS: dict[str, Any] = {
    "served": 9,
    "images": 9,
    "cached": 1,
    "since": "2026-12-03T13:57:30Z",
    "p50_ms": {"onnx": 66.8, "onnx-int8": 32.5, "openvino": 36.9, "openvino-int8": 48.0, "pytorch": 132.4},
    "window": 200,
    "cache": CACHE_STATS,
}

METRICS = """\
# TYPE fastinfer_requests_total counter
fastinfer_requests_total{backend="onnx-int8",route="/classify",status="200"} 3.0
fastinfer_batch_size_bucket{backend="onnx",le="1.0"} 1.0
"""

# Route → the answer its 200 carries. Routes not listed answer like /classify (one image).
ANSWERS: dict[str, dict[str, Any]] = {
    "/classify/batch": BATCH,
    "/compare": COMPARE,
    "/analyze": ANALYZE,
    "/backends": BACKENDS,
    "/cache/stats": CACHE_STATS,
    "/stats/live": LIVE_STATS,
}


# The store tags of the models that answered the examples (the batch-1 model for CoreML).
MODELS = {r["backend"]: r["model"] for r in COMPARE["results"]} | dict.fromkeys(
    ("coreml", "coreml-batched"), "resnet50-coreml-b1:2svviehoxoptuax4"
)


def answer(route: str, backend: str | None = None) -> dict[str, Any]:
    """The example answer of a JSON API; an image route with a fixed ``backend`` answers as /classify."""
    if route in ANSWERS:
        return ANSWERS[route]
    if backend in MODELS:
        return {**CLASSIFY, "backend": backend, "model": MODELS[backend]}
    return CLASSIFY


def curl(route: str, method: str, image_route: bool, key: bool) -> str:
    """A working curl command for one operation (``key``: the server needs an API key)."""
    auth = ' -H "Authorization: Bearer $FASTINFER_API_KEY"' if key else ""
    url = BASE_URL + route
    if method == "get":
        return f"curl{auth} {url}"
    if route == "/classify/batch":
        return f"curl{auth} -F images=@cat.jpg -F images=@dog.jpg -F backend=openvino-int8 -F top_k=3 {url}"
    if route == "/analyze":  # results as /classify or /compare answer them (these keys are enough)
        body = json.dumps(
            {"results": [{"backend": "onnx-int8", "class": "tabby", "confidence": 0.61, "latency_ms": 28.2}],
             "question": "Is INT8 worth it?"}
        )  # fmt: skip
        return f"curl{auth} -H \"Content-Type: application/json\" -d '{body}' {url}"
    if route == "/classify":
        return f"curl{auth} -F image=@cat.jpg -F backend=onnx-int8 -F top_k=3 {url}"
    if image_route and route.startswith("/predict"):  # the original API's field; top_k as the example answer
        return f"curl{auth} -F file=@cat.jpg -F top_k=3 {url}"
    if image_route:
        return f"curl{auth} -F image=@cat.jpg -F top_k=1 {url}"
    return f"curl{auth} -X {method.upper()} {url}"


def errors(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """(status, case) → the body the server answers, from the constructor it answers with: the spec's error
    examples. Messages written in place elsewhere are copied here; tests/unit/test_spec_examples.py compares."""
    limit = settings.max_batch_images
    batch = next(route for route in ROUTES.values() if route.kind == "batch")
    return {
        ("400", "invalid_field"): http.validation_error(
            [{"loc": ["question"], "msg": "String should have at most 500 characters"}]
        ),
        ("400", "invalid_image"): InvalidImage(NOT_AN_IMAGE).body(),
        ("400", "too_many_images"): image_api.too_many_images(limit + 1, limit).body(),
        ("401", "no_key"): unauthorized(NO_KEY).body,
        ("408", "slow_body"): http.slow_body(settings.body_idle_s, settings.request_timeout_s),
        ("413", "too_large"): http.too_large(25_000_000, settings.max_bytes),
        ("413", "get_body"): http.no_body("GET", "/backends"),
        ("413", "image_too_large"): ImageTooLarge(
            f"The image holds a picture of 120,000,000 pixels; the limit is {settings.max_pixels:,} "
            "(FASTINFER_MAX_PIXELS). It was not decoded."
        ).body(),
        ("415", "unsupported"): image_api.unsupported("text/csv", ROUTES["/classify"]).body(),
        ("415", "unsupported_batch"): image_api.unsupported("text/csv", batch).body(),
        ("429", "overloaded"): http.overloaded(settings.max_concurrency, settings.max_uploads),
        ("429", "rate_limited"): rate_limited(analyze_guard(settings), ANALYZE_ROUTE, 42).body,
        ("500", "failed"): http.normalise_error(500, b""),  # BentoML's 500, reshaped
        ("500", "image_failed"): image_api.FAILED,
        ("502", "groq_failed"): GroqFailed("Groq answered HTTP 500; try again later.").body(),
        ("503", "unavailable"): http.UNAVAILABLE,
        ("503", "backend_unavailable"): BackendUnavailable(BACKENDS["backends"][1]["reason"]).body(),
        ("503", "groq_unavailable"): GroqUnavailable(
            "AI analysis is off: set GROQ_API_KEY or GROQ_API_KEY_FILE (and restart the service) to enable it."
        ).body(),
        ("504", "timeout"): http.timed_out(settings.request_timeout_s),
        ("504", "groq_timeout"): GroqTimeout(f"Groq did not answer within {settings.groq.timeout_s:g} s.").body(),
    }
