"""The backend table: one row per backend, from which names, settings, runners and engines derive;
and what happens when a backend's engine cannot load (its runner stays up and says why)."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from bentoml.exceptions import ServiceUnavailable

from fastinfer import backends, store
from fastinfer.backends import BACKENDS, RUNNERS, SPECS, open_engine, runs_here, unavailable_reason
from fastinfer.config import get_settings


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

    expected = {r.replace("-", "_") for r in RUNNERS if runs_here(r)}
    assert set(service.FastInfer.dependencies) == expected
    assert "openvino" in expected and "openvino_int8" in expected
    assert ("coreml_batched" in expected) == sys.platform.startswith("darwin")


def test_without_openvino_its_backends_say_why_and_its_runners_do_not_start(built_models, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    backends.openvino_missing.cache_clear()
    try:
        assert not runs_here("openvino") and not runs_here("openvino-int8") and runs_here("onnx")
        reason = unavailable_reason("openvino-int8")
        assert reason is not None and "OpenVINO is not installed" in reason and "resnet50-openvino-int8" in reason
        assert unavailable_reason("onnx-int8") is None
    finally:
        backends.openvino_missing.cache_clear()


def test_a_missing_model_is_named(built_models, monkeypatch) -> None:
    real = store.find
    monkeypatch.setattr(
        store, "find", lambda artifact, batch=None: None if artifact == "openvino" else real(artifact, batch)
    )
    assert unavailable_reason("openvino") == ("resnet50-openvino not in the model store; run `python -m build_models`")


def corrupt_copy(name: str, tmp_path: Path) -> Path:
    copy = tmp_path / name
    shutil.copytree(store.find(name).path, copy)
    weights = copy / "model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    return copy


@pytest.mark.parametrize("fault", ["corrupt model", "runtime not importable"])
def test_a_runner_whose_engine_cannot_load_stays_up_and_says_why(built_models, monkeypatch, tmp_path, fault) -> None:
    import runners.base

    if fault == "corrupt model":
        broken = corrupt_copy("openvino-int8", tmp_path)
        monkeypatch.setattr(
            runners.base, "open_engine", lambda backend, threads, dirs: open_engine(backend, threads, {None: broken})
        )
    else:
        monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    runner = runners.base.make_runner("openvino-int8").inner()

    described = runner.describe()
    assert described["error"].startswith("openvino-int8 could not be loaded: ")
    assert len(described["error"]) <= 330 and "\n" not in described["error"]
    with pytest.raises(ServiceUnavailable, match="could not be loaded"):
        asyncio.run(runner.infer(np.zeros((1, 224, 224, 3), np.uint8)))
