"""FastInfer: the one BentoML entry service, routes and wiring only. Image routes: fastinfer/front/image_routes.py
(answered by fastinfer/front/image_api.py); pipeline: fastinfer/serving/pipeline.py; runners: runners/."""

import asyncio
import atexit
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import bentoml
from bentoml.exceptions import BentoMLException
from pydantic import BaseModel

from fastinfer.catalog.config import get_settings

try:  # before anything else reads them: a bad value stops `bentoml serve` in one line per variable, no traceback
    get_settings()
except ValueError as exc:
    raise SystemExit(f"fastinfer: {exc}") from None

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope, Send

from fastinfer.catalog import family, holdings, store, tuned
from fastinfer.catalog.backends import SERVED_ENV, served_models
from fastinfer.catalog.choice import DefaultChoice, default_choice, default_now, keep_placement
from fastinfer.common import hardware
from fastinfer.common.schemas import AnalyzeResponse, BackendsResponse
from fastinfer.front import analysis, image_api, inventory
from fastinfer.front.api_inputs import AnalyzeInput, quiet_input_errors
from fastinfer.front.api_page import ApiPage
from fastinfer.front.connections import install_front_protocol
from fastinfer.front.dashboard_page import DashboardFiles
from fastinfer.front.http import FrontMiddleware, front_options
from fastinfer.front.image_routes import ROUTES, image_apis
from fastinfer.front.openapi import DocumentedService
from fastinfer.serving.cache import ResponseCache, open_cache
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.disk import claim_metrics_dir, guard_metric_files, own_metrics_dir
from fastinfer.serving.live import LiveStats
from fastinfer.serving.metrics import record_family
from fastinfer.serving.pipeline import Pipeline
from runners import REGISTRY, attach, attribute, runs_here, unavailable_reason
from runners.base import RunnerCore
from runners.calls import RunnerCalls

logger = logging.getLogger("fastinfer.service")
DASHBOARD_DIR = Path(__file__).parent / "dashboard"
settings = get_settings()
# In `bentoml serve`'s supervisor (it imports this module first): metric files of this server's own, which
# another server on this home leaves alone. In a worker: keep this server's pins and metrics in use.
own_metrics_dir()
store.hold_pins()


