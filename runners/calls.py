"""The front's side of its runners (a ``bentoml.depends`` each, or the core itself for FASTINFER_IN_FRONT): one
call per batch of pixels, its one safe retry, and each failure as the API's error (503, or 504 past the deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import aiohttp
import anyio
import numpy as np
from bentoml.exceptions import BentoMLException, ServiceUnavailable

from fastinfer.catalog.store import StoredModelInfo
from fastinfer.common.errors import ApiError, BackendUnavailable, RequestTimeout, RunnerNotLoaded
from fastinfer.serving import deadlines
from runners import REGISTRY
from runners.base import RunnerCore

logger = logging.getLogger("fastinfer.service")  # these calls run in the front's workers: logged as the front
FAILURE_MEMORY_S = 10.0
"""How long a runner's load failure is believed before the runner is asked again."""
DESCRIBE_TIMEOUT_S = 5.0


class RunnerCalls:
    def __init__(
        self,
        front: Any,
        models: Mapping[str, StoredModelInfo],
        cannot_run: Mapping[str, str],
        timeout_s: float,
        local: Mapping[str, RunnerCore] | None = None,
    ) -> None:
        self.front = front  # the front service: its attributes named by runners.attribute are the runners
        self.local = dict(local or {})  # runner attribute → the core this process holds (FASTINFER_IN_FRONT)
        self.models = models  # backend → the model version its answers name (and its runner must hold)
        self.cannot_run = cannot_run  # backend → why it cannot run on this machine
        self.timeout_s = timeout_s  # the request timeout, for the 504's message
        self.failures: dict[str, tuple[str, float]] = {}  # runner → (why, until when it is believed)
        self.engines: dict[str, str] = {}  # runner → its engine's identity, as it said (runners/base.py)

    def unavailable(self, backend: str) -> str | None:
        """Why a backend cannot answer now: it cannot run here, or its runner recently failed to load."""
        if backend in self.cannot_run:
            return self.cannot_run[backend]
        reason, until = self.failures.get(REGISTRY[backend].runner, ("", 0.0))
        return reason if time.monotonic() < until else None

    async def engine(self, backend: str) -> str:
        """The identity of the engine that computes the backend's answers, asked of its runner until it answers.
        Every call names it; a runner that computes otherwise refuses (409), which makes this ask again."""
        runner = REGISTRY[backend].runner
        if known := self.engines.get(runner):
            return known
        core = self.local.get(runner)
        try:
            if core is not None:
                identity = await core.identity()
            else:
                with anyio.fail_after(DESCRIBE_TIMEOUT_S):
                    identity = await getattr(self.front, runner).to_async.which_engine()
        except ServiceUnavailable as exc:  # its model could not load (it retries when due, as for infer)
            raise await self._not_loaded(runner, backend, core, exc) from exc
        except Exception as exc:  # down, starting or wedged: not remembered, asked again by the next request
            raise BackendUnavailable(f"The {backend} runner does not answer: {type(exc).__name__}") from exc
        self.engines[runner] = identity = str(identity)
        return identity

    async def learn_engines(self, first_s: float = 1.0, most_s: float = 30.0) -> None:
        """Ask each runner that can run here for its engine until every one has answered, waiting longer each
        round (in the background): then a cache hit needs no runner call."""
        runners = {entry.runner: name for name, entry in REGISTRY.items() if name not in self.cannot_run}
        wait = first_s
        while unknown := [backend for runner, backend in runners.items() if runner not in self.engines]:
            for backend in unknown:
                with contextlib.suppress(ApiError):  # not loaded, or not answering yet: asked next round
                    await self.engine(backend)
            await asyncio.sleep(wait)
            wait = min(wait * 2, most_s)

    async def infer(self, backend: str, pixels: np.ndarray, batched: bool | None, engine: str) -> np.ndarray:
        """The backend's runner on a uint8 batch, computed by ``engine`` (the identity the answer and its cache
        key name; fastinfer.serving.pipeline.Infer)."""
        entry = REGISTRY[backend]
        core = self.local.get(entry.runner)
        call = (
            functools.partial(core.compute, batched=entry.method(batched) == "infer_batched")
            if core is not None
            else getattr(getattr(self.front, entry.runner).to_async, entry.method(batched))
        )
        # The runner computes only with the model this answer will be labelled with (runners/base.py).
        model = self.models[backend].tag
        within_s = deadlines.remaining()  # the runner drops the images if this passes before they run
        try:
            try:
                return await call(pixels, model=model, within_s=within_s, engine=engine)
            except aiohttp.ClientConnectorError:
                # Nothing was sent: one retry is safe (at SIGTERM the socket file is briefly gone, runners/drain.py).
                await asyncio.sleep(0.1)
                return await call(pixels, model=model, within_s=within_s, engine=engine)
        except ServiceUnavailable as exc:  # up, but its model could not load
            raise await self._not_loaded(entry.runner, backend, core, exc) from exc
        except Exception as exc:
            code = exc.error_code if isinstance(exc, BentoMLException) else None
            if code == HTTPStatus.GATEWAY_TIMEOUT:  # the deadline passed before the model ran it
                raise RequestTimeout(f"The request did not finish within {self.timeout_s:g} s") from exc
            if code == HTTPStatus.CONFLICT:
                # Another version or engine than this front names (runners/base.py ModelMismatch): nothing was
                # computed; remembered like a load failure, and its engine asked again after that.
                self.engines.pop(entry.runner, None)
                told = str(exc) if core is not None else _runner_message(str(exc))
                reason = told or f"The {backend} runner holds another model version than {model}"
                raise self._remember(entry.runner, reason) from exc
            logger.exception("runner %s failed", backend)  # down or crashed: the server's fault, said plainly
            raise BackendUnavailable(f"The {backend} runner failed: {type(exc).__name__}") from exc

    async def _not_loaded(self, runner: str, backend: str, core: RunnerCore | None, exc: Exception) -> RunnerNotLoaded:
        """The runner's own reason for its load failure (BentoML hides a 5xx's message: it is asked; a core
        here says it in ``exc``), remembered so that requests meanwhile get the 503 without a round trip."""
        told = str(exc) if core is not None else (await self.describe(runner)).get("error")
        return self._remember(runner, told or f"The {backend} runner is unavailable")

    def _remember(self, runner: str, reason: str) -> RunnerNotLoaded:
        """The 503 for a runner that cannot answer with the right model, believed for FAILURE_MEMORY_S."""
        self.failures[runner] = (reason, time.monotonic() + FAILURE_MEMORY_S)
        return RunnerNotLoaded(reason)

    async def describe(self, runner: str) -> dict[str, Any]:
        """What a runner says of itself (runners/base.py describe), or why it does not answer; where its
        engine runs: in a runner process or in this front worker (FASTINFER_IN_FRONT)."""
        if (core := self.local.get(runner)) is not None:
            try:
                return {**core.describe(), "placement": "front worker"}
            except Exception as exc:  # what an engine says of itself must not fail /backends
                logger.exception("describing the %s engine failed", runner)
                return {"error": f"the engine does not say where it runs: {type(exc).__name__}"}
        try:
            with anyio.fail_after(DESCRIBE_TIMEOUT_S):
                return {**await getattr(self.front, runner).to_async.describe(), "placement": "runner process"}
        except Exception as exc:
            return {"error": f"the runner does not answer: {type(exc).__name__}"}

    async def describe_running(self) -> dict[str, dict[str, Any]]:
        """Every runner that serves a backend able to run here, described, concurrently."""
        runners = {REGISTRY[n].runner for n in REGISTRY if n not in self.cannot_run}
        return dict(zip(runners, await asyncio.gather(*(self.describe(r) for r in runners)), strict=True))


def _runner_message(text: str) -> str:
    """The message of a runner's 4xx answer: BentoML sends ``[{"error": "..."}]``."""
    with contextlib.suppress(ValueError):
        body = json.loads(text)
        body = body[0] if isinstance(body, list) and body else body
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    return ""
