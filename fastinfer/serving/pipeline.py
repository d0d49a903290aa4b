"""The request pipeline behind every form of the image APIs: one image, a batch, a comparison.

bytes → sha256 → response cache (a hit answers here) → decode and resize/crop on the CPU pool → the backend's
runner → softmax/top-k named by the family's labels → body with per-stage timings → cache SET (fail-open).
It knows nothing of HTTP or BentoML (the runner is an async callable), so it runs in a test without a server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastinfer.catalog.family import classes
from fastinfer.catalog.holdings import build_hint
from fastinfer.catalog.store import StoredModelInfo
from fastinfer.common.errors import ApiError, BackendUnavailable, RunnerNotLoaded, UnknownBackend
from fastinfer.common.schemas import DEFAULT_TOP_K, TOP_K_MAX, Timings
from fastinfer.serving import metrics
from fastinfer.serving.cache import Expected, ResponseCache, digest_key
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.live import LiveStats
from fastinfer.serving.postprocess import top_k as rank
from fastinfer.serving.preprocess import Prepared, prepare

# (backend, uint8 [N,S,S,3], batched (None: the backend's setting), engine identity) → float32 logits [N,C];
# raises RunnerNotLoaded or BackendUnavailable when the runner cannot answer, or computes otherwise.
Infer = Callable[[str, np.ndarray, "bool | None", str], Awaitable[np.ndarray]]
# backend → the identity of the engine computing its answers (runners/base.py engine_identity): in every cache key.
EngineOf = Callable[[str], Awaitable[str]]

NO_BACKEND = "No backend can run here; see GET /backends for why."
HASH_INLINE_MAX = 256 * 1024  # hashing more than this (~0.15 ms) goes to the CPU pool, off the event loop
STAGES = tuple(Timings.model_fields)

logger = logging.getLogger("fastinfer.pipeline")


@dataclass(frozen=True)
class Image:
    """One uploaded image's bytes, as sent: a view into the request body where it came in a multipart part."""

    data: bytes | memoryview
    filename: str = ""


def _digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class NonFiniteScores(BackendUnavailable):
    """The model computed NaN or infinity: no answer can be given, and it is not the request's fault."""