# FrontMiddleware answers overload (429) and timeouts (504) in our error shape; BentoML's timeout, a little
# later, is a backstop.
@bentoml.service(
    name="fastinfer",
    service_class=DocumentedService,  # /docs.json tells the whole API (fastinfer/front/openapi.py)
    workers=settings.front_workers,
    traffic={"timeout": settings.request_timeout_s + 5},
    # BentoML's access log decodes the Content-Type as UTF-8: one \xff in it cut the answer short.
    logging={"access": {"request_content_type": False}},
    # The family this server serves (FASTINFER_MODEL): a bento built for one sets it in its image's environment.
    # So does one built with FASTINFER_BACKENDS set, which packs only those backends' models.
    envs=[{"name": store.FAMILY_ENV, "value": settings.model}]
    + ([{"name": SERVED_ENV, "value": ",".join(settings.backends)}] if os.environ.get(SERVED_ENV, "").strip() else []),
)
@image_apis  # one BentoML API per image route (fastinfer/front/image_routes.py)
@attach  # one bentoml.depends per runner that can run here (fastinfer/catalog/backends.py is the table)
class FastInfer:
    def __init__(self) -> None:
        self.unavailable = {name: reason for name in REGISTRY if (reason := unavailable_reason(name))}
        models = served_models()
        # Its name, classes, weights and measured accuracy: for /backends, the dashboard and /metrics.
        self.family = family.summary(settings.model, models)
        record_family(self.family)
        self.hardware = hardware.probe()
        # FASTINFER_DEFAULT_BACKEND=auto resolves here, in each worker, once the served versions are pinned.
        self.default = default_choice()
        logger.info("default backend: %s", self.default.describe())
        self.live = LiveStats()
        # Decoding is CPU-bound; more threads than cores only adds contention (see fastinfer.serving.cpu).
        self.cpu = CpuPool(settings.decode_threads or hardware.cpu_count(), "front-cpu")
        # Engines run in this worker, no hop to a runner (engines_in_front); loaded before it answers (1-2 s each).
        self.in_front = {
            attribute(r): RunnerCore(r, workers=1) for r in sorted(self.engines_in_front[0]) if runs_here(r)
        }
        calls = self.runner_calls = RunnerCalls(
            self, models, self.unavailable, settings.request_timeout_s, self.in_front
        )
        self.pipeline = Pipeline(
            list(REGISTRY),
            models,
            calls.unavailable,
            calls.infer,
            calls.engine,
            ResponseCache(),
            self.cpu,
            self.live,
            settings.max_pixels,
        )
        unserved = store.unserved()  # said once at start-up, by the deployment hook
        for name, reason in self.unavailable.items():
            if not all(model in unserved for model in REGISTRY[name].spec.model_names()):
                logger.warning("backend %s unavailable: %s", name, reason)
        if settings.api_keys:
            logger.info("API keys: on (%d accepted, from %s); open: probes, /metrics, the API page, the "
                        "dashboard's files", len(settings.api_keys), settings.api_keys_from)  # fmt: skip
        else:
            logger.warning("API keys: off (neither FASTINFER_API_KEYS nor FASTINFER_API_KEYS_FILE is set): every "
                           "route is open to whoever reaches the port")  # fmt: skip
            if os.environ.get("FASTINFER_API_KEY"):
                logger.warning("FASTINFER_API_KEY is what clients send; the server's keys are FASTINFER_API_KEYS")
        logger.info(
            "runners: BentoML's access log and request metrics cover the front's requests only, not each "
            "call to a runner (BentoML's configuration adds them: docs/metrics.md#runner-telemetry)"
        )

    @bentoml.on_deployment
    def _pin_models() -> None:
        """Once per ``bentoml serve``, before any worker starts: pin the model versions every worker serves
        (store.PINS_ENV) and record them so that a rebuild keeps them. Only models of the family's newest
        source are served: another source's answer 503 (fastinfer/catalog/holdings.py)."""
        names = [name for entry in REGISTRY.values() for name in entry.spec.model_names()]
        pinned, unserved = holdings.pin(names, settings.model)
        if not pinned and (missing := holdings.missing_reason(settings.model)) is not None:
            # Rather than BentoML's "could not be fetched": what the store holds and how to build this family.
            logger.error("%s", missing)
            raise BentoMLException(f"model family {settings.model!r} is not in the model store (logged above: "
                                   "the families it holds, and how to build this one)")  # fmt: skip
        os.environ[store.PINS_ENV] = json.dumps(pinned)
        os.environ[store.UNSERVED_ENV] = json.dumps(unserved)
        # Every worker takes the tuned configuration read here, even if the file changes meanwhile, and the
        # placement this process started the runners by, even if the default backend would change.
        tuned.export(settings.tuned)
        keep_placement(FastInfer.inner.engines_in_front)
        tuned.warn_removed(tuned.removed_in_environment(), "the environment")
        try:
            atexit.register(store.record_pins(pinned).unlink, missing_ok=True)
        except OSError as exc:  # a read-only store (a container's): a build through a writable mount may prune them
            logger.warning("could not record the served versions for builds to keep: %s", exc)
        claim_metrics_dir()
        logger.info("model family %s: serving %s", settings.model, ", ".join(sorted(set(pinned.values()))) or "nothing")

    async def __is_ready__(self) -> bool:
        """Ready once this worker's own engines are (FASTINFER_IN_FRONT); BentoML asks the runners beside."""
        return all([await core.__is_ready__() for core in self.in_front.values()])

    @bentoml.on_startup
    async def _start(self) -> None:
        # The engines learnt in the background (runners may still be loading): then a cache hit needs no runner call.
        self._learning = asyncio.create_task(self.runner_calls.learn_engines())  # kept: a task nobody holds may vanish
        self.pipeline.cache = await open_cache(
            settings.cache,
            settings.redis_url,
            settings.cache_ttl_s,
            settings.cache_timeout_ms / 1000,
            settings.cache_max_entries,
            hmac_key=settings.cache_hmac_key,
        )

    @bentoml.on_shutdown
    async def _close(self) -> None:
        if (learning := getattr(self, "_learning", None)) is not None:
            learning.cancel()
        await self.pipeline.cache.close()
        self.cpu.close()

    @bentoml.api(route="/analyze", input_spec=AnalyzeInput)
    async def analyze(self, results: list[dict[str, Any]], question: str, ctx: bentoml.Context) -> AnalyzeResponse:
        """Ask Groq to explain prediction results and their latency trade-offs (never the image)."""
        return await analysis.answer(results, question, settings.groq, ctx)

    async def live_stats(self) -> dict[str, Any]:
        """The dashboard's live panel: requests served, cache, p50 per backend (this worker)."""
        return {**self.live.snapshot(), "cache": await self.pipeline.cache.describe()}

    def default_now(self) -> DefaultChoice:
        """The backend of requests that name none, now (fastinfer/catalog/choice.py default_now)."""
        return default_now(self.default, self.hardware, list(REGISTRY), self.runner_calls.unavailable)

    async def backends(self) -> BackendsResponse:
        """Each backend: available or why not, models, weights, where it runs, batching; the machine."""
        described = await self.runner_calls.describe_running()
        return inventory.backends(
            REGISTRY,
            self.unavailable,
            self.pipeline.models,
            described,
            settings,
            self.hardware,
            self.default_now(),
            self.family,
        )


