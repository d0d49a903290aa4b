"""What counts as a failure in the benchmark's scenarios (pure: the locustfile and the tests use it)."""

from __future__ import annotations

from typing import Any

BATCH_IMAGES = 8  # images per batch request in the benchmark: the runners' default max batch size


def batch_failure(status: int, body: dict[str, Any] | None, expected: int) -> str | None:
    """Why a batch answer is a failure in the benchmark (None when it is a success)."""
    if status != 200:
        return f"HTTP {status}"
    results = (body or {}).get("results")
    if not isinstance(results, list) or len(results) != expected:
        return f"{len(results) if isinstance(results, list) else 'no'} results for {expected} images"
    for i, item in enumerate(results):
        if not isinstance(item, dict) or "error" in item:
            return f"image {i}: {item.get('error') if isinstance(item, dict) else item!r}"
        if item.get("cached"):
            return f"image {i}: a cache hit in the batch scenario"
    return None
