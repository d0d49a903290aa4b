"""Serving a model family other than ImageNet's: FASTINFER_MODEL picks it, answers carry its labels, top_k is
capped at its class count, what the server says of itself (/backends, the API page, doctor, /metrics) names it,
and a family missing from the store is said in one line. The stored models are real entries of a store of the
test's own, with what a build writes; a trained family served for real: tests/integration/test_own_family.py."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY as METRICS

from fastinfer.catalog import backends, config, family, holdings, store, store_check
from fastinfer.catalog.choice import PLACED_ENV
from fastinfer.catalog.store import PreprocessSpec, StoredModelInfo
from fastinfer.front.image_api import FormRules, answer
from fastinfer.front.image_routes import ROUTES
from fastinfer.serving.cache import MemoryCache
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.live import LiveStats
from fastinfer.serving.pipeline import Pipeline
from tests import images
from tests.conftest import doctor_report, model_store_at
from tests.settings import settings_with
from tests.unit.test_image_api import request
from tests.unit.test_pipeline import make

SHAPES = ["circle", "square", "triangle"]  # N = 3


ACCURACY = {"eval_dir": "/data/shapes/heldout", "images": 30, "skipped": 1, "top1": 0.9667, "top5": 1.0,
            "reference_top1": 0.9667, "reference_top5": 1.0, "precision": "int8"}  # fmt: skip
DESCRIPTION = "fine-tuned on 30 shape photos (shapes.pth)"


# --- FASTINFER_MODEL -------------------------------------------------------------------------------------


def test_the_family_served_is_a_setting(monkeypatch) -> None:
    assert settings_with(monkeypatch, "FASTINFER_MODEL").model == "resnet50"
    assert settings_with(monkeypatch, FASTINFER_MODEL="shapes").model == "shapes"
    assert settings_with(monkeypatch, FASTINFER_MODEL=" my_shop.v2 ").model == "my_shop.v2"


@pytest.mark.parametrize("bad", ["Shapes", "shapes/../x", "-shapes", "a" * 41, "shapes:v1", "ünicode"])
def test_a_family_name_the_store_cannot_hold_stops_start_up_in_one_line(monkeypatch, bad: str) -> None:
    with pytest.raises(ValueError) as caught:
        settings_with(monkeypatch, FASTINFER_MODEL=bad)
    said = str(caught.value)
    assert said.startswith("FASTINFER_MODEL: ") and "cannot name a model family" in said and "\n" not in said


def test_a_bento_built_for_a_family_serves_it(monkeypatch) -> None:
    """`make bento MODEL=NAME` builds with the bento argument model=NAME, which BentoML sets again wherever
    the bento is served: unset, FASTINFER_MODEL becomes it (for this process and those it starts)."""
    from bentoml._internal.utils.args import set_arguments

    monkeypatch.setenv("FASTINFER_MODEL", "")  # unset for the settings; restored after the test
    set_arguments({"model": "shapes"})
    try:
        assert settings_with(monkeypatch).model == "shapes"
        assert store.family() == "shapes" and store.model_name("onnx") == "shapes-onnx"
        # Set by the operator, FASTINFER_MODEL wins over what the bento was built for.
        assert settings_with(monkeypatch, FASTINFER_MODEL="resnet50").model == "resnet50"
    finally:
        set_arguments({})


def test_the_service_puts_its_family_in_the_bento_environment() -> None:
    """`bentoml build` copies a service's ``envs`` into the bento (its image's ENV)."""
    import service

    assert [(env.name, env.value) for env in service.FastInfer.envs] == [("FASTINFER_MODEL", "resnet50")]


def test_a_bento_built_with_fastinfer_backends_carries_it() -> None:
    """Built with FASTINFER_BACKENDS, a bento packs only those backends' models: served without the setting it
    would start runners with no model. So the setting goes into its image's environment too."""
    import os
    import subprocess
    import sys

    code = "import service; print([(e.name, e.value) for e in service.FastInfer.envs])"
    env = {**os.environ, "FASTINFER_BACKENDS": "onnx-int8, onnx", "FASTINFER_DEFAULT_BACKEND": "onnx"}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    said = out.stdout.strip().splitlines()[-1]
    assert said == "[('FASTINFER_MODEL', 'resnet50'), ('FASTINFER_BACKENDS', 'onnx,onnx-int8')]"


