"""The front's calls to its runners (runners/calls.py): each way a call fails becomes the API's error,
a runner's own reason is told and remembered for a while, and only a call that sent nothing is retried.

The runners here are stand-ins with the shape of a ``bentoml.depends`` attribute (``.to_async.<method>``);
the real ones are exercised by the integration suite (runner crash, SIGTERM, rebuilt models)."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
from bentoml.exceptions import BentoMLException, ServiceUnavailable

from fastinfer.common.errors import BackendUnavailable, RequestTimeout, RunnerNotLoaded
from runners import REGISTRY, calls
from runners.calls import RunnerCalls

PIXELS = np.zeros((1, 224, 224, 3), dtype=np.uint8)
ENGINE = "OpenVINO 2026.4 on CPU at f32; CPU instructions avx2"


class StandIn:
    """A runner: answers ``infer``/``infer_batched`` from a list of outcomes, ``engine`` from a list of its
    own (an identity, or an exception), ``describe`` from a dict."""

    def __init__(
        self, outcomes: list[Any], described: dict[str, Any] | None = None, engines: list[Any] | None = None
    ) -> None:
        self.outcomes = outcomes
        self.engines = engines if engines is not None else [ENGINE]
        self.calls: list[dict[str, Any]] = []
        self.described = described or {}
        self.to_async = SimpleNamespace(
            infer=self._infer, infer_batched=self._infer, describe=self._describe, which_engine=self._engine
        )

    async def _engine(self) -> str:
        outcome = self.engines.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _infer(self, pixels: np.ndarray, **kwargs: Any) -> np.ndarray:
        self.calls.append(kwargs)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def _describe(self) -> dict[str, Any]:
        return self.described


def front_with(runner: StandIn, backend: str = "onnx") -> RunnerCalls:
    front = SimpleNamespace(**{REGISTRY[backend].runner: runner})
    models = {backend: SimpleNamespace(tag="resnet50-onnx:v1")}
    return RunnerCalls(front, models, {"coreml": "CoreML prediction needs macOS"}, timeout_s=30)  # type: ignore[arg-type]


def infer(calls_: RunnerCalls, backend: str = "onnx") -> np.ndarray:
    return asyncio.run(calls_.infer(backend, PIXELS, None, ENGINE))


def test_the_runner_is_told_the_model_version_the_engine_and_the_time_left() -> None:
    logits = np.ones((1, 1000), dtype=np.float32)
    runner = StandIn([logits])
    assert infer(front_with(runner)) is logits
    assert runner.calls == [{"model": "resnet50-onnx:v1", "within_s": 0.0, "engine": ENGINE}]  # 0: no deadline set


def test_the_engine_is_asked_until_the_runner_answers_then_known() -> None:
    runner = StandIn([], engines=[TimeoutError(), ENGINE])
    front = front_with(runner)
    with pytest.raises(BackendUnavailable, match="does not answer: TimeoutError"):
        asyncio.run(front.engine("onnx"))  # wedged or starting: not remembered
    assert asyncio.run(front.engine("onnx")) == asyncio.run(front.engine("onnx")) == ENGINE
    assert runner.engines == [], "asked twice, then known"
    # A runner that computes otherwise refuses (409): nothing computed, said, and the engine asked again.
    runner.outcomes = [BentoMLException('[{"error": "the onnx runner computes with X, not Y"}]')]
    runner.outcomes[0].error_code = HTTPStatus.CONFLICT
    with pytest.raises(RunnerNotLoaded, match="computes with X, not Y"):
        infer(front)
    assert REGISTRY["onnx"].runner not in front.engines
    assert front.unavailable("onnx") == "the onnx runner computes with X, not Y"  # remembered


def test_an_engine_whose_model_did_not_load_is_a_503_that_says_why_and_is_remembered() -> None:
    runner = StandIn([], {"error": "onnx could not be loaded: NoSuchFile"}, engines=[ServiceUnavailable("hidden")])
    front = front_with(runner)
    with pytest.raises(RunnerNotLoaded, match="could not be loaded: NoSuchFile"):
        asyncio.run(front.engine("onnx"))
    assert front.unavailable("onnx") == "onnx could not be loaded: NoSuchFile"


def test_engines_are_learnt_in_the_background_until_every_runner_answered() -> None:
    runner = StandIn([], engines=[TimeoutError(), ServiceUnavailable("x"), ENGINE])
    front = SimpleNamespace(**{entry.runner: runner for entry in REGISTRY.values()})
    calls_ = RunnerCalls(front, {}, {n: "not here" for n in REGISTRY if n != "onnx"}, timeout_s=30)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(calls_.learn_engines(first_s=0.01), 5))
    assert calls_.engines == {REGISTRY["onnx"].runner: ENGINE}


def test_a_call_that_could_not_connect_is_retried_once() -> None:
    refused = aiohttp.ClientConnectorError(SimpleNamespace(ssl=None, host="runner", port=0), OSError("gone"))
    logits = np.ones((1, 1000), dtype=np.float32)
    runner = StandIn([refused, logits])
    assert infer(front_with(runner)) is logits and len(runner.calls) == 2
    with pytest.raises(BackendUnavailable, match="runner failed: ClientConnectorError"):
        infer(front_with(StandIn([refused, refused])))


def test_a_runner_that_could_not_load_says_why_and_is_remembered(monkeypatch) -> None:
    runner = StandIn([ServiceUnavailable("hidden")], {"error": "resnet50-onnx: file differs from its record"})
    front = front_with(runner)
    with pytest.raises(RunnerNotLoaded, match="file differs from its record"):
        infer(front)
    assert front.unavailable("onnx") == "resnet50-onnx: file differs from its record"
    assert front.unavailable("onnx-int8") is None  # another runner: not this one's failure
    assert front.unavailable("coreml") == "CoreML prediction needs macOS"
    now = calls.time.monotonic()
    monkeypatch.setattr(calls.time, "monotonic", lambda: now + calls.FAILURE_MEMORY_S + 1)
    assert front.unavailable("onnx") is None  # then the runner is asked again


def test_a_deadline_passed_in_the_runner_is_a_504_and_a_crash_a_503() -> None:
    late = BentoMLException("late", error_code=HTTPStatus.GATEWAY_TIMEOUT)
    with pytest.raises(RequestTimeout, match="within 30 s"):
        infer(front_with(StandIn([late])))
    with pytest.raises(BackendUnavailable, match="runner failed: RuntimeError"):
        infer(front_with(StandIn([RuntimeError("segfault")])))


def test_a_runner_that_does_not_answer_is_described_as_such() -> None:
    class Silent(StandIn):
        async def _describe(self) -> dict[str, Any]:
            raise aiohttp.ServerDisconnectedError()

    runner = Silent([])
    runner.to_async.describe = runner._describe
    described = asyncio.run(front_with(runner).describe(REGISTRY["onnx"].runner))
    assert described == {"error": "the runner does not answer: ServerDisconnectedError"}
