"""``python -m build_models --force`` over a full store rebuilds the artifacts that read each other in one run:
the INT8 steps read the FP32 ONNX model that the ``onnx`` step of the same run has just replaced."""

from __future__ import annotations

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

    size, classes = model.info.metadata["input"]["shape"][1], model.info.metadata["num_classes"]
    one = np.zeros((1, size, size, 3), dtype=np.uint8)
    if backend != "coreml":
        assert open_engine(backend, dirs={None: model.path}).run(one).shape == (1, classes)
    else:
        package = Path(model.path) / PACKAGE_DIR
        assert package.is_dir() and (package / "Manifest.json").is_file(), package


# The steps that read an artifact an earlier step of the same run supersedes: the INT8 models and openvino read
# the FP32 ONNX file, openvino-int8 the INT8 one. pytorch and CoreML export from the weights in memory.
CHAINED = ["onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8"]


def test_force_rebuilds_the_artifacts_that_read_each_other_in_one_run(private_store) -> None:
    rebuilt = [(ARTIFACTS[name], None) for name in CHAINED]
    before = {store.model_name(a.name, b): str(store.find(a.name, b).tag) for a, b in STORED}

    results = build("random", force=True, only=CHAINED, progress=print)

    assert [r.name for r in results] == [store.model_name(a.name, b) for a, b in rebuilt]
    for r in results:
        assert r.built and r.tag != before[r.name], r
        # Exactly the new version is stored: the superseded one is deleted.
        assert [str(m.tag) for m in bentoml.models.list(r.name)] == [r.tag]
    for artifact, size in STORED:  # every stored model, rebuilt or not, has its files and loads
        assert_loads(artifact.name, store.find(artifact.name, size))


def test_a_rebuild_removes_every_superseded_version(private_store) -> None:
    """A build killed between storing and deleting leaves an old version behind: the next one removes it."""
    with bentoml.models.create("resnet50-pytorch", labels={"backend": "pytorch"}) as orphan:
        (Path(orphan.path) / "state_dict.pt").write_bytes(b"left by a killed build")
    results = build("random", only=["pytorch"], force=True, progress=print)
    assert [str(m.tag) for m in bentoml.models.list("resnet50-pytorch")] == [results[0].tag]