# --- top_k is capped at the family's class count ----------------------------------------------------------


def info(backend: str, categories: list[str] = SHAPES, **extra: Any) -> StoredModelInfo:
    return StoredModelInfo(
        tag=f"shapes-{backend}:v1",
        path="/nowhere",
        backend=backend,
        weights="file",
        source_hash="x",
        preprocess=PreprocessSpec(resize_size=160, crop_size=128),
        categories=categories,
        family="shapes",
        num_classes=len(categories),
        **extra,
    )


class ThreeClasses:
    """A stand-in runner of a 3-class family: the top class is the image's mean pixel value mod 3."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    async def engine(self, backend: str) -> str:
        return f"stand-in for {backend}"

    async def __call__(self, backend: str, pixels: np.ndarray, batched: bool | None, engine: str) -> np.ndarray:
        self.shapes.append(pixels.shape)
        logits = np.zeros((len(pixels), 3), np.float32)
        for row, image in enumerate(pixels):
            logits[row, int(image.mean()) % 3] = 5.0
        return logits


def three_class_pipeline(categories: list[str] = SHAPES) -> tuple[Pipeline, ThreeClasses]:
    return make(runner=ThreeClasses(), models={n: info(n, categories) for n in ["pytorch", "onnx"]})


def grey_png(level: int) -> bytes:
    from PIL import Image

    return images.encode(Image.new("RGB", (300, 200), (level, level, level)), "PNG")


def asked(
    path: str, fields: dict[str, str], query: str = "", categories: list[str] = SHAPES
) -> tuple[int, dict[str, Any], ThreeClasses]:
    """The front's answer to a request on ``path`` (parsed as the HTTP lane parses it) with these fields, or,
    with ``query``, the image as the whole body and the fields in the query string."""
    pipeline, runner = three_class_pipeline(categories)
    if query:
        scope, body = request(path, query, content=grey_png(100), headers={"content-type": "image/png"})
    else:
        field = "images" if path == "/classify/batch" else "image"
        scope, body = request(path, files={field: ("a.png", grey_png(100))}, data=fields)
    rules = FormRules(default_backend="onnx", max_batch_images=4)
    status, payload = asyncio.run(answer(pipeline, ROUTES[path], scope, body, rules))
    pipeline.cpu.close()
    return status, payload, runner


def answers(path: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    return payload["results"] if path in ("/classify/batch", "/compare") else [payload]


CAPPED_ROUTES = ["/classify", "/classify/batch", "/compare", "/predict", "/predict/onnx", "/predict/batched"]


@pytest.mark.parametrize("path", CAPPED_ROUTES)
def test_top_k_beyond_the_family_s_classes_is_a_400_naming_them(path: str) -> None:
    status, payload, runner = asked(path, {"top_k": "4"})
    assert status == 400, payload
    error = payload["error"]
    assert error["code"] == "invalid_top_k"
    assert "more than the 3 classes of model family 'shapes'" in error["message"] and "1 to 3" in error["message"]
    assert runner.shapes == []  # refused before any work


@pytest.mark.parametrize("path", CAPPED_ROUTES)
def test_top_k_up_to_the_family_s_classes_answers_with_its_labels(path: str) -> None:
    for k in ("1", "3"):
        status, payload, runner = asked(path, {"top_k": k})
        assert status == 200, payload
        for one in answers(path, payload):
            assert len(one["top_k"]) == int(k)
            assert one["class"] == "square" and one["class_index"] == 1  # 100 % 3: the family's own label
            assert {p["label"] for p in one["top_k"]} <= set(SHAPES)
        assert runner.shapes and all(shape[1:] == (128, 128, 3) for shape in runner.shapes)  # its crop size


@pytest.mark.parametrize("path", CAPPED_ROUTES)
def test_without_top_k_a_small_family_ranks_every_class(path: str) -> None:
    """The default (5) is more than 3 classes: a request that asks for nothing is not refused for it."""
    status, payload, _ = asked(path, {})
    assert status == 200, payload
    assert all([p["label"] for p in one["top_k"]][:1] == ["square"] and len(one["top_k"]) == 3
               for one in answers(path, payload))  # fmt: skip


@pytest.mark.parametrize("path", [*CAPPED_ROUTES, "/predict/quantized", "/predict/openvino"])
@pytest.mark.parametrize("sent", ["21", "0", "five", "999"])
@pytest.mark.parametrize("form", ["multipart", "query"])
def test_top_k_outside_the_outer_bound_names_the_family_s_classes(path: str, sent: str, form: str) -> None:
    """Beyond TOP_K_MAX too (or no whole number at all), a family of fewer classes is the bound said: not "1 to
    20", which a client would take at its word and be refused again."""
    if form == "query" and path == "/classify/batch":
        pytest.skip("the batch takes multipart only")
    status, payload, runner = asked(path, {"top_k": sent}, query=f"top_k={sent}" if form == "query" else "")
    assert status == 400, payload
    said = payload["error"]["message"]
    assert payload["error"]["code"] == "invalid_top_k" and "1 to 20" not in said, said
    assert "from 1 to 3, the classes of model family 'shapes'" in said and repr(sent) in said, said
    assert runner.shapes == []


