"""The backend table: one row per backend, from which names, settings, runners and engines derive;
and what happens when a backend's engine cannot load (its runner stays up and says why)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bentoml.exceptions import ServiceUnavailable

from fastinfer.catalog import backends, choice, store
from fastinfer.catalog.backends import BACKENDS, RUNNERS, SPECS, open_engine, runs_here, unavailable_reason
from fastinfer.catalog.config import get_settings
from fastinfer.engines import EngineUnavailable
from tests.conftest import ROOT, doctor_report
from tests.settings import settings_with


def test_every_name_setting_and_runner_derives_from_the_table() -> None:
    assert tuple(SPECS) == BACKENDS
    assert {"openvino", "openvino-int8"} <= set(BACKENDS)
    settings = get_settings()
    for name, spec in SPECS.items():
        assert spec.runner_name in RUNNERS, name
        on, size, latency = spec.batching
        batching = settings.batching_for(name)
        assert (batching.enabled, batching.max_batch_size, batching.max_latency_ms) == (on, size, latency)
        engine = backends.engine_class(name)
        assert callable(engine.open) and callable(engine.run) and callable(engine.describe), name
    assert SPECS["coreml"].runner_name == "coreml-batched" and "coreml" not in RUNNERS


def test_the_front_depends_on_every_runner_that_runs_here_and_no_other() -> None:
    import service

    # Untuned, with one front worker, the default backend's engine is in the front worker: no runner of it.
    in_front, source = service.FastInfer.inner.engines_in_front  # decided when this process first imported it
    assert len(in_front) == 1 and source == "default"
    expected = {r.replace("-", "_") for r in RUNNERS if runs_here(r) and r not in in_front}
    assert set(service.FastInfer.dependencies) == expected
    assert {"openvino", "openvino_int8"} - {r.replace("-", "_") for r in in_front} <= expected
    assert ("coreml_batched" in expected) == sys.platform.startswith("darwin")


def test_fastinfer_backends_switches_runners_off_and_says_so(monkeypatch) -> None:
    monkeypatch.setenv("FASTINFER_BACKENDS", " onnx-int8 , onnx,coreml")
    assert backends.switched_on() == ("onnx", "onnx-int8", "coreml")  # the table's order
    assert runs_here("onnx") and not runs_here("pytorch") and not runs_here("openvino-int8")
    assert runs_here("coreml-batched") == sys.platform.startswith("darwin")  # coreml's runner
    reason = unavailable_reason("pytorch")
    assert reason is not None and reason.startswith("switched off: FASTINFER_BACKENDS=onnx,onnx-int8,coreml")
    assert (unavailable_reason("coreml-batched") or "").startswith("switched off")  # not "needs macOS"
    monkeypatch.setenv("FASTINFER_BACKENDS", "all")
    assert backends.switched_on() == BACKENDS


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"FASTINFER_BACKENDS": "onnx,tensorrt"}, "FASTINFER_BACKENDS names no backend: 'tensorrt'"),
        ({"FASTINFER_BACKENDS": " , ,"}, "FASTINFER_BACKENDS names no backend: ', ,'"),
        ({"FASTINFER_BACKENDS": "onnx-int8", "FASTINFER_DEFAULT_BACKEND": "onnx"}, "is not among FASTINFER_BACKENDS"),
        ({"FASTINFER_BACKENDS": "onnx", "FASTINFER_IN_FRONT": "pytorch"}, "FASTINFER_BACKENDS leaves out: pytorch"),
    ],
)
def test_a_fastinfer_backends_that_cannot_hold_stops_start_up_in_one_line(monkeypatch, env, said) -> None:
    with pytest.raises(ValueError, match=said):
        settings_with(monkeypatch, **env)


def test_the_front_depends_only_on_the_runners_switched_on() -> None:
    """In a fresh interpreter: the front's dependencies are fixed when service.py is imported."""
    code = "import service; print(sorted(service.FastInfer.dependencies))"
    env = {**os.environ, "FASTINFER_BACKENDS": "onnx-int8,onnx-int8-dynamic", "FASTINFER_DEFAULT_BACKEND": "auto",
           "FASTINFER_IN_FRONT": "none"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "['onnx_int8', 'onnx_int8_dynamic']"


@pytest.fixture
def without_openvino(monkeypatch) -> Iterator[None]:
    """``import openvino`` would fail here: its package is not found."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    backends.openvino_missing.cache_clear()
    yield
    backends.openvino_missing.cache_clear()


def test_without_openvino_its_backends_say_why_and_its_runners_do_not_start(built_models, without_openvino) -> None:
    assert not runs_here("openvino") and not runs_here("openvino-int8") and runs_here("onnx")
    reason = unavailable_reason("openvino-int8")
    assert reason is not None and "OpenVINO is not installed" in reason and "resnet50-openvino-int8" in reason
    assert unavailable_reason("onnx-int8") is None


def test_a_missing_model_is_named(built_models, monkeypatch) -> None:
    real = store.find
    monkeypatch.setattr(
        store, "find", lambda artifact, batch=None: None if artifact == "openvino" else real(artifact, batch)
    )
    assert unavailable_reason("openvino") == ("resnet50-openvino not in the model store; run `python -m build_models`")


def test_without_openvino_and_without_its_models_the_reason_is_openvino(
    built_models, monkeypatch, without_openvino
) -> None:
    real = store.find
    monkeypatch.setattr(
        store, "find", lambda artifact, batch=None: None if "openvino" in artifact else real(artifact, batch)
    )
    reason = unavailable_reason("openvino")
    assert reason is not None and reason.startswith("OpenVINO is not installed") and "model store" not in reason


def test_every_backend_has_a_build_step() -> None:
    from build_models import ARTIFACTS

    for name, spec in SPECS.items():
        artifact = ARTIFACTS[spec.artifact]  # KeyError: a backend whose models nothing builds
        assert set(spec.static_batches) <= set(artifact.batches), name


def test_a_runner_whose_runtime_cannot_be_imported_stays_up_and_says_why(built_models, monkeypatch) -> None:
    """A corrupt model: tests/unit/test_store_health.py."""
    import runners.base

    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    runner = runners.base.make_runner("openvino-int8").inner()

    described = runner.describe()
    assert described["error"].startswith("openvino-int8 could not be loaded: ")
    assert len(described["error"]) <= 330 and "\n" not in described["error"]
    with pytest.raises(ServiceUnavailable, match="could not be loaded"):
        asyncio.run(runner.infer(np.zeros((1, 224, 224, 3), np.uint8)))


def test_a_failed_load_is_retried_and_then_serves(built_models, monkeypatch) -> None:
    """A transient failure: not ready, and the readiness probe starts the retry (a request's _loaded() does too)."""
    import runners.base

    attempts = []

    def flaky(backend: str, threads: int, dirs: dict) -> object:
        attempts.append(backend)
        if len(attempts) == 1:
            raise MemoryError("a transient failure")
        return open_engine(backend, threads, dirs)

    monkeypatch.setattr(runners.base, "open_engine", flaky)
    monkeypatch.setattr(runners.base, "RELOAD_AFTER_S", 0.0)
    runner = runners.base.make_runner("onnx-int8").inner()
    assert "MemoryError: a transient failure" in runner.describe()["error"]

    async def probe_until_ready() -> list[bool]:
        answers = [await runner.__is_ready__()]  # not ready: and the probe starts the retry
        await runner._retry
        return [*answers, await runner.__is_ready__()]

    assert asyncio.run(probe_until_ready()) == [False, True] and len(attempts) == 2
    logits = asyncio.run(runner.infer(np.zeros((2, 224, 224, 3), np.uint8)))
    assert logits.shape == (2, 1000) and len(attempts) == 2 and "error" not in runner.describe()
    assert runner.describe()["batch_sizes_seen"] == {2: 1}  # only real model runs are counted


def test_a_failure_about_this_machine_is_not_retried_and_a_retry_in_progress_does_not_block(
    built_models, monkeypatch
) -> None:
    import runners.base

    attempts = []

    def crash(backend: str, threads: int, dirs: dict) -> object:
        attempts.append(backend)
        raise EngineUnavailable("OpenVINO compile_model crashed with SIGFPE on this CPU")

    monkeypatch.setattr(runners.base, "open_engine", crash)
    monkeypatch.setattr(runners.base, "RELOAD_AFTER_S", 0.0)
    runner = runners.base.make_runner("openvino-int8").inner()
    for _ in range(3):
        with pytest.raises(ServiceUnavailable, match="SIGFPE on this CPU"):
            asyncio.run(runner.infer(np.zeros((1, 224, 224, 3), np.uint8)))
    assert attempts == ["openvino-int8"]  # loaded once, at start-up
    assert asyncio.run(runner.__is_ready__()) is True  # not ready would hold the server: like a runner not started

    runner.lasting = False  # a transient failure, with a retry already running: answered at once

    async def while_reloading() -> None:
        async with runner._reloading:
            with pytest.raises(ServiceUnavailable):
                await runner.infer(np.zeros((1, 224, 224, 3), np.uint8))

    asyncio.run(while_reloading())
    assert attempts == ["openvino-int8"]


def test_doctor_recommends_only_what_loaded(built_models, monkeypatch, tmp_path) -> None:
    def failing(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("openvino"):
            raise EngineUnavailable("OpenVINO compile_model crashed with SIGFPE on this CPU")
        return open_engine(name, *args, **kwargs)

    monkeypatch.setattr(backends, "open_engine", failing)
    report = doctor_report(tmp_path)
    assert report["backends"]["openvino-int8"]["available"] is False
    assert "SIGFPE" in report["backends"]["openvino-int8"]["reason"]
    # The rule's choice among what loaded: onnx-int8 on any x86 CPU once OpenVINO is out.
    loaded = [name for name, entry in report["backends"].items() if entry["available"]]
    assert not any(name.startswith("openvino") for name in loaded)
    assert report["recommended"] == choice.recommend(report["hardware"], loaded)
    assert report["recommended"]["backend"] == "onnx-int8"


def test_a_runner_neither_logs_counts_nor_traces_each_call() -> None:
    """The front logs, counts and traces every request; BentoML doing it again per call costs the runner."""
    import runners.base

    config = runners.base.make_runner("onnx-int8").config
    assert config["logging"]["access"]["enabled"] is False and config["metrics"]["enabled"] is False
    assert set(config["tracing"]["excluded_urls"]) == {"/infer", "/infer_batched", "/describe"}


def test_bentomls_configuration_turns_a_runners_telemetry_on_by_its_name(tmp_path: Path) -> None:
    """docs/metrics.md#runner-telemetry: a configuration file's section for one runner beats FastInfer's defaults;
    settings for all services do not reach it."""
    config = tmp_path / "bentoml.yaml"
    runner = "  runner-onnx-int8:\n    logging: {access: {enabled: true}}\n"
    config.write_text(f"services:\n  metrics: {{enabled: true}}\n{runner}")
    code = (
        "import service\nfrom bentoml._internal.configuration.containers import BentoMLContainer\n"
        "service.FastInfer.inject_config()\nc = BentoMLContainer.config.services['runner-onnx-int8'].get()\n"
        "print(c['logging']['access']['enabled'], c['metrics']['enabled'])"
    )
    env = operator_env(BENTOML_CONFIG=str(config))
    ran = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip().splitlines()[-1] == "True False"


def operator_env(**given: str) -> dict[str, str]:
    """This environment without BentoML's configuration (a developer's shell may set it), then ``given``."""
    unset = ("BENTOML_CONFIG", "BENTOML_CONFIG_OPTIONS", "BENTOML_CONFIG_OVERRIDES")
    return {**{k: v for k, v in os.environ.items() if k not in unset}, **given}


@pytest.mark.parametrize(
    ("options", "config", "dropped"),
    [
        ("", None, True),
        ("tracing.sample_rate=0.0", None, True),
        ("tracing.sample_rate=0.5", None, False),
        ("services.tracing.sample_rate=0.5", None, False),  # BentoML 1.4 layers services.* over each service
        ("services.fastinfer.tracing.sample_rate=0.1", None, False),  # the front samples: its runners' spans follow
        ("tracing.exporter_type=otlp", None, False),
        (None, "services:\n  tracing:\n    sample_rate: 1.0\n", False),  # a configuration file
    ],
)
def test_a_runner_keeps_its_spans_wherever_tracing_is_configured(tmp_path, options, config, dropped: bool) -> None:
    """As an operator configures BentoML: its config options or file in the environment of a fresh process."""
    env = operator_env()
    if options is not None:
        env["BENTOML_CONFIG_OPTIONS"] = options
    if config is not None:
        (tmp_path / "bentoml.yaml").write_text(config)
        env["BENTOML_CONFIG"] = str(tmp_path / "bentoml.yaml")
    code = "import runners.base; print('tracing' in runners.base.hop_uninstrumented())"
    ran = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip().splitlines()[-1] == str(dropped)
