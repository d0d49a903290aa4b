"""Groq analysis without a server: no key → 503, only result fields travel."""

from __future__ import annotations

import asyncio
import json

import pytest

from fastinfer.catalog.config import GroqConfig
from fastinfer.front import analysis


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


def test_a_prompt_stays_small_whatever_the_results_hold() -> None:
    """Each call spends Groq tokens: 20 results stuffed with megabytes of text (review: a 19 MB `class` went
    to Groq whole) become a prompt of a few KB, every field of its type."""
    huge = "lorem ipsum " * 80_000
    stuffed = {
        "class": huge, "backend": huge, "model": huge, "weights": huge, "confidence": huge, "cached": huge,
        "top_k": [{"label": huge, "score": huge, "extra": huge}] * 1000,
        "timings_ms": {**{f"stage{i}": 1.0 for i in range(10_000)}, "inference": huge, "total": 12.5},
        "image_base64": huge,
    }  # fmt: skip
    prompt = json.dumps(analysis.messages([stuffed] * 20, "why?"))
    assert len(prompt) < 40_000
    (clean,) = analysis.sanitise([stuffed])
    assert len(clean["class"]) == analysis.TEXT_MAX and "confidence" not in clean and "cached" not in clean
    assert clean["timings_ms"] == {"total": 12.5} and len(clean["top_k"]) == 5
    assert clean["top_k"][0] == {"label": huge[: analysis.TEXT_MAX], "score": None}


def test_numbers_json_cannot_carry_or_a_prompt_cannot_afford_are_left_out() -> None:
    stuffed = {
        "class": "cat",
        "confidence": float("nan"),
        "top_k": [{"label": "cat", "score": float("inf")}, {"label": "dog", "score": 0.25}],
        "timings_ms": {"total": -float("inf"), "decode": 10**4000, "inference": 12.5},
    }
    (clean,) = analysis.sanitise([stuffed])
    assert clean == {
        "class": "cat",
        "top_k": [{"label": "cat", "score": None}, {"label": "dog", "score": 0.25}],
        "timings_ms": {"inference": 12.5},
    }
    prompt = analysis.messages([stuffed], "")[1]["content"]
    json.loads(prompt.removeprefix("Results:\n"), parse_constant=lambda name: pytest.fail(f"{name} in the prompt"))