def test_top_k_keeps_its_outer_bound_for_a_family_of_more_classes() -> None:
    many = [f"class {i}" for i in range(1000)]
    for sent in ("21", "0"):
        status, payload, _ = asked("/classify", {"top_k": sent}, categories=many)
        said = payload["error"]["message"]
        assert status == 400 and said == f"top_k: must be a whole number from 1 to 20; got {sent!r}", said
    twenty = [f"class {i}" for i in range(20)]  # exactly TOP_K_MAX classes: the outer bound is the family's too
    assert "from 1 to 20;" in asked("/classify", {"top_k": "21"}, categories=twenty)[1]["error"]["message"]


def test_a_large_family_is_capped_by_the_outer_bound_only() -> None:
    many = [f"class {i}" for i in range(1000)]
    assert Pipeline.ranked(20, [info("onnx", many)]) == 20 and Pipeline.ranked(None, [info("onnx", many)]) == 5
    assert Pipeline.ranked(None, [info("onnx", ["a", "b"])]) == 2


# --- paths and store health of any family -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "artifact"),
    [("shapes-coreml-b4", "coreml"), ("a-b-onnx-int8-dynamic", "onnx-int8-dynamic"), ("x-onnx-int8", "onnx-int8"),
     ("resnet50-openvino", "openvino"), ("resnet50-openvino-int8", "openvino-int8")],
)  # fmt: skip
def test_a_store_name_s_build_step_for_any_family(name: str, artifact: str) -> None:
    assert store_check.artifact_of(name) == artifact


@pytest.fixture
def own_store(tmp_path: Path) -> Iterator[Path]:
    """An empty BentoML model store of this test's own (BENTOML_HOME and BentoML's store both)."""
    with model_store_at(tmp_path) as home:
        yield home


def stored(name: str, backend: str, *, labels: dict[str, str] | None = None, **metadata: Any) -> Any:
    """A model stored as a build stores one (labels and metadata per the stored-model contract), its one
    file recorded by size and sha256."""
    import bentoml

    family_name = name.removesuffix(f"-{backend}")
    meta = {
        "input": store.input_spec(128),
        "output": store.output_spec(len(SHAPES)),
        "preprocess": {"resize_size": 160, "crop_size": 128, "mean": [0.3, 0.6, 0.5], "std": [0.4, 0.2, 0.3]},
        "categories": SHAPES,
        "num_classes": len(SHAPES),
        "weights_description": DESCRIPTION,
        **metadata,
    }
    tags = {"family": family_name, "backend": backend, "precision": "fp32", "batch": "dynamic", "weights": "file",
            "source_hash": "abc", "build_format": store.BUILD_FORMAT, **(labels or {})}  # fmt: skip
    with bentoml.models.create(name, labels=tags, metadata=meta) as model:
        (Path(model.path) / "model.onnx").write_bytes(b"not really a model")
        model.info.metadata[store_check.FILES_KEY] = store_check.record(Path(model.path))
    return bentoml.models.get(f"{name}:latest")


