"""CoreML static-batch logic (choose the smallest static model >= n, pad, slice), tested with an
honest stand-in: each static-batch predictor is the real ONNX FP32 model, refusing any other shape.
Real CoreML prediction needs macOS and is tested there."""

from __future__ import annotations

import numpy as np
import pytest

from fastinfer.catalog.backends import COREML_BATCHES, open_engine
from fastinfer.common import hardware
from fastinfer.engines.coreml import CoreMLEngine, choose_batch


@pytest.mark.parametrize(("n", "size"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (13, 8)])
def test_choose_batch(n: int, size: int) -> None:
    assert choose_batch(n, list(COREML_BATCHES)) == size


@pytest.fixture(scope="module")
def onnx_engine(built_models):
    return open_engine("onnx")


@pytest.fixture()
def stand_in(onnx_engine):
    calls: list[int] = []

    def static(size: int):
        def predict(images: np.ndarray) -> np.ndarray:
            assert images.shape == (size, 224, 224, 3), f"model b{size} got {images.shape}"
            calls.append(size)
            return onnx_engine.run(images)

        return predict

    return CoreMLEngine({b: static(b) for b in COREML_BATCHES}), calls


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_pad_choose_slice_matches_the_real_model(stand_in, onnx_engine, n: int) -> None:
    engine, calls = stand_in
    images = np.random.default_rng(n).integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)
    out = engine.run(images)
    assert out.shape == (n, 1000)
    np.testing.assert_allclose(out, onnx_engine.run(images), atol=1e-3)  # padding never leaks into answers
    expected = {1: [1], 2: [2], 3: [4], 5: [8], 8: [8], 11: [8, 4]}[n]
    assert calls == expected
    assert engine.describe()["padded_rows"] == sum(expected) - n


@pytest.mark.skipif(not hardware.is_macos(), reason="CoreML prediction needs macOS (Apple hardware)")
def test_real_coreml_matches_pytorch(built_models) -> None:
    from fastinfer.catalog.store import PreprocessSpec
    from fastinfer.measure import fidelity as fid

    images = fid.fidelity_images(PreprocessSpec())[:8]
    reference = open_engine("pytorch").run(images)
    f = fid.compare("coreml-batched", reference, open_engine("coreml-batched").run(images))
    assert f.top1_agreement >= 0.9 and f.max_abs_error <= 5.0, f
