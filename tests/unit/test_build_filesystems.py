"""Exports are written under TMPDIR and moved into the model store: that move must cross filesystems.

A tmpfs /tmp with the store on disk is common. BentoML 1.4 stages a new model in TMPDIR before it
copies it into the store, so there ``Path.rename`` happened to stay on one filesystem; this test
also stages BentoML's copy on the store's filesystem, so that the move really crosses.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from build_models import ARTIFACTS, build
from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec
from tests.unit.test_build_force import assert_loads

TMPFS = Path("/dev/shm")
FAMILY = "moved"
SMALL = PreprocessSpec(resize_size=64, crop_size=64)


@pytest.fixture
def tmpfs_tempdir(private_store: Path, monkeypatch):
    """TMPDIR for this test on another filesystem than the store."""
    if not TMPFS.is_dir():
        pytest.skip(f"{TMPFS} does not exist: no second filesystem to put TMPDIR on")
    tmp = Path(tempfile.mkdtemp(prefix="fastinfer-test-", dir=TMPFS))
    try:
        if os.stat(tmp).st_dev == os.stat(private_store).st_dev:
            pytest.skip(f"{TMPFS} and the store {private_store} are on one filesystem here")
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        monkeypatch.setenv("TMPDIR", str(tmp))
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def bentoml_stages_next_to_the_store(private_store: Path, monkeypatch) -> list[Path]:
    """Make BentoML stage new models on the store's filesystem instead of in TMPDIR."""
    import bentoml._internal.models.model as bentoml_model

    root = private_store / "staging"
    root.mkdir(exist_ok=True)
    staged: list[Path] = []

    def mkdtemp(suffix: str | None = None, prefix: str | None = None, dir: str | None = None) -> str:
        path = tempfile.mkdtemp(suffix, prefix, dir=root)
        staged.append(Path(path))
        return path

    monkeypatch.setattr(bentoml_model, "tempfile", SimpleNamespace(mkdtemp=mkdtemp))
    yield staged
    shutil.rmtree(root, ignore_errors=True)


def test_models_move_into_the_store_across_filesystems(
    private_store: Path, tmpfs_tempdir: Path, bentoml_stages_next_to_the_store: list[Path], monkeypatch
) -> None:
    monkeypatch.setitem(ARTIFACTS, "coreml", replace(ARTIFACTS["coreml"], batches=(1,)))  # one is enough
    # A family of its own, at 64 px: what moves is tested, not the image size (PyTorch and ONNX Runtime run on
    # the build's photos).
    results = build("random", only=["pytorch", "onnx", "coreml"], family=FAMILY, preprocess=SMALL, progress=print)

    assert [r.name for r in results] == [f"{FAMILY}-pytorch", f"{FAMILY}-onnx", f"{FAMILY}-coreml-b1"]
    assert all(r.built for r in results)
    # Each export left TMPDIR (tmpfs) for a directory on the store's filesystem.
    assert len(bentoml_stages_next_to_the_store) == 3
    tmpfs_dev = os.stat(tmpfs_tempdir).st_dev
    assert all(os.stat(p.parent).st_dev != tmpfs_dev for p in bentoml_stages_next_to_the_store)
    for backend, size in [("pytorch", None), ("onnx", None), ("coreml", 1)]:
        model = store.find(backend, size, family_name=FAMILY)
        assert os.stat(model.path).st_dev != tmpfs_dev
        assert_loads(backend, model)