def test_store_health_of_another_family_rebuilds_it_from_its_own_source(own_store: Path) -> None:
    model = stored("shapes-onnx-int8", "onnx-int8")
    health = store_check.check(model)
    assert health.intact and health.artifact == "onnx-int8" and health.family == "shapes"
    (Path(model.path) / "model.onnx").write_bytes(b"cut")
    health = store_check.check(model)
    assert health.corrupt
    # Its weights and labels are files the store does not keep: the whole family, with its preprocessing (a
    # partial build from files not quite the family's would mix two sources; without the preprocessing it
    # would be built with ImageNet's mean, std and crop).
    assert store_check.rebuild_command([health]) == (
        "python -m build_models --weights PATH --labels PATH --name shapes --mean 0.3,0.6,0.5 --std 0.4,0.2,0.3 "
        "--resize 160 --crop 128 (the whole family, without --only)"
    )


# --- a family missing from the store ----------------------------------------------------------------------


def test_a_family_missing_from_the_store_says_what_it_holds_and_how_to_build(own_store: Path, monkeypatch) -> None:
    stored("tiles-onnx", "onnx")
    stored("tiles-pytorch", "pytorch")
    assert store.families() == {"tiles": ["tiles-onnx", "tiles-pytorch"]}
    monkeypatch.setenv("FASTINFER_MODEL", "shapes")
    why = holdings.missing_reason()
    assert why is not None and "\n" not in why
    assert "no model of family 'shapes'" in why and "tiles (2 models)" in why
    assert "`fastinfer build --weights PATH --labels PATH --name shapes`" in why and "FASTINFER_MODEL=tiles" in why
    # What every backend answers (503): the same line, for any backend.
    assert backends.unavailable_reason("onnx") == why and backends.unavailable_reason("openvino-int8") == why
    with pytest.raises(backends.NotStored, match="no model of family 'shapes'"):
        backends.model_dirs("pytorch")
    # In a server (its pins set at start-up, none of this family): restart once it is built.
    monkeypatch.setenv(store.PINS_ENV, "{}")
    assert backends.unavailable_reason("onnx").endswith(", then restart the server")
    # The family stored: a backend whose model alone is missing says so, and how to build the family.
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    monkeypatch.delenv(store.PINS_ENV)
    assert holdings.missing_reason() is None and backends.unavailable_reason("onnx") is None
    assert backends.unavailable_reason("onnx-int8") == (
        "tiles-onnx-int8 not in the model store; run `fastinfer build --weights PATH --labels PATH --name tiles "
        "--mean 0.3,0.6,0.5 --std 0.4,0.2,0.3 --resize 160 --crop 128` (the whole family, without --only)"
    )


