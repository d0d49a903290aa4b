"""A small rolling view of recent traffic in this front worker, for the dashboard's live panel."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any


class LiveStats:
    def __init__(self, window: int = 200) -> None:
        self.since = time.time()
        self.served = 0  # requests (a batch counts once)
        self.images = 0
        self.cached = 0  # images answered by the response cache
        self._latencies: dict[str, deque[float]] = {}
        self._window = window

    def record(self, backend: str, total_ms: float, *, inferred: bool, images: int = 1, cached_images: int = 0) -> None:
        """One request: whether inference ran, its ``images`` and how many of them the cache answered."""
        self.served += 1
        self.images += images
        self.cached += cached_images
        if inferred:  # p50 of inference requests; hits would hide the backend's speed
            self._latencies.setdefault(backend, deque(maxlen=self._window)).append(total_ms)

    def snapshot(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "images": self.images,
            "cached": self.cached,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            "p50_ms": {b: round(statistics.median(v), 1) for b, v in sorted(self._latencies.items()) if v},
            "window": self._window,
        }
