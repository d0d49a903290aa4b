"""Store health: a stored model is up to date only while its files match the size and sha256 recorded at build
time (the build, ``--if-missing``, the runners and doctor check). A runner that could not load is not ready, and
tells clients no path of this server. Tests that damage a model do it in a store of their own."""

from __future__ import annotations

import asyncio
import shlex
import shutil
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
import pytest
from bentoml.exceptions import ServiceUnavailable

from build_models import VerificationError, build, unusable
from build_models import __main__ as build_cli
from build_models.context import build_code
from fastinfer import cli
from fastinfer.catalog import holdings, store, store_check
from fastinfer.catalog.backends import SPECS, open_engine
from fastinfer.common.errors import RunnerNotLoaded, without_paths
from tests.conftest import doctor_report, unshared

STATE_DICT = "state_dict.pt"


def pytorch_file() -> Path:
    return Path(store.find("pytorch").path) / STATE_DICT


def cut_short(path: Path) -> None:
    unshared(path).write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def altered_in_place(path: Path) -> None:
    """Same size, a few bytes in the middle changed: only the sha256 tells (and torch may still load it)."""
    with unshared(path).open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\x00\x01\x02\x03")


@pytest.fixture
def pytorch_model(private_store) -> bentoml.Model:
    """The stored pytorch model of a store of this test's own, for the test to damage."""
    return store.find("pytorch")


def test_every_stored_file_is_recorded_with_its_size_and_sha256(built_models) -> None:
    health = store_check.stored_health()
    assert len(health) == len({n for s in SPECS.values() for n in s.model_names()})  # CoreML's too
    for name, checked in health.items():
        assert checked.intact, (name, checked)
        model = bentoml.models.get(checked.tag)
        on_disk = {p.relative_to(model.path).as_posix() for p in Path(model.path).rglob("*") if p.is_file()} - {
            "model.yaml"
        }
        assert set(model.info.metadata[store_check.FILES_KEY]) == on_disk, name


def test_a_truncated_model_is_called_corrupt_and_rebuilt(pytorch_model) -> None:
    cut_short(pytorch_file())
    said: list[str] = []
    (result,) = build("random", only=["pytorch"], progress=said.append)
    assert f"[1/1] resnet50-pytorch: {pytorch_model.tag} is corrupt: {STATE_DICT} is " in "\n".join(said), said
    assert any(s.endswith("; rebuilding") for s in said), said
    assert result.built and result.tag != str(pytorch_model.tag)
    assert store_check.check(store.find("pytorch")).intact
    assert [str(m.tag) for m in bentoml.models.list("resnet50-pytorch")] == [result.tag]  # the corrupt one is gone
    (again,) = build("random", only=["pytorch"], progress=said.append)
    last_step = next(s for s in reversed(said) if s.startswith("[1/1] "))  # the build's table follows it
    assert not again.built and last_step.endswith("; its files match their sha256), skipped")