def test_the_build_hint_carries_only_what_differs_from_the_defaults(own_store: Path, monkeypatch) -> None:
    """A family whose preprocessing is the default's, or ImageNet's own family, is told no flag it does not need."""
    from fastinfer.catalog import holdings, rebuild

    plain = {"resize_size": 232, "crop_size": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    stored("tiles-onnx", "onnx", preprocess={**plain, "crop_size": 192})
    assert holdings.build_hint("tiles") == (
        "run `fastinfer build --weights PATH --labels PATH --name tiles --crop 192` (the whole family, without --only)"
    )
    stored("resnet50-onnx", "onnx", labels={"weights": "imagenet"}, preprocess=plain)
    assert holdings.build_hint("resnet50") == "run `python -m build_models`"
    # What is written reads back as the same numbers: the rebuilt family hashes as the stored one.
    spec = store.PreprocessSpec(mean=(0.1234567891234, 0.5, 1 / 3), std=(0.2, 0.2, 0.2))
    said = rebuild.preprocess_args(spec).split()
    assert [float(v) for v in said[1].split(",")] == list(spec.mean) and said[2:] == ["--std", "0.2,0.2,0.2"]


def test_a_server_of_a_family_missing_from_the_store_refuses_to_start_saying_why(
    own_store: Path, monkeypatch, caplog
) -> None:
    """As with any backend not built (BentoML cannot resolve a runner's model and stops), but in our words:
    one ERROR line with what the store holds and how to build the family, and nothing pinned or recorded."""
    import logging

    from bentoml.exceptions import BentoMLException

    import service

    stored("tiles-onnx", "onnx")
    monkeypatch.delenv(store.PINS_ENV, raising=False)
    with caplog.at_level(logging.ERROR, logger="fastinfer.service"), pytest.raises(BentoMLException) as caught:
        service.FastInfer.inner._pin_models()  # the deployment hook: before any worker starts
    assert "model family 'resnet50' is not in the model store" in str(caught.value)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "no model of family 'resnet50'" in line and "it holds tiles (1 models)" in line and "\n" not in line
    assert "`fastinfer build`" in line and "FASTINFER_MODEL=tiles" in line
    assert store.PINS_ENV not in os.environ and not list((own_store / "models").glob(".fastinfer-pinned-*"))


def test_an_empty_store_says_it_holds_no_family(own_store: Path, monkeypatch) -> None:
    monkeypatch.setenv("FASTINFER_MODEL", "shapes")
    assert "it holds no model family at all" in holdings.missing_reason()
    assert holdings.main(["shapes"]) == 1 and holdings.main(["Bad Name"]) == 1  # make's check before serve/bento


# --- the bento carries its family ---------------------------------------------------------------------------


def test_a_bento_built_for_a_family_packs_its_models_and_names_it(own_store: Path) -> None:
    """What `make bento MODEL=shapes` runs (Makefile): the bento argument, kept in the bento and set again
    wherever it is served, FASTINFER_MODEL in its image's environment, and that family's models only."""
    import subprocess
    import sys

    import yaml

    artifacts = {spec.artifact for name, spec in backends.SPECS.items() if backends.runs_here(spec.runner_name)}
    for artifact in artifacts:
        stored(f"shapes-{artifact}", artifact)
    stored("tiles-onnx", "onnx")  # another family in the same store: not packed
    root = Path(__file__).resolve().parents[2]
    env = {"BENTOML_HOME": str(own_store), "BENTOML_DO_NOT_TRACK": "true", "PATH": "/usr/bin:/bin"}
    bentoml_cli = Path(sys.executable).parent / "bentoml"
    built = subprocess.run([str(bentoml_cli), "build", "--arg", "model=shapes", "."], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (manifest,) = (own_store / "bentos" / "fastinfer").glob("*/bento.yaml")
    bento = yaml.safe_load(manifest.read_text())
    assert bento["args"] == {"model": "shapes"}
    assert {"name": "FASTINFER_MODEL", "value": "shapes", "stage": "all"} in bento["envs"]
    packed = {m["tag"].split(":")[0] for svc in bento["services"] for m in svc["models"]}
    assert packed == {f"shapes-{artifact}" for artifact in artifacts}
    dockerfile = (manifest.parent / "env" / "docker" / "Dockerfile").read_text()
    assert "ENV FASTINFER_MODEL=$FASTINFER_MODEL" in dockerfile and "ARG FASTINFER_MODEL=shapes" in dockerfile


# --- what the server says of its family -------------------------------------------------------------------


def test_backends_names_the_family_its_classes_weights_and_accuracy(own_store: Path, monkeypatch) -> None:
    from fastinfer.common import hardware
    from fastinfer.front import inventory
    from runners import REGISTRY

    monkeypatch.setenv("FASTINFER_MODEL", "shapes")
    stored("shapes-onnx", "onnx", accuracy=ACCURACY)
    stored("shapes-pytorch", "pytorch")
    models = backends.served_models()
    assert list(models) == ["pytorch", "onnx"]
    settings = settings_with(monkeypatch)
    answer = inventory.backends(REGISTRY, {}, models, {}, settings, hardware.probe()).model_dump(mode="json")
    assert answer["family"] == {
        "name": "shapes",
        "stored": True,
        "num_classes": 3,
        "weights": "file",
        "weights_description": DESCRIPTION,
        "preprocess": {"resize_size": 160, "crop_size": 128, "mean": [0.3, 0.6, 0.5], "std": [0.4, 0.2, 0.3]},
        "accuracy": {"onnx": {k: v for k, v in ACCURACY.items() if k != "eval_dir"}},  # not the builder's path
        "missing": None,
        "labels": SHAPES,  # in index order: a client scores answers by them without the server's store
    }
    by_name = {b["name"]: b for b in answer["backends"]}
    assert by_name["onnx"]["accuracy"]["top1"] == 0.9667 and by_name["pytorch"]["accuracy"] is None
    assert by_name["onnx"]["model"].startswith("shapes-onnx:")


def test_the_api_page_and_metrics_name_the_family(own_store: Path, monkeypatch) -> None:
    from fastinfer.front.api_page import family_line
    from fastinfer.serving.metrics import record_family

    monkeypatch.setenv("FASTINFER_MODEL", "shapes")
    stored("shapes-onnx-int8", "onnx-int8", accuracy=ACCURACY)
    served = family.summary("shapes", backends.served_models())
    line = family_line(served)
    assert line.startswith("Model family `shapes` (`FASTINFER_MODEL`): 3 classes, `top_k` up to 3")
    assert "weights: file (fine-tuned on 30 shape photos (shapes.pth))" in line
    # Top-5 of 3 classes holds every class (100% whatever the model does): not shown, nor any "top-3".
    assert "onnx-int8 top-1 96.7% (int8)" in line and "top-5" not in line and "top-3" not in line
    record_family(served)
    labels = {"family": "shapes", "classes": "3", "weights": "file", "weights_description": DESCRIPTION}
    assert METRICS.get_sample_value("fastinfer_model_family_info", labels) == 1
    top1 = {"family": "shapes", "backend": "onnx-int8", "metric": "top1", "precision": "int8"}
    assert METRICS.get_sample_value("fastinfer_model_accuracy", top1) == pytest.approx(0.9667)
    assert METRICS.get_sample_value("fastinfer_model_accuracy", {**top1, "metric": "top5"}) is None
    missing = family_line(family.summary("nothing", {}))
    assert missing.startswith("Model family `nothing`: not served: the model store holds no model of family")


def test_doctor_names_the_family(own_store: Path, monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("FASTINFER_MODEL", "shapes")
    monkeypatch.setenv("FASTINFER_TUNED", "off")
    stored("shapes-onnx", "onnx", accuracy=ACCURACY)
    said = doctor_report(tmp_path)
    out = capsys.readouterr().out
    assert "model family shapes: 3 classes, weights file (fine-tuned on 30 shape photos (shapes.pth))" in out
    assert "accuracy measured at build: onnx top-1 96.7% (int8)" in out and "top-5" not in out
    assert said["family"]["name"] == "shapes" and said["family"]["num_classes"] == 3
    # Its models that are not stored are named, with the command that builds this family.
    assert "shapes-pytorch not in the model store; run `fastinfer build" in said["backends"]["pytorch"]["reason"]


def test_top5_is_shown_for_a_family_of_more_than_five_classes(own_store: Path, monkeypatch) -> None:
    from fastinfer.front.api_page import family_line
    from fastinfer.serving.metrics import record_family

    six = [f"c{i}" for i in range(6)]
    monkeypatch.setenv("FASTINFER_MODEL", "six")
    stored("six-onnx", "onnx", accuracy=ACCURACY, categories=six, num_classes=6, output=store.output_spec(6))
    served = family.summary("six", backends.served_models())
    assert "onnx top-1 96.7%, top-5 100.0% (int8)" in family_line(served)
    assert "onnx top-1 96.7%, top-5 100.0% (int8)" in served.summary()  # doctor's line
    record_family(served)
    top5 = {"family": "six", "backend": "onnx", "metric": "top5", "precision": "int8"}
    assert METRICS.get_sample_value("fastinfer_model_accuracy", top5) == pytest.approx(1.0)


def test_doctor_says_a_bad_family_name_in_one_line(monkeypatch, capsys) -> None:
    from fastinfer import cli

    monkeypatch.setenv("FASTINFER_MODEL", "Not/A/Name")
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastinfer doctor: FASTINFER_MODEL: 'Not/A/Name' cannot name a model family"), err
    assert "\n" not in err


# --- a family of two sources -----------------------------------------------------------------------------------

OLD_SOURCE, NEW_SOURCE = "0ld50urce0ld50ur", "6e75045ce6e75045"
SERVABLE = ["pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic"]  # what runs on every machine the suite runs on


def start_up(monkeypatch, caplog) -> list[str]:
    """The server's deployment hook (before any worker starts), its environment undone after the test; the
    WARNING lines it logged."""
    import logging

    import service

    for name in (store.PINS_ENV, store.UNSERVED_ENV, store.PIN_FILE_ENV, "FASTINFER_TUNED_RESOLVED", PLACED_ENV):
        monkeypatch.setenv(name, "")  # recorded, so that the test's end restores what was there
        monkeypatch.delenv(name)
    config.get_settings.cache_clear()  # read again with the family the test set (imports may have read them)
    monkeypatch.setattr(service, "settings", config.get_settings())
    monkeypatch.setattr(service, "claim_metrics_dir", lambda: None)  # this process's metrics are not a server's
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        service.FastInfer.inner._pin_models()
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def interrupted_rebuild() -> None:
    """What an interrupted rebuild with other labels leaves: every backend from the old source, then pytorch
    and onnx again from the new one (the family's newest models), the rest not reached."""
    for backend in SERVABLE:
        stored(f"tiles-{backend}", backend, labels={"source_hash": OLD_SOURCE})
    for backend in ("pytorch", "onnx"):
        stored(f"tiles-{backend}", backend, labels={"source_hash": NEW_SOURCE}, categories=SHAPES[::-1])


def test_a_family_of_two_sources_serves_only_its_newest_models_source(own_store: Path, monkeypatch, caplog) -> None:
    """The family is what its newest model was built from; every other model is not served (else /compare
    answers one photo with two families' labels), its backend answering 503 with why and how to rebuild the
    whole family, and start-up says so in one WARNING line."""
    from fastinfer.front import inventory
    from runners import REGISTRY
    from runners.base import RunnerCore

    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    interrupted_rebuild()
    newest = str(store.find("onnx").tag)
    (warning,) = start_up(monkeypatch, caplog)
    assert "\n" not in warning and "model family 'tiles' holds models of two sources" in warning
    assert f"{newest} (source hash {NEW_SOURCE})" in warning
    assert "not serving tiles-onnx-int8, tiles-onnx-int8-dynamic," in warning and "then restart the server" in warning
    assert json.loads(os.environ[store.PINS_ENV]) == {
        "tiles-pytorch": str(store.find("pytorch").tag),
        "tiles-onnx": newest,
    }
    # What each backend of the other source answers (503), /backends shows and a runner says.
    why = backends.unavailable_reason("onnx-int8")
    old_tag = str(store.find("onnx-int8").tag)
    assert why == (
        f"{old_tag} was built from other weights, labels or preprocessing (source hash {OLD_SOURCE}) than the rest "
        f"of model family 'tiles' (source hash {NEW_SOURCE}, as its newest model {newest}): not served; rebuild "
        "`fastinfer build --weights PATH --labels PATH --name tiles --mean 0.3,0.6,0.5 --std 0.4,0.2,0.3 --resize 160 "
        "--crop 128` (the whole family, without --only), then restart the server"
    )
    assert backends.unavailable_reason("pytorch") is None and backends.unavailable_reason("onnx") is None
    models = backends.served_models()
    assert list(models) == ["pytorch", "onnx"] and {m.source_hash for m in models.values()} == {NEW_SOURCE}
    unavailable = {name: reason for name in REGISTRY if (reason := backends.unavailable_reason(name))}
    settings = config.get_settings()
    listed = inventory.backends(REGISTRY, unavailable, models, {}, settings, {}).model_dump(mode="json")
    by_name = {b["name"]: b for b in listed["backends"]}
    assert by_name["onnx-int8-dynamic"]["available"] is False and "not served" in by_name["onnx-int8-dynamic"]["reason"]
    assert listed["family"]["labels"] == SHAPES[::-1]  # the newest source's labels, not the old ones'
    runner = RunnerCore("onnx-int8", workers=1)
    assert runner.failure == why and runner.lasting and asyncio.run(runner.__is_ready__())
    # /compare: the backends of the family's source only, the others said unavailable.
    stand_in = ThreeClasses()
    cache = MemoryCache(max_entries=10, ttl_s=60)
    pipeline = Pipeline(list(REGISTRY), models, unavailable.get, stand_in, stand_in.engine, cache, CpuPool(2),
                        LiveStats(), max_pixels=50_000_000)  # fmt: skip
    scope, body = request("/compare", files={"image": ("a.png", grey_png(100))})
    status, payload = asyncio.run(answer(pipeline, ROUTES["/compare"], scope, body, FormRules("onnx", 4)))
    pipeline.cpu.close()
    assert status == 200 and [r["backend"] for r in payload["results"]] == ["pytorch", "onnx"], payload
    assert {"onnx-int8", "onnx-int8-dynamic"} <= set(payload["summary"]["unavailable"])


def test_doctor_says_a_family_of_two_sources(own_store: Path, monkeypatch, tmp_path: Path, capsys) -> None:
    """Outside a server (doctor, evaluate, the tools) the same models are refused, with the same reason."""
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    monkeypatch.setenv("FASTINFER_TUNED", "off")
    monkeypatch.delenv(store.PINS_ENV, raising=False)
    interrupted_rebuild()
    with pytest.raises(store.NotServed, match="not served; rebuild `fastinfer build"):
        holdings.serving("onnx-int8")
    said = doctor_report(tmp_path)["backends"]
    refused = said["onnx-int8"]
    assert refused["available"] is False and f"(source hash {OLD_SOURCE}) than the rest" in refused["reason"]
    assert "then restart" not in refused["reason"]
    assert said["pytorch"]["reason"] is None or "not served" not in said["pytorch"]["reason"]


def test_a_family_rebuilt_whole_is_served_whole_again(own_store: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    interrupted_rebuild()
    for backend in SERVABLE:  # the whole family, from the new source
        stored(f"tiles-{backend}", backend, labels={"source_hash": NEW_SOURCE})
    assert start_up(monkeypatch, caplog) == []
    assert set(json.loads(os.environ[store.PINS_ENV])) == {f"tiles-{b}" for b in SERVABLE}
    assert json.loads(os.environ[store.UNSERVED_ENV]) == {}
    assert all(backends.unavailable_reason(b) is None for b in SERVABLE)


def test_the_removed_scheduling_in_the_environment_is_said_once_at_start_up_and_ignored(
    own_store: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    monkeypatch.setenv("FASTINFER_SCHEDULING", "turns")  # an earlier version's setting, left in a deployment
    for backend in SERVABLE:
        stored(f"tiles-{backend}", backend)
    assert start_up(monkeypatch, caplog) == [  # the settings parsed: the server starts
        "FASTINFER_SCHEDULING in the environment is ignored: the setting was removed (`turns` measured no gain: "
        "docs/tuning.md#scheduling)"
    ]


def test_a_runner_without_its_model_at_start_up_does_not_hold_the_server_s_readiness(
    own_store: Path, monkeypatch
) -> None:
    """A family that lacks a backend (or holds one of another source) is served without it: in a server only a
    restart could bring it, so its runner reports ready (its backend answers 503) rather than keep /readyz
    failing for good."""
    from runners.base import RunnerCore

    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    stored("tiles-onnx", "onnx")
    config.get_settings.cache_clear()
    monkeypatch.setenv(store.PINS_ENV, json.dumps({"tiles-onnx": str(store.find("onnx").tag)}))
    runner = RunnerCore("pytorch", workers=1)
    assert "tiles-pytorch not in the model store" in (runner.failure or "") and runner.lasting
    assert asyncio.run(runner.__is_ready__())
    monkeypatch.delenv(store.PINS_ENV)  # outside a server: a retry may find it built since
    assert not RunnerCore("pytorch", workers=1).lasting


def test_a_record_whose_labels_are_read_as_numbers_still_makes_a_family(tmp_path) -> None:
    """A hand-edited model.yaml (``- 1`` as a class name, a number as its weights label): named as text, never a
    validation traceback at start-up or in doctor."""
    import bentoml

    with model_store_at(tmp_path):
        with bentoml.models.create("resnet50-onnx", labels={"backend": "onnx", "weights": 7},
                                   metadata={"categories": [1, "b", 2.5], "num_classes": 3}) as model:  # fmt: skip
            pass
        info = store.describe(bentoml.models.get(model.tag))
    summary = family.summary("resnet50", {"onnx": info})
    assert summary.labels == ["1", "b", "2.5"] and summary.weights == "7", summary
