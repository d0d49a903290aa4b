"""The one shape every runner has: a ``@bentoml.service`` around a :class:`RunnerCore`, one engine.

A core loads the model versions this server pinned, checks their sha256 and warms up before it is ready;
``infer_batched`` runs together the calls that wait for the model (fastinfer/serving/batching.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from http import HTTPStatus
from typing import Any

import bentoml
import numpy as np
from bentoml.exceptions import BentoMLException, InvalidArgument, ServiceUnavailable
from bentoml.models import BentoModel

from fastinfer.catalog import holdings, store, store_check
from fastinfer.catalog.backends import SPECS, open_engine, stored_models
from fastinfer.catalog.config import get_settings
from fastinfer.common import hardware
from fastinfer.common.errors import one_line, under_home, without_paths
from fastinfer.compat import bentoml as bentoml_compat
from fastinfer.engines import Engine, EngineUnavailable, check_batch, warm_up
from fastinfer.serving import deadlines
from fastinfer.serving.batching import Expired, MicroBatcher
from fastinfer.serving.metrics import BATCH_SIZE
from runners.drain import leave_after_front

logger = logging.getLogger("fastinfer.runner")
RELOAD_AFTER_S = 30.0
NEVER_RECYCLE_REQUESTS = 2**62
NEVER_RECYCLE_SECONDS = 10.0**9
logging.getLogger("fastinfer").setLevel(logging.INFO)  # BentoML leaves the root logger at WARNING


def public_line(exc: BaseException, limit: int = 300) -> str:
    """:func:`one_line` for clients: without this server's paths (ONNX Runtime and OpenVINO name the
    model file they failed on). The log keeps the whole line."""
    text = without_paths(one_line(exc, limit=1 << 20))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ModelMismatch(BentoMLException):
    """Asked to compute for a model version this runner does not hold (409: the front's view is stale)."""

    error_code = HTTPStatus.CONFLICT


class NotBuilt(LookupError):
    """A model of the backend is not in the store (in a server: was not when it pinned its versions at start-up)."""


class DeadlinePassed(BentoMLException):
    """The caller's deadline passed before the model took the images (the caller has answered 504)."""

    error_code = HTTPStatus.GATEWAY_TIMEOUT


class RunnerCore:
    """One backend's engine in this process, without BentoML: its pinned model (load retried while the cause may
    heal), the micro-batcher, and the refusals that keep an answer honest. ``workers``: processes sharing the cores."""

    def __init__(self, backend: str, workers: int | None = None) -> None:
        settings = get_settings()
        self.name = backend
        self.spec = spec = SPECS[backend]
        self.batching = settings.batching_for(backend)
        self.threads = hardware.intra_op_threads(workers or settings.runner_workers, settings.threads)
        self.models = [f"{store.model_name(spec.artifact, size)}:latest" for size in spec.static_batches]
        self.batch_sizes: Counter[int] = Counter()
        self.calls: Counter[str] = Counter()  # per API, so that a test can tell infer_batched ran
        self.batcher = MicroBatcher(self._run, self.batching.max_batch_size, self.batching.max_latency_ms)
        self.failure: str | None = None
        self.engine_id = ""  # engine_identity() of the loaded engine
        self.failed_at = 0.0
        self.lasting = False
        self._reloading = asyncio.Lock()
        self._try_load()

    def _try_load(self) -> None:
        started = time.perf_counter()
        name = self.name
        try:
            self.engine = self._load()
        except store.NotServed as exc:
            # Built from another source than its family (fastinfer/catalog/holdings.py): a rebuild and restart heal it.
            self.failure, self.failed_at, self.lasting = str(exc), time.monotonic(), True
            logger.info("runner %s: not served: %s", name, exc)
            return
        except Exception as exc:
            # A model that cannot load makes this backend unavailable, with the reason, not the service down.
            self.failure = f"{name} could not be loaded: {public_line(exc)}"  # what clients are told
            self.failed_at = time.monotonic()
            # About this machine, or not stored when the versions were pinned: only a restart heals it.
            in_a_server = store.pins() is not None
            self.lasting = isinstance(exc, EngineUnavailable) or (isinstance(exc, NotBuilt) and in_a_server)
            logger.error("runner %s: %s could not be loaded: %s", name, name, one_line(exc, limit=4000))
            return
        self.failure = None
        self.engine_id = engine_identity(self.engine)
        runs_on = self.engine.describe()
        logger.info(
            "runner %s: %s loaded and warmed up in %.1fs on %s",
            name,
            ", ".join(self.models),
            time.perf_counter() - started,
            runs_on,
        )
        for fallback in runs_on.get("fallbacks", []):
            logger.warning("runner %s: NOT fully accelerated: %s", name, fallback)

    async def _loaded(self) -> None:
        """Raise the load failure as a 503, after retrying the load at most every RELOAD_AFTER_S (a transient
        cause heals without a restart; a lasting one is not retried). Callers during a retry get the 503 at once."""
        if self.failure is None:
            return
        due = not self.lasting and time.monotonic() - self.failed_at >= RELOAD_AFTER_S
        if due and not self._reloading.locked():
            async with self._reloading:
                await asyncio.to_thread(self._try_load)
        if self.failure is not None:
            raise ServiceUnavailable(self.failure)

    async def __is_ready__(self) -> bool:
        """Ready once the model is loaded. A failed load keeps it not ready, and the probe starts the due retry in
        the background (a server not ready gets no requests to start it)."""
        if self.failure is None or self.lasting:
            return True
        if time.monotonic() - self.failed_at >= RELOAD_AFTER_S and not self._reloading.locked():
            self._retry = asyncio.create_task(self._loaded())  # kept: a task nobody holds may vanish
            # Its 503 is expected (the failure is logged by _try_load): retrieved, so asyncio stays quiet.
            self._retry.add_done_callback(lambda task: task.cancelled() or task.exception())
        return False

    def _load(self) -> Engine:
        # The versions pinned at start-up: a runner restarted after a rebuild loads what the front names, or nothing.
        stored, missing = stored_models(self.spec)
        if missing:
            raise NotBuilt(
                holdings.missing_reason() or f"{', '.join(missing)} not in the model store; {holdings.build_hint()}"
            )
        store_check.require_intact(stored.values())  # a file that is not what was built is refused
        self.models = [str(model.tag) for model in stored.values()]
        engine = open_engine(self.name, self.threads, {size: model.path for size, model in stored.items()})
        warm_up(engine, (1, self.batching.max_batch_size) if self.batching.enabled else (1,))
        return engine

    def _run(self, images: np.ndarray) -> np.ndarray:
        """Every model call, batched or not: counted for /backends and the batch-size histogram."""
        if not self.spec.rows_independent and len(images) > 1:  # one run per image (fastinfer/catalog/backends.py)
            return np.concatenate([self._run(images[i : i + 1]) for i in range(len(images))])
        self.batch_sizes[len(images)] += 1
        BATCH_SIZE.labels(backend=self.name).observe(len(images))
        return self.engine.run(images)

    def _holds(self, model: str, engine: str) -> None:
        """Compute only for the model and engine the caller names in its answer (and cache key): a front and a
        runner that disagree (one restarted across a rebuild) must not mislabel."""
        if model and model not in self.models:
            raise ModelMismatch(
                f"the {self.name} runner holds {', '.join(self.models)}, not {model}: "
                "restart the server so that every process serves the same version"
            )
        if engine and engine != self.engine_id:
            raise ModelMismatch(
                f"the {self.name} runner computes with {self.engine_id}, not {engine}: "
                "restart the server so that every process computes alike"
            )

    async def identity(self) -> str:
        """The loaded engine's :func:`engine_identity` (after a due reload; the load failure's 503 else)."""
        await self._loaded()
        return self.engine_id

    async def compute(
        self, images: np.ndarray, model: str, within_s: float, batched: bool, engine: str = ""
    ) -> np.ndarray:
        """As the runner's ``infer`` (below), batched with other callers' images or run as sent."""
        self.calls["infer_batched" if batched else "infer"] += 1
        await self._loaded()
        self._holds(model, engine)
        deadline = deadlines.monotonic_deadline(within_s)
        try:
            images = check_batch(images, self.engine.input_size)
        except ValueError as exc:  # a 400 that says what is wrong with it
            raise InvalidArgument(str(exc)) from exc
        run = self.batcher.submit if batched else self.batcher.run_now
        try:
            return await run(images, deadline)
        except Expired as exc:
            raise DeadlinePassed(str(exc)) from exc

    def describe(self) -> dict[str, Any]:
        """Where it runs (device / execution providers, threads), its models, batch sizes seen."""
        if self.failure is not None:
            return {"error": self.failure, "models": self.models}
        runs_on = self.engine.describe()
        if "cache_dir" in runs_on:  # /backends shows this to clients: no server path
            runs_on["cache_dir"] = under_home(runs_on["cache_dir"])
        return {
            **runs_on,
            "engine": self.engine_id,
            "models": self.models,
            "batch_sizes_seen": dict(sorted(self.batch_sizes.items())),
            "calls": {"infer": self.calls["infer"], "infer_batched": self.calls["infer_batched"]},
            "expired_images": self.batcher.expired_rows,
        }


def engine_identity(engine: Engine) -> str:
    """What decides a loaded engine's numbers beside its model: its identity, the CPU's ISA, a Mac's chip."""
    machine = hardware.probe()
    chip = f" ({machine['cpu']})" if hardware.is_macos() else ""
    return f"{engine.identity()}; CPU instructions {'+'.join(machine['isa']) or 'baseline'}{chip}"


def tracing_configured() -> bool:
    """Whether any layer of BentoML's configuration turns tracing on; True when unknown, so spans are never lost."""

    def turned_on(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        tracing = node.get("tracing")
        if isinstance(tracing, dict) and (float(tracing.get("sample_rate") or 0) > 0 or tracing.get("exporter_type")):
            return True
        return any(turned_on(value) for value in node.values())

    try:
        return turned_on(bentoml_compat.configuration())
    except Exception:  # an unreadable value, or BentoML's internals moved: keep its default behaviour
        return True


def hop_uninstrumented() -> dict[str, Any]:
    """Runner config that leaves out BentoML's per-call log, metrics and, where tracing is configured nowhere, spans:
    the front has done them (docs/metrics.md#runner-telemetry: 1.75-1.96 CPU ms per call became 1.04-1.07)."""
    config: dict[str, Any] = {"logging": {"access": {"enabled": False}}, "metrics": {"enabled": False}}
    if not tracing_configured():
        config["tracing"] = {"excluded_urls": ["/infer", "/infer_batched", "/describe"]}
    return config


def make_runner(backend: str) -> Any:
    """Build the BentoML service ``runner-<backend>``: a :class:`RunnerCore` behind HTTP."""
    settings = get_settings()
    spec = SPECS[backend]
    # Only what is stored: BentoML refuses a service whose model it cannot find (a family may lack a backend).
    refs = {
        size: BentoModel(f"{store.model_name(spec.artifact, size)}:latest")
        for size in spec.static_batches
        if store.find(spec.artifact, size) is not None
    }

    class Runner(RunnerCore):
        def __init__(self) -> None:
            super().__init__(backend)

        @bentoml.on_startup
        def _leave_after_front(self) -> None:
            # The front may hold a request for up to the request timeout before it calls us.
            leave_after_front(settings.request_timeout_s + 5)

        @bentoml.api
        async def infer(
            self, images: np.ndarray, model: str = "", within_s: float = 0.0, engine: str = ""
        ) -> np.ndarray:
            """uint8 [N,S,S,3] → float32 logits [N,C] (the family's crop size and class count), run as sent,
            by ``model`` (a tag this runner holds; "" = whichever it holds) on ``engine`` (its identity, as
            ``describe`` says; "" = whichever); dropped (504) if ``within_s`` seconds (0 = no limit) pass
            before the model takes it: the caller has answered its client already."""
            return await self.compute(images, model, within_s, batched=False, engine=engine)

        @bentoml.api
        async def infer_batched(
            self, images: np.ndarray, model: str = "", within_s: float = 0.0, engine: str = ""
        ) -> np.ndarray:
            """As ``infer``, but calls that wait for the model run together, up to max_batch_size rows."""
            return await self.compute(images, model, within_s, batched=True, engine=engine)

        @bentoml.api
        async def which_engine(self) -> str:
            """The identity of the engine that computes (``engine_identity``): what a caller names in ``infer``. Like
            ``infer``, a runner whose model could not load tries again when due, and answers 503 meanwhile."""
            return await self.identity()

        @bentoml.api
        def describe(self) -> dict[str, Any]:
            """Where this runner runs (device / execution providers, threads), its models, batch sizes seen."""
            return RunnerCore.describe(self)

    for size, ref in refs.items():  # class attributes, so that `bentoml build` packs the models
        setattr(Runner, "model" if size is None else f"model_b{size}", ref)
    Runner.__name__ = Runner.__qualname__ = "".join(p.title() for p in backend.split("-")) + "Runner"
    service = bentoml.service(
        name=f"runner-{backend}",
        workers=settings.runner_workers,
        traffic={"timeout": settings.request_timeout_s},
        **hop_uninstrumented(),  # BentoML's configuration, which overrides these, can turn them on per runner
        # BentoML's client recycles its session every 100 requests / 300 s, killing calls in flight
        # ("Server disconnected" at ~1 in 100 under load): a local socket's needs no recycling.
        runner_connection={"max_requests": NEVER_RECYCLE_REQUESTS, "max_age": NEVER_RECYCLE_SECONDS},
    )(Runner)
    for api in service.apis.values():
        # BentoML derives the media type from a new JSON schema per response (0.2-0.7 ms): fixed once.
        api.output_spec.media_type = api.output_spec.mime_type()
    return service