def test_if_missing_rebuilds_a_model_altered_in_place(pytorch_model, capsys) -> None:
    altered_in_place(pytorch_file())
    assert build_cli.main(["--weights", "random", "--if-missing"]) == 0
    out = capsys.readouterr().out
    assert f"build_models: resnet50-pytorch: {pytorch_model.tag} is corrupt: {STATE_DICT} differs from" in out, out
    assert "nothing to do" not in out
    rebuilt = store.find("pytorch")
    assert rebuilt.tag != pytorch_model.tag and store_check.check(rebuilt).intact
    assert "resnet50-onnx: up to date" in out  # the rest was checked, not rebuilt
    assert build_cli.main(["--weights", "random", "--if-missing"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_a_model_stored_without_a_record_is_rebuilt_once(pytorch_model) -> None:
    """What an older build stored cannot be verified: it is rebuilt (once), not trusted."""
    meta = {k: v for k, v in pytorch_model.info.metadata.items() if k != store_check.FILES_KEY}
    with bentoml.models.create("resnet50-pytorch", labels=dict(pytorch_model.info.labels), metadata=meta) as old:
        shutil.copyfile(pytorch_file(), Path(old.path) / STATE_DICT)
    assert not store_check.check(store.find("pytorch")).recorded
    said: list[str] = []
    (result,) = build("random", only=["pytorch"], progress=said.append)
    assert f"{old.tag} cannot be verified: {store_check.NOT_RECORDED}; rebuilding" in "\n".join(said), said
    assert result.built and store_check.check(store.find("pytorch")).intact
    (again,) = build("random", only=["pytorch"], progress=said.append)
    assert not again.built


def test_a_model_an_older_build_code_made_is_rebuilt(pytorch_model) -> None:
    """The same weights exported by other build code or another runtime version are not called up to date."""
    labels = {**pytorch_model.info.labels, "built_by": "an-older-build"}
    with bentoml.models.create("resnet50-pytorch", labels=labels, metadata=dict(pytorch_model.info.metadata)) as old:
        shutil.copytree(pytorch_model.path, old.path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.yaml"))
    assert store_check.check(store.find("pytorch")).intact  # the same files: only who made them differs
    assert unusable()["resnet50-pytorch"] == f"{old.tag} was made by other build code or runtimes"  # --if-missing
    said: list[str] = []
    (result,) = build("random", only=["pytorch"], progress=said.append)
    assert result.built and result.tag != str(old.tag), said
    assert "resnet50-pytorch" not in unusable()
    assert store.find("pytorch").info.labels["built_by"] == build_code()
    (again,) = build("random", only=["pytorch"], progress=said.append)
    assert not again.built


def test_a_copy_cut_short_on_its_way_into_the_store_is_not_kept(pytorch_model, monkeypatch) -> None:
    """A disk that fills up while BentoML copies a new model into the store: read back, refused."""
    import bentoml._internal.models.model as bentoml_model

    copytree = shutil.copytree

    def short_copy(src: Any, dst: Any, **kwargs: Any) -> Any:
        copied = copytree(src, dst, **kwargs)
        cut_short(Path(dst) / STATE_DICT)
        return copied

    monkeypatch.setattr(bentoml_model.shutil, "copytree", short_copy)
    with pytest.raises(VerificationError, match=rf"resnet50-pytorch: the copy in the store differs .*{STATE_DICT} is"):
        build("random", only=["pytorch"], force=True, progress=print)
    assert [str(m.tag) for m in bentoml.models.list("resnet50-pytorch")] == [str(pytorch_model.tag)]


def test_doctor_names_a_corrupt_model_and_the_command_that_rebuilds_it(pytorch_model, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "_available", lambda: {"pytorch": None})  # the one backend under test
    doctor_report(tmp_path)
    assert "every file matches its recorded sha256" in capsys.readouterr().out

    cut_short(pytorch_file())
    report = doctor_report(tmp_path)
    out = capsys.readouterr().out
    assert f"{pytorch_model.tag}: CORRUPT: {STATE_DICT} is " in out, out
    command = "python -m build_models --only pytorch --weights random"
    assert f"rebuild them: {command}\n" in out
    assert report["store"]["resnet50-pytorch"]["state"] == "corrupt"
    assert (
        report["backends"]["pytorch"]["available"] is False and "is corrupt" in report["backends"]["pytorch"]["reason"]
    )

    assert build_cli.main(shlex.split(command)[3:]) == 0  # the command doctor gave repairs it
    doctor_report(tmp_path)
    assert "every file matches its recorded sha256" in capsys.readouterr().out


# The runners: readiness and what a client is told.


def stored_copy(name: str, tmp_path: Path) -> Path:
    """A copy of a stored model's directory laid out as in a store: <root>/<name>/<version>."""
    model = store.find(name)
    copy = tmp_path / "models" / str(model.tag.name) / str(model.tag.version)
    shutil.copytree(model.path, copy)
    return copy


def runner_over(backend: str, monkeypatch, engine_dirs: Path | None = None) -> Any:
    import runners.base

    def opening(name: str, threads: int, dirs: dict) -> Any:
        return open_engine(name, threads, {None: engine_dirs} if engine_dirs else dirs)

    monkeypatch.setattr(runners.base, "open_engine", opening)
    return runners.base.make_runner(backend).inner()


def test_a_runner_that_could_not_load_is_not_ready_and_names_no_server_path(
    built_models, monkeypatch, tmp_path, caplog
) -> None:
    broken = stored_copy("onnx-int8", tmp_path)
    cut_short(broken / "model.onnx")
    runner = runner_over("onnx-int8", monkeypatch, broken)
    error = runner.describe()["error"]  # what /backends and the 503 say
    tag = f"resnet50-onnx-int8:{broken.name}"
    assert error.startswith("onnx-int8 could not be loaded: ") and f"Load model from {tag}/model.onnx " in error
    assert str(tmp_path) not in error and "/models/" not in error, error
    assert len(error) <= 330 and "\n" not in error
    with pytest.raises(ServiceUnavailable, match="could not be loaded") as refused:
        asyncio.run(runner.infer(np.zeros((1, 224, 224, 3), np.uint8)))
    assert str(tmp_path) not in str(refused.value)
    assert str(broken / "model.onnx") in caplog.text  # the server's log keeps the path
    assert asyncio.run(runner.__is_ready__()) is False


def test_a_runner_refuses_a_stored_model_whose_files_differ(built_models, monkeypatch, tmp_path) -> None:
    """Altered in place, the model might still load, and answer wrongly: its recorded sha256 refuses it."""
    copy = stored_copy("onnx-int8", tmp_path)
    altered_in_place(copy / "model.onnx")
    altered = bentoml.models.Model.from_path(copy)
    monkeypatch.setattr(holdings, "serving", lambda artifact, batch=None: altered)
    runner = runner_over("onnx-int8", monkeypatch)
    error = runner.describe()["error"]
    assert f"CorruptModel: {altered.tag} is corrupt: model.onnx differs from what was built (sha256)" in error, error
    assert "rebuild it: python -m build_models --only onnx-int8 --weights random" in error
    assert str(tmp_path) not in error
    assert asyncio.run(runner.__is_ready__()) is False


@pytest.mark.parametrize(
    ("message", "told"),
    [
        (
            "InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from "
            "/srv/bentoml/models/resnet50-onnx/ty7v2sxpkgwx4ax4/model.onnx failed:Protobuf parsing failed.",
            "InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from "
            "resnet50-onnx:ty7v2sxpkgwx4ax4/model.onnx failed:Protobuf parsing failed.",
        ),
        # A stored model's path is told as its tag, for any family's name.
        *(
            (
                f"Load model from /srv/home/models/{model}/{version}/{file} failed.",
                f"Load model from {model}:{version}/{file} failed.",
            )
            for model, version, file in [
                ("shapes-onnx-int8", "ty7v2sxpkgwx4", "model.onnx"),
                ("my_shop.v2-coreml-b4", "abc123", "m.mlpackage"),
                ("resnet50-openvino", "abc123", "model.xml"),
            ]
        ),
        (
            "RuntimeError: OpenVINO compile_model failed for /tmp/pytest-7/m/model.xml: Incorrect weights in bin file!",
            "RuntimeError: OpenVINO compile_model failed for model.xml: Incorrect weights in bin file!",
        ),
        ("No such file '/home/u/bentoml/cache/openvino/x/blob.'.", "No such file 'blob.'."),
        # Not paths: a route, a count, a URL, the runtime's own source file.
        (
            "GET /readyz 53/53 http://h:1/a/b src/inference/core.cpp:97",
            "GET /readyz 53/53 http://h:1/a/b src/inference/core.cpp:97",
        ),
    ],
)
def test_server_paths_are_left_out_of_what_clients_are_told(message: str, told: str) -> None:
    assert without_paths(message) == told
    assert told in RunnerNotLoaded(message).message  # the front relays nothing with a path either


def test_a_home_with_a_space_leaves_no_path_in_a_message(monkeypatch) -> None:
    monkeypatch.setenv("BENTOML_HOME", "/srv/model store/home")
    message = (
        "Load model from /srv/model store/home/models/resnet50-onnx/abc123/model.onnx failed: "
        "file:///srv/model store/home/x.bin"
    )
    told = without_paths(message)
    assert "srv" not in told and "store/home" not in told, told
    assert "resnet50-onnx:abc123/model.onnx" in told


def test_backends_shows_the_openvino_cache_under_home_not_its_path(monkeypatch) -> None:
    from fastinfer.common.errors import under_home as _under_home

    monkeypatch.setenv("BENTOML_HOME", "/srv/model store/home")
    assert _under_home("/srv/model store/home/cache/openvino/x/1") == "$BENTOML_HOME/cache/openvino/x/1"
    assert _under_home("/elsewhere/cache") == "cache" and _under_home(None) is None


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_a_model_whose_model_yaml_is_gone_or_garbled_is_rebuilt(pytorch_model, damage: str) -> None:

    meta = Path(pytorch_model.path) / "model.yaml"
    if damage == "deleted":
        meta.unlink()
    else:
        meta.write_text("::: not yaml")
    assert store.find("pytorch") is None
    assert "resnet50-pytorch" in unusable()
    store_check.stored_health()  # what doctor reads: no traceback
    said: list[str] = []
    (result,) = build("random", only=["pytorch"], progress=said.append)
    assert result.built and f"removed {pytorch_model.tag}, unreadable" in "\n".join(said), said
    assert store.versions("resnet50-pytorch") == [result.tag]
    assert store_check.check(store.find("pytorch")).intact
