"""Groq analysis without a server: no key → 503, only result fields travel."""

from __future__ import annotations

import asyncio

import pytest

from fastinfer import analysis
from fastinfer.config import GroqConfig


def test_no_key_means_503_with_the_fix() -> None:
    with pytest.raises(analysis.GroqUnavailable, match="set GROQ_API_KEY") as info:
        asyncio.run(analysis.analyze([{"class": "cat"}], "", GroqConfig(api_key="")))
    assert info.value.status == 503


def test_only_result_fields_are_sent() -> None:
    result = {
        "class": "tabby",
        "confidence": 0.9,
        "top_k": [{"label": "tabby", "index": 281, "score": 0.9, "extra": "x" * 999}],
        "backend": "onnx",
        "timings_ms": {"total": 10},
        "image": "aGVsbG8=" * 100,
        "path": "/etc/passwd",
    }
    text = str(analysis.messages([result], ""))
    assert "tabby" in text and "onnx" in text
    assert "aGVsbG8" not in text and "/etc/passwd" not in text and "xxxx" not in text


def test_the_key_is_not_in_the_config_repr() -> None:
    assert "sekrit" not in repr(GroqConfig(api_key="sekrit"))