@dataclass(eq=False)  # a pipeline is one object, compared and hashed by identity
class Pipeline:
    backends: Sequence[str]  # every valid name, in the table's order
    models: Mapping[str, StoredModelInfo]  # backend → the stored model answering it
    unavailable: Callable[[str], str | None]  # backend → why it cannot answer now, or None
    infer: Infer
    engine_of: EngineOf
    cache: ResponseCache
    cpu: CpuPool
    live: LiveStats
    max_pixels: int

    def check(self, backend: str) -> StoredModelInfo:
        """The backend's model, or the 400/503 that says why it cannot answer."""
        if backend not in self.backends:
            raise UnknownBackend(f"Unknown backend {backend[:100]!r}; valid backends: {', '.join(self.backends)}")
        if (reason := self.unavailable(backend)) is not None:
            raise BackendUnavailable(reason)
        if backend not in self.models:  # the platform check names a missing model; this is a backstop
            raise BackendUnavailable(f"No {backend} model is in the store; {build_hint()}.")
        return self.models[backend]

    @staticmethod
    def top_k_refused(said: str, models: Collection[StoredModelInfo]) -> ApiError:
        """The 400 for a ``top_k`` (as sent) that is not a whole number from 1 to TOP_K_MAX or the class count."""
        n = min((classes(info) for info in models), default=0)
        most = str(TOP_K_MAX)
        if 0 < n < TOP_K_MAX:
            most = f"{n}, the classes of model family {min(models, key=classes).family!r}"
        return ApiError(f"top_k: must be a whole number from 1 to {most}; got {said[:40]!r}", code="invalid_top_k")

    @staticmethod
    def ranked(k: int | None, models: Sequence[StoredModelInfo]) -> int:
        """How many classes an answer ranks: ``k`` (a 400 beyond the class count), or DEFAULT_TOP_K at most."""
        n = min((classes(info) for info in models), default=0) or None  # 0: labels not stored, not capped
        if k is None:
            return min(DEFAULT_TOP_K, n or DEFAULT_TOP_K)
        if n is not None and k > n:
            info = min(models, key=classes)
            raise ApiError(
                f"top_k: {k} is more than the {n} classes of model family {info.family!r} ({info.tag}); "
                f"ask for 1 to {n}",
                code="invalid_top_k",
            )
        return k

    async def classify(
        self,
        image: Image,
        backend: str,
        k: int | None,
        *,
        bypass: bool = False,
        store: bool = True,
        batched: bool | None = None,
    ) -> dict[str, Any]:
        """One image → a ClassifyResponse-shaped body, from the cache unless ``bypass``, stored if ``store``."""
        started = time.perf_counter()
        info = self.check(backend)
        k = self.ranked(k, [info])
        engine = await self.engine_of(backend)
        timings: dict[str, float] = {}
        digest = "" if bypass else await self._hash_timed(image.data, timings)
        key, cached = await self._from_cache(digest, backend, info, engine, k, timings, bypass)
        if cached is not None:
            return self._respond(backend, cached, timings, started)
        prepared = await self._prepare(image.data, info, timings)
        logits = await self._infer(backend, engine, prepared.pixels[np.newaxis], batched, timings)
        body = self._body(backend, engine, logits[0], k)
        if store and not bypass:
            await self.cache.store(key, body)
        return self._respond(backend, body, timings, started)

    async def classify_many(
        self, images: list[Image], backend: str, k: int | None, *, bypass: bool = False, store: bool = True
    ) -> list[dict[str, Any]]:
        """Several images → one body per image, in order (or ``{"error": ...}``): cache per image, the misses
        decoded in parallel and inferred as one batch, duplicates once; recorded as one request."""
        started = time.perf_counter()
        info = self.check(backend)
        k = self.ranked(k, [info])
        engine = await self.engine_of(backend)
        every = [dict[str, float]() for _ in images]
        digests = await asyncio.gather(
            *(self._hash_timed(image.data, t) for image, t in zip(images, every, strict=True))
        )
        first = {digest: i for i, digest in reversed(list(enumerate(digests)))}  # digest → its first copy
        unique = sorted(first.values())
        answers: dict[int, dict[str, Any]] = {}  # first copy → its body (timings included), or its error
        timings = {i: every[i] for i in unique}
        looked_up = await asyncio.gather(
            *(self._from_cache(digests[i], backend, info, engine, k, timings[i], bypass) for i in unique)
        )
        keys = {i: key for i, (key, _) in zip(unique, looked_up, strict=True)}
        todo = []
        for i, (_, cached) in zip(unique, looked_up, strict=True):
            if cached is not None:
                answers[i] = self._respond(backend, cached, timings[i], started, record=False)
            else:
                todo.append(i)
        # At most one decode per core for this request: the pool's queue is FIFO, others must not wait behind it.
        fair = asyncio.Semaphore(self.cpu.workers)

        async def prepare(i: int) -> Prepared:
            async with fair:
                return await self._prepare(images[i].data, info, timings[i])

        outcomes = await asyncio.gather(*(prepare(i) for i in todo), return_exceptions=True)
        ready: list[tuple[int, Prepared]] = []
        for i, outcome in zip(todo, outcomes, strict=True):
            if isinstance(outcome, ApiError):
                answers[i] = outcome.body()
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                ready.append((i, outcome))
        inference: dict[str, float] = {}
        if ready:
            batch = np.stack([p.pixels for _, p in ready])
            logits = await self._infer(backend, engine, batch, None, inference)
            bodies = []
            for (i, _), row in zip(ready, logits, strict=True):
                try:
                    bodies.append((i, self._body(backend, engine, row, k)))
                except NonFiniteScores as exc:  # this image's error; the others are answered
                    answers[i] = exc.body()
            if store and not bypass:
                await asyncio.gather(*(self.cache.store(keys[i], body) for i, body in bodies))
            for i, body in bodies:
                answers[i] = self._respond(backend, body, {**timings[i], **inference}, started, record=False)
        request = {stage: sum(t.get(stage, 0.0) for t in timings.values()) for stage in STAGES[:-1]}
        request.update(inference, total=(time.perf_counter() - started) * 1000)
        slots = [answers[first[digest]] for digest in digests]
        from_cache = sum(bool(slot.get("cached")) for slot in slots)  # every copy the cache answered
        self._record(backend, request, inferred=bool(ready), images=len(images), from_cache=from_cache)
        return slots

    async def compare(self, image: Image, k: int | None, backends: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """One image through each of ``backends`` that can answer (decoded once, never cached, so that the
        timings compare): the bodies, and the backends that could not answer."""
        names = [n for n in backends if self.unavailable(n) is None and n in self.models]
        if not names:
            raise BackendUnavailable(NO_BACKEND)
        k = self.ranked(k, [self.models[n] for n in names])
        shared: dict[str, float] = {}
        prepared = await self._prepare(image.data, self.models[names[0]], shared)
        results, skipped = [], [n for n in backends if n not in names]
        broken: NonFiniteScores | None = None
        for name in names:
            started = time.perf_counter()
            timings = dict(shared)
            try:
                engine = await self.engine_of(name)
                logits = await self._infer(name, engine, prepared.pixels[np.newaxis], None, timings)
                body = self._body(name, engine, logits[0], k)
            except RunnerNotLoaded:  # listed as unavailable (a runner that crashed is still an error)
                skipped.append(name)
                continue
            except NonFiniteScores as exc:  # listed as unavailable too; said if no other backend answers
                logger.warning("%s", exc.message)
                skipped.append(name)
                broken = broken or exc
                continue
            timings["total"] = sum(timings.values())  # what a request to this backend alone would take
            results.append(self._respond(name, body, timings, started))
        if not results:
            raise broken or BackendUnavailable(NO_BACKEND)
        return results, skipped

    async def _hash_timed(self, data: bytes | memoryview, timings: dict[str, float]) -> str:
        """The sha256 of an image, its time observed as ``read``."""
        t0 = time.perf_counter()
        digest = _digest(data) if len(data) <= HASH_INLINE_MAX else await self.cpu.run(lambda: _digest(data))
        timings["read"] = (time.perf_counter() - t0) * 1000
        return digest

    async def _from_cache(
        self,
        digest: str,
        backend: str,
        info: StoredModelInfo,
        engine: str,
        k: int,
        timings: dict[str, float],
        bypass: bool,
    ) -> tuple[str, dict[str, Any] | None]:
        """The image's cache key and its cached body (None on a miss); a bypass still observes ``read``."""
        if bypass:
            self.cache.bypassed()
            metrics.CACHE_EVENTS.labels(event="bypass").inc()
            timings.setdefault("read", 0.0)
            return "", None
        t1 = time.perf_counter()
        key = digest_key(digest, backend, info.tag, k, engine)
        expected = Expected(backend, info.tag, k, info.weights, engine, info.categories)
        cached, event = await self.cache.lookup(key, expected)
        timings["cache"] = (time.perf_counter() - t1) * 1000
        metrics.CACHE_EVENTS.labels(event=event).inc()
        return key, None if cached is None else {**cached, "cached": True}

    async def _prepare(self, data: bytes | memoryview, info: StoredModelInfo, timings: dict[str, float]) -> Prepared:
        prepared = await self.cpu.run(lambda: prepare(data, info.preprocess, self.max_pixels))
        timings["decode"], timings["preprocess"] = prepared.decode_ms, prepared.preprocess_ms
        return prepared

    async def _infer(
        self, backend: str, engine: str, pixels: np.ndarray, batched: bool | None, timings: dict[str, float]
    ) -> Any:
        t0 = time.perf_counter()
        logits = np.asarray(await self.infer(backend, pixels, batched, engine))
        timings["inference"] = (time.perf_counter() - t0) * 1000
        return logits

    def _record(self, backend: str, timings: dict[str, float], *, inferred: bool, images: int, from_cache: int) -> None:
        """One request in the stage histograms and /stats/live (a batch's stages summed over its images)."""
        metrics.observe_stages(backend, timings)
        self.live.record(backend, timings["total"], inferred=inferred, images=images, cached_images=from_cache)

    def _body(self, backend: str, engine: str, logits: np.ndarray, k: int) -> dict[str, Any]:
        info = self.models[backend]
        if not np.isfinite(logits).all():  # a broken model (the build refuses one; a store can still hold it)
            raise NonFiniteScores(
                f"{info.tag} computed NaN or infinite scores for this image: the stored model is broken. "
                f"Rebuild the family from good weights ({build_hint()})."
            )
        predictions = rank(logits, k, info.categories)
        return {
            "class": predictions[0].label,
            "class_index": predictions[0].index,
            "confidence": predictions[0].score,
            "top_k": [{"label": p.label, "index": p.index, "score": p.score} for p in predictions],
            "backend": backend,
            "model": info.tag,
            "weights": info.weights,
            "engine": engine,
            "cached": False,
        }

    def _respond(
        self, backend: str, body: dict[str, Any], timings: dict[str, float], started: float, *, record: bool = True
    ) -> dict[str, Any]:
        """The body with its timings (ClassifyResponse's keys, in its order), ``record``-ed as one image."""
        timings.setdefault("total", (time.perf_counter() - started) * 1000)
        cached = bool(body.get("cached", False))
        if record:
            self._record(backend, timings, inferred=not cached, images=1, from_cache=int(cached))
        stages = {stage: round(timings.get(stage, 0.0), 3) for stage in STAGES}
        return {
            **{key: value for key, value in body.items() if key != "cached"},
            "latency_ms": stages["total"],
            "timings_ms": stages,
            "cached": cached,
        }
