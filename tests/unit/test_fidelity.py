"""Fidelity gates: every backend against the FP32 PyTorch reference on 36 real photos.

Thresholds (random-init weights, which is what this machine can have; measured here:
static INT8 top-1 97%, top-5 96%, max |logit error| 1.6; dynamic INT8 100%, 90%, 1.8):

* top-1 agreement >= 90%  — a static INT8 model calibrated on black images agrees on 81% (test_build_verification.py),
  one calibrated on a single photo on 89%;
* top-5 overlap >= 85%    — feeding the model the wrong input scale (0..4 instead of 0..255)
  keeps top-1 on this random network (97%) but drops top-5 to 82%;
* max |logit error| <= 5  — the broken variants above reach 17, 28 and 59.
A per-tensor (instead of per-channel) model is not caught on random-init weights (97%, 2.4):
kaiming-initialised channels share one range, so per-tensor costs little here. With ImageNet
weights it is the classic failure; these gates then apply as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, fields, replace

import numpy as np
import pytest

from fastinfer import cli
from fastinfer.catalog.backends import open_engine
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure import fidelity as fid

TOP1, TOP5, MAX_ERROR = fid.INT8_MIN_TOP1, fid.INT8_MIN_TOP5, fid.INT8_MAX_ERROR


def passes(f: fid.Fidelity) -> bool:
    return f.top1_agreement >= TOP1 and f.top5_overlap >= TOP5 and f.max_abs_error <= MAX_ERROR


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return fid.fidelity_images(PreprocessSpec())


@dataclass
class Run:
    """What ``fastinfer fidelity`` compared: its rows by backend, the table it printed, and, as it ran, its reference
    (pytorch FP32 on its photos) and each backend's logits on them."""

    rows: dict[str, dict]
    printed: str
    images: np.ndarray
    reference: np.ndarray
    logits: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def run(built_models, tmp_path_factory) -> Run:
    """``fastinfer fidelity --json``: every backend stored and able to run here against the reference, on the
    same photos as ``images``."""
    out, printed = tmp_path_factory.mktemp("fidelity") / "fidelity.json", io.StringIO()
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    logits: dict[str, np.ndarray] = {}
    measure, compare = fid.measure, fid.compare

    def measuring(backend: str, engine: object, images: np.ndarray, reference: np.ndarray) -> dict[str, object]:
        seen.append((images, reference))
        return measure(backend, engine, images, reference)

    def comparing(backend: str, reference: np.ndarray, found: np.ndarray) -> fid.Fidelity:
        logits[backend] = found
        return compare(backend, reference, found)

    with pytest.MonkeyPatch.context() as patch:  # the command's own computations, kept for the tests below
        patch.setattr(fid, "measure", measuring)
        patch.setattr(fid, "compare", comparing)
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["fidelity", "--json", str(out)]) == 0
    (images, reference), *others = seen
    assert all(i is images and r is reference for i, r in others)  # one reference for every backend
    rows = {r["backend"]: r for r in json.loads(out.read_text())}
    return Run(rows, printed.getvalue(), images, reference, logits)


@pytest.fixture(scope="module")
def command(run: Run) -> tuple[dict[str, dict], str]:
    """The command's rows by backend, and the table it printed."""
    return run.rows, run.printed


@pytest.fixture(scope="module")
def reference(run: Run, images: np.ndarray) -> np.ndarray:
    """PyTorch FP32's logits on ``images``: what the command computed as its reference, on the same photos."""
    np.testing.assert_array_equal(run.images, images)
    return run.reference


def measured(command: tuple[dict[str, dict], str], backend: str) -> fid.Fidelity:
    row = command[0][backend]
    return fid.Fidelity(**{field.name: row[field.name] for field in fields(fid.Fidelity)})


def test_the_command_writes_a_table_and_json_and_every_gate_passes(command) -> None:
    rows, printed = command
    assert {"onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8"} <= rows.keys()
    assert all(r["images"] == 36 and r["gate_passed"] for r in rows.values()), rows
    assert rows["onnx"]["gate"] == "fp32" and rows["openvino-int8"]["gate"] == "int8"
    assert rows["openvino"]["gate"] == {"bf16": "bf16", "f32": "fp32"}[rows["openvino"]["precision"]]
    assert "| backend | runs at | images | top-1 agreement" in printed


def test_onnx_fp32_is_the_reference(command) -> None:
    f = measured(command, "onnx")
    assert f.top1_agreement == 1.0 and f.top5_overlap == 1.0
    assert f.max_abs_error <= 1e-3 and f.cosine > 0.99999


def test_openvino_at_f32_is_the_reference(images, reference) -> None:
    f = fid.compare("openvino", reference, fid.run_batched(open_engine("openvino", precision="f32"), images))
    assert f.top1_agreement == 1.0 and f.top5_overlap == 1.0 and f.max_abs_error <= 1e-3


