"""A bare BentoML service, the baseline of FastInfer's cache-hit path: ``POST /classify`` takes the same multipart
body and answers only the file's size, so what it costs per request is BentoML's HTTP path by itself."""

from __future__ import annotations

import os
from pathlib import Path

import bentoml

WORKERS = int(os.environ.get("FASTINFER_FRONT_WORKERS", "1"))  # the same worker count as FastInfer's front


@bentoml.service(name="bare", workers=WORKERS)
class Bare:
    @bentoml.api(route="/classify")
    async def classify(self, image: Path, backend: str = "onnx") -> dict[str, int]:
        """The upload's size in bytes (``backend`` is accepted and ignored, as a real body carries it)."""
        return {"bytes": image.stat().st_size}
