"""The spec's data (api_spec.json: FastInfer's texts and example answers), each operation's curl command, and
each error's body.

The answers were recorded from a real ``bentoml serve`` (random-init weights: the labels mean nothing) and
shortened; the error bodies come from the constructors the server answers with (tests/unit/test_spec_examples.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastinfer.catalog.config import Settings
from fastinfer.common.errors import BackendUnavailable, ImageTooLarge, InvalidImage
from fastinfer.front import http, image_api
from fastinfer.front.access import ANALYZE_ROUTE, NO_KEY, analyze_guard, rate_limited, unauthorized
from fastinfer.front.analysis import GroqFailed, GroqTimeout, GroqUnavailable
from fastinfer.front.image_routes import ROUTES
from fastinfer.serving.preprocess import NOT_AN_IMAGE

BASE_URL = "http://127.0.0.1:3000"
SPEC: dict[str, Any] = json.loads(Path(__file__).with_name("api_spec.json").read_text(encoding="utf-8"))
ANSWERS: dict[str, Any] = SPEC["answers"]  # route → the answer its 200 carries (an image route: /classify's)
ANALYZE_REQUEST: dict[str, Any] = SPEC["analyze_request"]
# The store tags of the models that answered (the batch-1 model for CoreML), for routes with a fixed backend.
MODELS = {r["backend"]: r["model"] for r in ANSWERS["/compare"]["results"]} | dict.fromkeys(
    ("coreml", "coreml-batched"), "resnet50-coreml-b1:2svviehoxoptuax4"
)


def answer(route: str, backend: str | None = None) -> dict[str, Any]:
    """The example answer of a JSON API; an image route with a fixed ``backend`` answers as /classify."""
    if route in ANSWERS:
        return ANSWERS[route]
    classify = ANSWERS["/classify"]
    return {**classify, "backend": backend, "model": MODELS[backend]} if backend in MODELS else classify


def curl(route: str, method: str, key: bool) -> str:
    """A working curl command for one operation (``key``: the server needs an API key). A POST's arguments are
    api_spec.json's ``curl``: /predict's for each /predict route (the original API's field ``file``)."""
    auth = ' -H "Authorization: Bearer $FASTINFER_API_KEY"' if key else ""
    args = "" if method == "get" else SPEC["curl"].get(route, SPEC["curl"]["/predict"])
    return " ".join(part for part in ("curl" + auth, args, BASE_URL + route) if part)


def errors(settings: Settings) -> dict[tuple[str, str], dict[str, Any]]:
    """(status, case) → the body the server answers, from the constructor it answers with. Messages written
    in place elsewhere are copied here; tests/unit/test_spec_examples.py compares."""
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
        ("503", "backend_unavailable"): BackendUnavailable(ANSWERS["/backends"]["backends"][1]["reason"]).body(),
        ("503", "groq_unavailable"): GroqUnavailable(
            "AI analysis is off: set GROQ_API_KEY or GROQ_API_KEY_FILE (and restart the service) to enable it."
        ).body(),
        ("504", "timeout"): http.timed_out(settings.request_timeout_s),
        ("504", "groq_timeout"): GroqTimeout(f"Groq did not answer within {settings.groq.timeout_s:g} s.").body(),
    }
