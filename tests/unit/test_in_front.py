"""FASTINFER_IN_FRONT: a backend's engine in the front worker's own process (runners/base.py RunnerCore,
called by runners/calls.py without a hop). The same answers and the same refusals as through a runner:
the model version held, the deadline, a model that could not load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from fastinfer.catalog import holdings
from fastinfer.catalog.backends import SPECS, open_engine
from fastinfer.catalog.choice import PLACED_ENV, engines_in_front, keep_placement, placement
from fastinfer.common.errors import RequestTimeout, RunnerNotLoaded
from fastinfer.serving import deadlines
from runners import REGISTRY, attribute
from runners.base import RunnerCore
from runners.calls import RunnerCalls
from tests.conftest import ROOT
from tests.settings import settings_with

BACKEND = "onnx-int8"


def test_the_setting_names_backends_and_becomes_their_runners(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_with(monkeypatch, FASTINFER_IN_FRONT="").in_front == frozenset()
    chosen = settings_with(monkeypatch, FASTINFER_IN_FRONT=" openvino-int8, coreml ,,")
    assert chosen.in_front == {"openvino-int8", "coreml-batched"}  # coreml is served by coreml-batched's runner
    with pytest.raises(ValueError, match=r"names no backend: 'onnx-fast'; valid: pytorch, onnx"):
        settings_with(monkeypatch, FASTINFER_IN_FRONT="onnx,onnx-fast")
    with pytest.raises(ValueError, match="needs FASTINFER_FRONT_WORKERS=1"):
        settings_with(monkeypatch, FASTINFER_IN_FRONT="onnx", FASTINFER_FRONT_WORKERS="2")
    assert settings_with(monkeypatch, FASTINFER_IN_FRONT="", FASTINFER_FRONT_WORKERS="2").in_front == frozenset()


@pytest.fixture(scope="module")
def core(built_models) -> RunnerCore:
    return RunnerCore(BACKEND)


def calls_over(core: RunnerCore, tag: str | None = None) -> RunnerCalls:
    """RunnerCalls of a front whose only runner is ``core``, in its process (no bentoml.depends)."""
    models = {BACKEND: SimpleNamespace(tag=tag or core.models[0])}
    return RunnerCalls(SimpleNamespace(), models, {}, timeout_s=30, local={attribute(BACKEND): core})  # type: ignore[arg-type]


def test_the_answer_is_the_engines_and_batches_form_in_the_front(core: RunnerCore) -> None:
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    expected = open_engine(BACKEND, 1, {None: holdings.serving(SPECS[BACKEND].artifact).path}).run(pixels)
    calls = calls_over(core)
    before = core.calls["infer_batched"]

    async def three_at_once() -> list[np.ndarray]:
        return await asyncio.gather(*(calls.infer(BACKEND, pixels[i : i + 1], None, core.engine_id) for i in range(3)))

    sizes_before = dict(core.batch_sizes)
    answers = np.concatenate(asyncio.run(three_at_once()))
    np.testing.assert_allclose(answers, expected, rtol=1e-4, atol=1e-4)
    assert core.calls["infer_batched"] == before + 3  # the backend's batching setting holds in the front
    formed = [size for size, n in core.batch_sizes.items() if n > sizes_before.get(size, 0)]
    assert max(formed) > 1  # the three waited for the model together: batched
    described = asyncio.run(calls.describe(REGISTRY[BACKEND].runner))
    assert described["placement"] == "front worker" and described["models"] == core.models


def test_another_model_version_is_refused_not_computed(core: RunnerCore) -> None:
    calls = calls_over(core, tag="resnet50-onnx-int8:elsewhere")
    seen = sum(core.batch_sizes.values())
    with pytest.raises(RunnerNotLoaded, match=r"holds resnet50-onnx-int8:.*, not resnet50-onnx-int8:elsewhere"):
        asyncio.run(calls.infer(BACKEND, np.zeros((1, 224, 224, 3), np.uint8), False, core.engine_id))
    assert sum(core.batch_sizes.values()) == seen


def test_the_engine_says_what_computes_and_another_engine_is_refused_not_computed(core: RunnerCore) -> None:
    calls = calls_over(core)
    identity = asyncio.run(calls.engine(BACKEND))
    assert identity == core.engine_id and identity.startswith("ONNX Runtime ")
    assert "CPUExecutionProvider" in identity and "CPU instructions" in identity
    assert asyncio.run(calls.describe(REGISTRY[BACKEND].runner))["engine"] == identity
    wrong = identity.replace("ONNX Runtime", "ONNX Runtime 0.1")
    seen = sum(core.batch_sizes.values())
    with pytest.raises(RunnerNotLoaded, match=r"computes with ONNX Runtime .*, not ONNX Runtime 0\.1"):
        asyncio.run(calls.infer(BACKEND, np.zeros((1, 224, 224, 3), np.uint8), False, wrong))
    assert sum(core.batch_sizes.values()) == seen
    assert REGISTRY[BACKEND].runner not in calls.engines, "asked again after a refusal"


def test_a_request_past_its_deadline_is_dropped_as_a_504(core: RunnerCore, monkeypatch) -> None:
    monkeypatch.setattr(deadlines, "remaining", lambda: 1e-9)  # due before the model can take it
    with pytest.raises(RequestTimeout):
        asyncio.run(calls_over(core).infer(BACKEND, np.zeros((1, 224, 224, 3), np.uint8), False, core.engine_id))


def test_a_model_that_could_not_load_is_a_503_with_its_reason(built_models, monkeypatch) -> None:
    import runners.base

    def fails(*args: object) -> object:
        raise MemoryError("a transient failure")

    monkeypatch.setattr(runners.base, "open_engine", fails)
    broken = RunnerCore(BACKEND)
    calls = calls_over(broken, tag="resnet50-onnx-int8:any")
    with pytest.raises(RunnerNotLoaded, match="onnx-int8 could not be loaded: MemoryError: a transient failure"):
        asyncio.run(calls.infer(BACKEND, np.zeros((1, 224, 224, 3), np.uint8), None, broken.engine_id))
    assert "could not be loaded" in (calls.unavailable(BACKEND) or "")  # remembered, like a runner's
    assert asyncio.run(broken.__is_ready__()) is False


def test_asking_the_engine_of_a_runner_that_could_not_load_retries_the_load_when_due(built_models, monkeypatch) -> None:
    """A request heals a runner whose load failed (README): the engine is asked first, so asking it must
    retry the load when due, as a call to infer does (`describe` does not)."""
    import runners.base

    real = runners.base.open_engine
    monkeypatch.setattr(runners.base, "open_engine", lambda *a, **k: (_ for _ in ()).throw(MemoryError("transient")))
    broken = RunnerCore(BACKEND)
    calls = calls_over(broken, tag="resnet50-onnx-int8:any")
    with pytest.raises(RunnerNotLoaded, match="MemoryError: transient"):
        asyncio.run(calls.engine(BACKEND))
    monkeypatch.setattr(runners.base, "open_engine", real)  # the cause healed
    broken.failed_at -= runners.base.RELOAD_AFTER_S  # and a retry is due
    calls.failures.clear()  # the front's memory of it has expired
    assert asyncio.run(calls.engine(BACKEND)) == broken.engine_id != ""


def test_a_bento_built_with_engines_in_front_still_packs_their_models(built_models) -> None:
    """`bentoml build` packs the models of the services in the graph; the in-front runners leave it, so
    the front carries their models: the packed set does not depend on the setting."""
    script = (
        "import json, service; s = service.FastInfer.all_services(); "
        "print(json.dumps([sorted(s), sorted(str(m) for v in s.values() for m in v.models)]))"
    )

    def graph(in_front: str) -> list:
        env = {**os.environ, "FASTINFER_IN_FRONT": in_front}
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    (services, models), (fewer, same) = graph("none"), graph("onnx-int8,openvino-int8")
    assert "runner-onnx-int8" in services and "runner-onnx-int8" not in fewer and "runner-openvino-int8" not in fewer
    assert same == models and "resnet50-onnx-int8:latest" in models


def test_no_runner_api_is_shadowed_by_a_cores_attribute(core: RunnerCore) -> None:
    """BentoML reaches a runner's API by its name on the instance: an attribute of the same name (the core's
    ``engine``) hides it and the runner cannot start ('OnnxEngine' object has no attribute 'local')."""
    from runners.base import make_runner

    assert set(make_runner(BACKEND).apis) & set(vars(core)) == set()


def test_untuned_with_one_front_worker_the_default_backends_engine_runs_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where it served most in `make bench`'s placement step (docs/architecture.md); said as the default. The
    default backend is asked for only where the placement falls to it."""
    untuned = settings_with(monkeypatch, "FASTINFER_IN_FRONT", "FASTINFER_FRONT_WORKERS", FASTINFER_TUNED="off")
    assert engines_in_front(untuned, lambda: "onnx-int8") == ({SPECS["onnx-int8"].runner_name}, "default")
    assert engines_in_front(untuned, lambda: "coreml") == (frozenset(), "default")  # no runner of it here (not macOS)
    never = lambda: pytest.fail("the default backend asked for where the placement does not follow it")  # noqa: E731
    two = settings_with(monkeypatch, "FASTINFER_IN_FRONT", FASTINFER_FRONT_WORKERS="2", FASTINFER_TUNED="off")
    assert engines_in_front(two, never) == (frozenset(), "default")  # each worker would load its own
    monkeypatch.delenv("FASTINFER_FRONT_WORKERS")
    runners = settings_with(monkeypatch, "FASTINFER_IN_FRONT", FASTINFER_RUNNER_WORKERS="2", FASTINFER_TUNED="off")
    assert engines_in_front(runners, never) == (frozenset(), "default")  # the runner's workers were asked for
    monkeypatch.delenv("FASTINFER_RUNNER_WORKERS")
    none = settings_with(monkeypatch, FASTINFER_IN_FRONT="none", FASTINFER_TUNED="off")
    assert engines_in_front(none, never) == (frozenset(), "environment")
    named = settings_with(monkeypatch, FASTINFER_IN_FRONT="openvino-int8", FASTINFER_TUNED="off")
    assert engines_in_front(named, never) == ({"openvino-int8"}, "environment")
    empty = settings_with(monkeypatch, FASTINFER_IN_FRONT=" ", FASTINFER_TUNED="off")  # empty is unset
    assert engines_in_front(empty, lambda: "onnx") == ({SPECS["onnx"].runner_name}, "default")
    # A tuned file in force decides: one that chose the runner leaves the variable out (tune_space.PLAIN).
    tuned = untuned.model_copy(update={"tuned": {"status": "in force", "settings": {}}})
    assert engines_in_front(tuned, never) == (frozenset(), "tuned")


