"""The one shape every runner has: a ``@bentoml.service`` around an engine.

A runner loads its model from the store lazily (a ``BentoModel`` ref resolved in ``__init__``),
warms up before it reports ready, and offers ``infer`` (one call, one model run) and
``infer_batched`` (adaptive micro-batching: calls from all front workers that arrive while the
model is busy run together; see fastinfer/batching.py for why not BentoML's dispatcher).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import bentoml
import numpy as np
from bentoml.models import BentoModel

from fastinfer import store
from fastinfer.batching import MicroBatcher
from fastinfer.config import get_settings
from fastinfer.engines import Engine, warm_up

logger = logging.getLogger(__name__)


def make_runner(backend: str, load_engine: Callable[[str], Engine]) -> type:
    """Build the BentoML service class for one backend.

    ``load_engine(model_dir)`` returns the loaded engine.
    """
    settings = get_settings()
    batching = settings.batching_for(backend)
    model_ref = BentoModel(f"{store.model_name(backend)}:latest")

    class Runner:
        model = model_ref

        def __init__(self) -> None:
            if model_ref.stored is None:
                raise RuntimeError(
                    f"{store.model_name(backend)} is not in the BentoML model store "
                    f"({bentoml.models.__name__}); run `python -m build_models` first"
                )
            stored = self.model
            started = time.perf_counter()
            self.engine = load_engine(stored.path)
            warm_up(self.engine, (1, batching.max_batch_size) if batching.enabled else (1,))
            self.info = store.describe(stored)
            self.batcher = MicroBatcher(self.engine.run, batching.max_batch_size, batching.max_latency_ms)
            logger.info(
                "runner %s: %s loaded and warmed up in %.1fs on %s",
                backend,
                stored.tag,
                time.perf_counter() - started,
                self.engine.describe(),
            )

        @bentoml.api
        async def infer(self, images: np.ndarray) -> np.ndarray:
            """uint8 [N,224,224,3] → float32 logits [N,1000], run as sent."""
            return await self.batcher.run_now(images)

        @bentoml.api
        async def infer_batched(self, images: np.ndarray) -> np.ndarray:
            """As ``infer``, but calls that wait for the model run together, up to max_batch_size rows."""
            return await self.batcher.submit(images)

        @bentoml.api
        def describe(self) -> dict[str, Any]:
            """Where this runner runs (device / execution providers, threads) and what it serves."""
            return {
                **self.engine.describe(),
                "model": self.info.tag,
                "weights": self.info.weights,
                "batching": {
                    "enabled": batching.enabled,
                    "max_batch_size": batching.max_batch_size,
                    "max_latency_ms": batching.max_latency_ms,
                    "batch_sizes": dict(sorted(self.batcher.batch_sizes.items())),
                },
            }

    Runner.__name__ = Runner.__qualname__ = f"{backend.title().replace('-', '')}Runner"
    return bentoml.service(
        name=f"runner-{backend}",
        workers=settings.runner_workers,
        traffic={"timeout": settings.request_timeout_s},
    )(Runner)


def keep_sessions_open(proxy: Any) -> bool:
    """Stop BentoML from recycling a runner client's HTTP session under load.

    BentoML 1.4's client replaces its aiohttp session every 100 requests (and every 300 s) and
    closes the old one at once, killing whatever is still in flight on it: the "Server
    disconnected" errors seen between front and runner at ~1 in 100 requests under concurrency.
    A session over a local socket has no reason to be recycled, so we turn that off.
    Returns False (and logs) if this BentoML has no such manager, so a version bump is visible.
    """
    manager = getattr(getattr(proxy, "to_async", None), "_session_manager", None)
    if manager is None or not hasattr(manager, "max_requests"):
        logger.warning("runner client has no session manager to configure; BentoML internals changed")
        return False
    manager.max_requests = float("inf")
    manager.max_age = float("inf")
    return True
