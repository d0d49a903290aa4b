"""Every stored uint8 model normalises the way torchvision does (in the graph: fastinfer/engines/torch_model.py).

The reference: torchvision's ``ImageClassification`` mean/std on ResNet-50 with the store's weights, every backend
opened as the service opens it, on the sample photos and a colour gradient. FP32 backends must equal it to float
precision; INT8 and BF16 are checked by the mean and std they *apply*: the logit error regressed on the
reference's sensitivity to each channel's mean and std. Thresholds measured on random-init weights (AMD EPYC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from fastinfer.catalog import store
from fastinfer.catalog.backends import SPECS, open_engine, unavailable_reason
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure import photos
from fastinfer.serving.preprocess import prepare

PARAMETERS = ("mean R", "mean G", "mean B", "std R", "std G", "std B")
STEP = 0.01  # finite-difference step, in mean/std units: the network is piecewise linear, so one side suffices

FP32_TOLERANCE = 1e-5
"""Max |logit error| of an FP32 backend over the largest |reference logit|: measured at most 6e-5 absolute of ~9e-4
allowed; a wrong mean gives 1.6."""

MAX_DRIFT = 0.007
"""The largest fitted offset of a channel's mean or std a non-FP32 model may show: correct models measured at most
0.0033, the smallest wrong constant 0.0139. Keep all 13 images in one batch (5 gave noise up to 0.006)."""

MAX_RELATIVE_RMS = 0.1  # RMS logit error / logit spread per image (correct INT8: 0.034): gross errors the fit misses


def gradient() -> np.ndarray:
    """Every level of every channel, in colours photos rarely have."""
    y, x = np.mgrid[0:224, 0:224]
    return np.stack([x * 255 // 223, y * 255 // 223, (x + y) * 255 // 446], axis=-1).astype(np.uint8)


def sample_pixels() -> np.ndarray:
    """The 12 sample photos through our own decode/resize/crop, and the gradient: uint8 [13,224,224,3]."""
    spec = PreprocessSpec()
    shots = [prepare(photos.photo_jpeg(name), spec, 10**9).pixels for name in photos.PHOTOS]
    return np.stack([*shots, gradient()])


def torchvision_logits(
    net: torch.nn.Module, pixels: np.ndarray, mean: Sequence[float], std: Sequence[float]
) -> np.ndarray:
    """torchvision's ImageClassification after its resize and crop: to float in [0,1], normalise, run."""
    from torchvision.transforms import functional as F

    images = torch.from_numpy(pixels).permute(0, 3, 1, 2)  # NHWC -> NCHW, as pil_to_tensor gives
    with torch.inference_mode():
        x = F.normalize(F.convert_image_dtype(images, torch.float), list(mean), list(std))
        return net(x).double().numpy()


@dataclass(frozen=True)
class Reference:
    net: torch.nn.Module  # torchvision's ResNet-50 with the store's weights
    mean: list[float]  # the weights' own transforms
    std: list[float]
    logits: np.ndarray  # float64 [N,1000], torchvision's pipeline
    sensitivity: np.ndarray  # float64 [N,1000,6]: d logits / d (mean R,G,B, std R,G,B)
    source_hash: str  # what the store's models were built from, if from the reference's weights


def reference_for(pixels: np.ndarray) -> Reference:
    """torchvision's pipeline and its sensitivities on ``pixels``: 7 forward passes."""
    import torchvision
    from torchvision.models import ResNet50_Weights

    from build_models.context import family_hash
    from build_models.labels import imagenet_categories
    from build_models.weights import load_weights

    weights = load_weights("random")  # what tests/conftest.py builds the store from (seeded)
    net = torchvision.models.resnet50(weights=None)
    net.load_state_dict(weights.state_dict)
    net.eval()
    transforms = ResNet50_Weights.IMAGENET1K_V2.transforms()
    mean, std = list(transforms.mean), list(transforms.std)
    logits = torchvision_logits(net, pixels, mean, std)
    columns = []
    for k in range(6):
        m, s = list(mean), list(std)
        (m if k < 3 else s)[k % 3] += STEP
        columns.append((torchvision_logits(net, pixels, m, s) - logits) / STEP)
    source = family_hash(weights.source_hash, imagenet_categories(), PreprocessSpec(mean=tuple(mean), std=tuple(std)))
    return Reference(net, mean, std, logits, np.stack(columns, axis=-1), source)


def drift(reference: Reference, logits: np.ndarray) -> np.ndarray:
    """The offsets of (mean R,G,B, std R,G,B) from torchvision's that best explain the logit error
    (least squares over every image and logit)."""
    error = np.asarray(logits, dtype=np.float64) - reference.logits
    fitted, *_ = np.linalg.lstsq(reference.sensitivity.reshape(-1, 6), error.ravel(), rcond=None)
    return fitted


def describe_drift(offsets: np.ndarray) -> str:
    return ", ".join(f"{name} {value:+.4f}" for name, value in zip(PARAMETERS, offsets, strict=True))