def test_a_servers_workers_take_the_placement_its_parent_started_the_runners_by(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Decided once by `bentoml serve`'s parent (service.py's deployment hook): a worker restarted after the
    default backend would change still holds the engine whose runner was not started."""
    settings = settings_with(monkeypatch, "FASTINFER_IN_FRONT", FASTINFER_DEFAULT_BACKEND="onnx", FASTINFER_TUNED="off")
    monkeypatch.setenv(PLACED_ENV, "")  # recorded, so that the test's end takes away what keep_placement sets
    monkeypatch.delenv(PLACED_ENV)
    assert placement(settings) == ({SPECS["onnx"].runner_name}, "default")
    keep_placement(({"openvino-int8"}, "default"))
    code = "from fastinfer.catalog import choice, config; print(choice.placement(config.get_settings()))"
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert child.stdout.splitlines()[-1] == "(frozenset({'openvino-int8'}), 'default')"  # a child: its parent's
    assert placement(settings) == ({SPECS["onnx"].runner_name}, "default")  # not set by this one's parent
    ours = {"source": "default", "pid": os.getppid()}  # as this process's parent would set it, but:
    onnx = SPECS["onnx"].runner_name
    mistyped = [{**ours, "runners": {onnx: 1}}, {**ours, "runners": ""}, {**ours, "runners": onnx},
                {**ours, "runners": [], "pid": float(os.getppid())}]  # fmt: skip
    for bad in ("{", '{"runners": ["no-such-runner"], "source": "default"}', '{"runners": [], "source": "x"}',
                *map(json.dumps, mistyped)):  # fmt: skip
        monkeypatch.setenv(PLACED_ENV, bad)
        assert placement(settings) == ({SPECS["onnx"].runner_name}, "default")  # decided here, and said
    assert f"{PLACED_ENV} was not set by this server's parent" in caplog.text