@pytest.mark.parametrize("backend", ["onnx-int8", "onnx-int8-dynamic", "openvino-int8"])
def test_int8_backends_pass_the_gates(command, backend: str) -> None:
    f = measured(command, backend)
    assert passes(f), f
    assert fid.INT8_GATE.passes(f)


@pytest.fixture(scope="module")
def bf16() -> object:
    engine = open_engine("openvino")
    if engine.describe()["precision"] != "bf16":
        pytest.skip("this CPU has no BF16 units (AVX-512 BF16 / AMX): openvino runs f32 here (tested above)")
    return engine


def test_openvino_in_bf16_passes_the_bf16_gates(command, bf16) -> None:
    assert command[0]["openvino"]["precision"] == "bf16"  # as served: `auto`, BF16 where the CPU has it
    f = measured(command, "openvino")
    assert fid.BF16_GATE.passes(f), f
    assert f.max_abs_error > 1e-3, "BF16 that equals FP32 to 1e-3 is not running in BF16"


def test_the_bf16_gates_catch_a_shifted_input_a_wrong_scale_and_an_int8_model(run, images, reference, bf16) -> None:
    shifted = np.clip(images.astype(np.int16) + 8, 0, 255).astype(np.uint8)
    wrong = (images.astype(np.float32) / 255 * 4).astype(np.uint8)
    for name, logits in (
        ("8 grey levels off", fid.run_batched(bf16, shifted)),
        ("wrong input scale", fid.run_batched(bf16, wrong)),
        ("the INT8 model", run.logits["openvino-int8"]),  # as the command ran it: served, on ``images``
    ):
        f = fid.compare(name, reference, logits)
        assert not fid.BF16_GATE.passes(f), f


def test_the_gates_catch_a_wrong_input_scale(images, reference) -> None:
    wrong = (images.astype(np.float32) / 255 * 4).astype(np.uint8)
    f = fid.compare("wrong-scale", reference, fid.run_batched(open_engine("onnx-int8"), wrong))
    assert not passes(f), f


def test_metrics_on_known_logits() -> None:
    ref = np.array([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])
    same = fid.compare("same", ref, ref.copy())
    assert (same.top1_agreement, same.top5_overlap, round(same.cosine, 6), same.max_abs_error) == (1, 1, 1, 0)
    swapped = ref.copy()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    f = fid.compare("swapped", ref, swapped)
    assert f.top1_agreement == 0.5 and f.top5_overlap == 1.0 and f.max_abs_error == 1.0


def test_each_backend_answers_to_the_gate_of_what_it_computes_in() -> None:
    ok = fid.Fidelity("x", 36, top1_agreement=1.0, top5_overlap=0.99, cosine=0.99999, max_abs_error=0.39)
    assert fid.BF16_GATE.passes(ok)  # what OpenVINO BF16 measured here
    assert not fid.BF16_GATE.passes(replace(ok, max_abs_error=1.52))  # the INT8 model's error
    assert not fid.BF16_GATE.passes(replace(ok, top5_overlap=0.92))
    assert not fid.BF16_GATE.passes(replace(ok, max_abs_error=float("nan")))
    assert fid.gate_for("openvino-int8", "bf16") == ("int8", fid.INT8_GATE)
    assert fid.gate_for("openvino", "bf16") == ("bf16", fid.BF16_GATE)
    assert fid.gate_for("openvino", "f32") == ("fp32", fid.FP32_GATE)
    assert fid.gate_for("coreml-batched", "fp16") is None


class Said:
    """An engine that says what it computes in and answers the reference's logits."""

    def __init__(self, described: dict, logits: np.ndarray) -> None:
        self.described, self.logits = described, logits

    def describe(self) -> dict:
        return self.described

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.logits[: len(x)]


def test_fidelity_names_the_precision_as_the_accuracy_table_does() -> None:
    """One rule (accuracy.run_precision): OpenVINO's "f32" is fp32 as ONNX Runtime's unsaid one is, and held to the
    FP32 gate; the CoreML EP, which says nothing and may compute in FP16, answers to none."""
    logits = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    images = np.zeros((4, 224, 224, 3), np.uint8)
    for backend, described, precision, gate in [
        ("openvino", {"precision": "f32"}, "fp32", "fp32"),
        ("onnx", {"execution_providers": ["CPUExecutionProvider"]}, "fp32", "fp32"),
        ("openvino", {"precision": "bf16"}, "bf16", "bf16"),
        ("onnx-int8", {"precision": "f32"}, "int8", "int8"),
        ("onnx", {"execution_providers": ["CoreMLExecutionProvider"]}, "unknown", None),
    ]:
        out = fid.measure(backend, Said(described, logits), images, logits)
        assert (out["precision"], out.get("gate"), out.get("gate_passed", True)) == (precision, gate, True), backend