def relative_rms(reference: Reference, logits: np.ndarray) -> np.ndarray:
    """Per image: RMS logit error over the reference's logit spread."""
    error = np.asarray(logits, dtype=np.float64) - reference.logits
    return np.sqrt(np.mean(error**2, axis=1)) / reference.logits.std(axis=1)


def on_cpu(described: dict[str, Any]) -> bool:
    """Whether a float engine runs its graph on the CPU as it is: CUDA's TF32 convolutions or the CoreML
    EP's FP16 would not meet the float tolerance (there the drift check applies instead)."""
    device = str(described.get("device", "cpu")).lower()
    providers = described.get("execution_providers", ["CPUExecutionProvider"])
    return device.startswith("cpu") and providers[0] == "CPUExecutionProvider"


@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return sample_pixels()


@pytest.fixture(scope="module")
def reference(built_models: list, pixels: np.ndarray) -> Reference:
    return reference_for(pixels)


OpenOptions = dict[str, Any]
FP32: dict[str, OpenOptions] = {
    "pytorch": {},
    "onnx": {},
    # OpenVINO's "auto" precision runs BF16 on CPUs with BF16 units; the build verifies at f32 the same way.
    "openvino": {"precision": "f32"},
}
APPROXIMATE: dict[str, tuple[str, OpenOptions]] = {
    "onnx-int8": ("onnx-int8", {}),
    "onnx-int8-dynamic": ("onnx-int8-dynamic", {}),
    "openvino-int8": ("openvino-int8", {}),
    # As served (FASTINFER_OPENVINO_PRECISION, default auto: BF16 here); FP32 is checked above.
    "openvino-served-precision": ("openvino", {}),
    # FP16 on the Neural Engine / GPU: macOS only (skipped elsewhere, with the reason). MAX_DRIFT was
    # measured on INT8 here, not on a Mac; FP16's logit error is far below INT8's, so it should hold.
    "coreml": ("coreml", {}),
    "coreml-batched": ("coreml-batched", {}),
}


def open_stored(backend: str, reference: Reference, **options: Any) -> Any:
    """The backend's engine as the service opens it, after checking its models hold the reference's weights."""
    reason = unavailable_reason(backend)
    if reason is not None:
        pytest.skip(reason)  # e.g. "CoreML prediction needs macOS"
    spec = SPECS[backend]
    for batch in spec.static_batches:
        model = store.find(spec.artifact, batch)
        assert model is not None and model.info.labels["source_hash"] == reference.source_hash, (
            f"{store.model_name(spec.artifact, batch)} was not built from the reference's weights"
        )
    return open_engine(backend, **options)


def check_drift(name: str, reference: Reference, logits: np.ndarray) -> None:
    offsets = drift(reference, logits)
    assert np.abs(offsets).max() <= MAX_DRIFT, (
        f"{name} normalises unlike torchvision: fitted offsets {describe_drift(offsets)} (max allowed {MAX_DRIFT})"
    )
    spread = relative_rms(reference, logits)
    assert spread.max() <= MAX_RELATIVE_RMS, f"{name}: RMS logit error / logit spread per image {spread.round(3)}"


@pytest.mark.parametrize("backend", list(FP32))
def test_fp32_backend_equals_torchvision(reference: Reference, pixels: np.ndarray, backend: str) -> None:
    engine = open_stored(backend, reference, **FP32[backend])
    logits = engine.run(pixels)
    assert logits.shape == reference.logits.shape and logits.dtype == np.float32
    if not on_cpu(engine.describe()):
        check_drift(backend, reference, logits)
        return
    error = float(np.max(np.abs(logits - reference.logits)))
    tolerance = FP32_TOLERANCE * float(np.max(np.abs(reference.logits)))
    assert error <= tolerance, (
        f"{backend}: max |logit - torchvision| {error:.3g} > {tolerance:.3g}; "
        f"fitted offsets {describe_drift(drift(reference, logits))}"
    )


@pytest.mark.parametrize("case", list(APPROXIMATE))
def test_approximate_backend_normalises_like_torchvision(reference: Reference, pixels: np.ndarray, case: str) -> None:
    backend, options = APPROXIMATE[case]
    engine = open_stored(backend, reference, **options)
    check_drift(case, reference, engine.run(pixels))


def test_the_drift_fit_recovers_a_known_offset(reference: Reference, pixels: np.ndarray) -> None:
    """The fit itself: torchvision's pipeline with mean R 0.5 and std B 0.24 is read back as such."""
    mean, std = reference.mean, reference.std
    wrong = torchvision_logits(reference.net, pixels, [0.5, *mean[1:]], [*std[:2], 0.24])
    expected = np.array([0.5 - mean[0], 0, 0, 0, 0, 0.24 - std[2]])
    np.testing.assert_allclose(drift(reference, wrong), expected, atol=1e-3)
    with pytest.raises(AssertionError, match="normalises unlike torchvision"):
        check_drift("wrong", reference, wrong)
