"""What the benchmark's scenarios send, and what counts as a failure (pure: the locustfile, the bench and the
tests use it). Bodies are encoded once and shared by every client: all send the same bytes."""

from __future__ import annotations

from typing import Any

import httpx

BATCH_IMAGES = 8  # images per batch request in the benchmark: the runners' default max batch size


def multipart(data: bytes | list[bytes], fields: dict[str, str], name: str = "image") -> tuple[bytes, str]:
    """A multipart body and its Content-Type: the form ``fields``, then one file part named ``name`` per image."""
    images = [data] if isinstance(data, bytes) else data
    files = [(name, (f"photo{i}.jpg", image, "image/jpeg")) for i, image in enumerate(images)]
    request = httpx.Request("POST", "http://localhost", data=fields, files=files)
    return request.read(), request.headers["Content-Type"]


def repeat_photo(pool: list[tuple[str, bytes]]) -> bytes:
    """The one photo the cache-hit scenario sends, over and over (the bench stores its answer first)."""
    return pool[len(pool) // 2][1]


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
