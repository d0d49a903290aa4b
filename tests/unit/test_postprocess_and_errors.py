"""Softmax/top-k, the error shape, and settings parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastinfer.front.http import normalise_error
from fastinfer.serving.postprocess import softmax, top_k
from tests.settings import settings_with


def test_top_k_is_sorted_labelled_and_stable_for_huge_logits() -> None:
    logits = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)
    preds = top_k(logits, 3, ["a", "b", "c", "d"])
    assert [p.label for p in preds] == ["b", "d", "c"]
    assert preds[0].score == pytest.approx(softmax(logits)[1])
    assert sum(softmax(logits)) == pytest.approx(1.0)
    preds = top_k(np.array([1e4, 1e4 - 1, -1e4]), 2, ["x", "y", "z"])
    assert preds[0].score == pytest.approx(1 / (1 + np.exp(-1)))


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (400, b'{"error": "1 validation error", "detail": [{"loc": ["top_k"], "msg": "too big"}]}', "invalid_top_k"),
        (400, b'{"error": "x", "detail": [{"loc": ["body", "backend"], "msg": "bad"}]}', "unknown_backend"),
        (415, b'[{"error": "pickle not allowed"}]', "unsupported_media_type"),
        (429, b"Too many requests", "overloaded"),
        (404, b"Not Found", "not_found"),
        (500, b'{"error": "Traceback: secret"}', "internal_error"),
    ],
)
def test_framework_errors_get_our_shape(status: int, body: bytes, code: str) -> None:
    out = normalise_error(status, body)
    assert out["error"]["code"] == code
    assert isinstance(out["error"]["message"], str) and out["error"]["message"]
    assert "secret" not in json.dumps(out)  # never a server internal to the client


def test_our_errors_pass_through_unchanged() -> None:
    ours = {"error": {"code": "invalid_image", "message": "nope"}}
    assert normalise_error(400, json.dumps(ours).encode()) == ours


def test_settings_from_environment(monkeypatch) -> None:
    s = settings_with(
        monkeypatch,
        FASTINFER_MAX_BYTES="123",
        FASTINFER_BATCHING_PYTORCH="true",
        FASTINFER_MAX_BATCH_SIZE_PYTORCH="4",
        FASTINFER_MAX_CONCURRENCY="8",
    )
    assert s.max_bytes == 123
    assert s.max_uploads == 16  # twice max_concurrency
    assert s.batching_for("pytorch").enabled and s.batching_for("pytorch").max_batch_size == 4


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("FASTINFER_MAX_BYTES", "lots", "FASTINFER_MAX_BYTES"),
        # A limit of zero is refused, not taken as off: FASTINFER_BODY_IDLE_S=0 would make every POST a 408,
        # FASTINFER_MAX_CONCURRENCY=0 would refuse every POST.
        ("FASTINFER_BODY_IDLE_S", "0", "FASTINFER_BODY_IDLE_S must be at least 1"),
        ("FASTINFER_MAX_CONCURRENCY", "0", "FASTINFER_MAX_CONCURRENCY must be at least 1"),
    ],
)
def test_bad_settings_say_which_variable(monkeypatch, name: str, value: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        settings_with(monkeypatch, **{name: value})
