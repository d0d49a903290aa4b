"""``python -m build_models --force`` over a full store rebuilds every artifact in one run.

It used to crash: the INT8 steps read the FP32 ONNX file inside the stored ``resnet50-onnx``,
which the ``onnx`` step of the same run had just superseded and deleted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import bentoml
import numpy as np

from build_models import ARTIFACTS, build
from fastinfer.catalog import store

STORED = [(a, b) for a in ARTIFACTS.values() for b in a.batches]


def assert_loads(backend: str, model: bentoml.Model) -> None:
    """The stored files are there and the engine that serves them can run them (CoreML: macOS only)."""
    from fastinfer.catalog.backends import open_engine
    from fastinfer.engines.coreml import PACKAGE_DIR

    one = np.zeros((1, 224, 224, 3), dtype=np.uint8)
    if backend != "coreml":
        assert open_engine(backend, dirs={None: model.path}).run(one).shape == (1, 1000)
    else:
        package = Path(model.path) / PACKAGE_DIR
        assert package.is_dir() and (package / "Manifest.json").is_file(), package


def test_force_rebuilds_every_artifact_in_one_run(built_models, monkeypatch) -> None:
    # CoreML b2/b4/b8 take the same path as b1 at ~5 s each: one batch size covers the artifact.
    monkeypatch.setitem(ARTIFACTS, "coreml", replace(ARTIFACTS["coreml"], batches=(1,)))
    rebuilt = [(a, b) for a in ARTIFACTS.values() for b in a.batches]
    before = {store.model_name(a.name, b): str(store.find(a.name, b).tag) for a, b in STORED}

    results = build("random", force=True, progress=print)

    assert [r.name for r in results] == [store.model_name(a.name, b) for a, b in rebuilt]
    for r in results:
        assert r.built and r.tag != before[r.name], r
        # Exactly the new version is stored: the superseded one is deleted.
        assert [str(m.tag) for m in bentoml.models.list(r.name)] == [r.tag]
    for artifact, size in STORED:  # every stored model, rebuilt or not, has its files and loads
        assert_loads(artifact.name, store.find(artifact.name, size))


def test_a_rebuild_removes_every_superseded_version(built_models) -> None:
    """A build killed between storing and deleting leaves an old version behind: the next one removes it."""
    with bentoml.models.create("resnet50-pytorch", labels={"backend": "pytorch"}) as orphan:
        (Path(orphan.path) / "state_dict.pt").write_bytes(b"left by a killed build")
    results = build("random", only=["pytorch"], force=True, progress=print)
    assert [str(m.tag) for m in bentoml.models.list("resnet50-pytorch")] == [results[0].tag]