async def _image_lane(scope: Scope, body: bytes, send: Send) -> None:
    """An image route's request, its body in hand (FrontMiddleware's lane)."""
    service: FastInfer = bentoml.get_current_service()
    rules = image_api.FormRules(service.default_now().backend, settings.max_batch_images)
    await image_api.serve(service.pipeline, scope, body, send, rules)


# The GET routes beside the typed POST APIs (BentoML's are POST only): path → its answer (counts: this worker's);
# their response models for the spec: fastinfer/front/openapi.py STATUS_ROUTES, the same paths (test_api_page).
STATUS_ANSWERS: dict[str, Callable[[FastInfer], Awaitable[Any]]] = {
    "/backends": lambda service: service.backends(),
    "/cache/stats": lambda service: service.pipeline.cache.describe(),
    "/stats/live": lambda service: service.live_stats(),
}


def _status_route(answer_of: Callable[[FastInfer], Awaitable[Any]]) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def endpoint(request: Request) -> JSONResponse:
        answer = await answer_of(bentoml.get_current_service())
        return JSONResponse(answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer)

    return endpoint


def _readiness() -> dict[str, Awaitable[bool]]:
    """What /readyz asks, by name (as BentoML's probe: this worker's engines, each runner), for FrontMiddleware
    to bound in time."""
    service: FastInfer = bentoml.get_current_service()
    checks = {"the engines in the front worker (FASTINFER_IN_FRONT)": service.__is_ready__()}
    for attr, dependency in FastInfer.dependencies.items():  # one per runner (runners.attach)
        if (is_ready := getattr(getattr(service, attr), "is_ready", None)) is not None:
            checks[dependency.on.name if dependency.on is not None else attr] = is_ready()
    return checks


FastInfer.mount_asgi_app(
    Starlette(
        routes=[Route(path, _status_route(answer_of), methods=["GET"]) for path, answer_of in STATUS_ANSWERS.items()]
    )
)
FastInfer.mount_asgi_app(DashboardFiles(directory=DASHBOARD_DIR, html=True), path="/dashboard", name="dashboard")
# Idle connections, headers and open connections: bounded below the middleware (fastinfer/front/connections.py).
install_front_protocol(settings)
quiet_input_errors()  # a malformed /analyze body: one INFO line, not a traceback at ERROR
FastInfer.add_asgi_middleware(
    FrontMiddleware,
    **front_options(
        settings,
        ROUTES,
        _image_lane,
        # A full disk under BENTOML_HOME: metrics held in memory instead of a SIGBUS, and /readyz says why.
        degraded=guard_metric_files(settings.min_free_disk_mb * 2**20).reason,
        readiness=_readiness,  # answered within 2 s, naming a runner that does not answer
    ),
)
# Inside FrontMiddleware (its limits apply): "/" is FastInfer's API page, not BentoML's.
FastInfer.add_asgi_middleware(ApiPage)
