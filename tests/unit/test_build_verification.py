"""An export that diverges from PyTorch beyond its artifact's tolerance, or does not load, is refused and not
stored; what converts it is skipped, the other backends are built, and the build ends with its table and fails."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
import pytest
from PIL import Image

from build_models import ARTIFACTS, FP32_TOLERANCE, INT8_TOLERANCE, BuildRefused, build, exporters
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure.fidelity import Fidelity, compare

SMALL = PreprocessSpec(resize_size=64, crop_size=64)  # photos of 64 px where the image size is not what is tested


def stored_tags(name: str) -> list[str]:
    return sorted(str(m.tag) for m in bentoml.models.list(name))


def test_tolerances_on_known_numbers() -> None:
    exact = Fidelity("x", images=8, top1_agreement=1.0, top5_overlap=1.0, cosine=1.0, max_abs_error=3e-5)
    assert FP32_TOLERANCE.violations(exact) == [] and INT8_TOLERANCE.violations(exact) == []
    assert FP32_TOLERANCE.violations(replace(exact, max_abs_error=float("nan")))
    one_flip = replace(exact, top1_agreement=7 / 8, top5_overlap=0.9, max_abs_error=2.0)
    assert INT8_TOLERANCE.violations(one_flip) == []
    assert len(FP32_TOLERANCE.violations(one_flip)) == 2
    assert len(INT8_TOLERANCE.violations(replace(one_flip, top1_agreement=6 / 8, top5_overlap=0.8))) == 2
    assert len(INT8_TOLERANCE.violations(replace(one_flip, max_abs_error=5.1))) == 1
    # Logits of a larger scale (a fine-tuned head's): the limit grows with them, 0.3 standard deviations.
    assert INT8_TOLERANCE.violations(replace(one_flip, max_abs_error=8.9, reference_std=30.0)) == []
    assert len(INT8_TOLERANCE.violations(replace(one_flip, max_abs_error=9.1, reference_std=30.0))) == 1


def test_a_family_of_fewer_than_five_classes_is_compared_on_its_top_classes() -> None:
    reference = np.array([[3.0, 2.0, 1.0], [0.0, 1.0, 2.0]], dtype=np.float32)
    found = compare("onnx-int8", reference, reference + 0.01)
    assert found.top1_agreement == 1.0 and found.top5_overlap == 1.0, "3 of 3 classes, not 3 of 5"


def shifted_onnx(ctx: Any, out_dir: Path) -> dict[str, Any]:
    """The FP32 export with every logit shifted by +0.5: top-1 intact, the model wrong."""
    import onnx
    from onnx import numpy_helper

    extra = exporters.export_onnx(ctx, out_dir)
    path = out_dir / exporters.ONNX_FILE
    model = onnx.load(path)
    (bias,) = [t for t in model.graph.initializer if list(t.dims) == [1000]]  # the classifier's bias
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(0.5), bias.name))
    onnx.save(model, path)
    return extra


def test_a_divergent_export_is_refused_and_the_next_backend_is_built(private_store, monkeypatch) -> None:
    before = stored_tags("resnet50-onnx")
    monkeypatch.setitem(ARTIFACTS, "onnx", replace(ARTIFACTS["onnx"], export=shifted_onnx))
    said: list[str] = []
    with pytest.raises(BuildRefused) as err:
        build("random", only=["onnx", "onnx-int8-dynamic"], force=True, progress=said.append)
    assert str(err.value).startswith("1 model(s) refused") and str(err.value).endswith(": resnet50-onnx")
    (refused,) = [line for line in said if line.startswith("[1/2] resnet50-onnx: REFUSED: ")]
    assert (
        re.search(r"max \|logit diff\| 0\.5\d* > 0\.001", refused) and f"Nothing stored; {before[0]} stays" in refused
    )
    assert stored_tags("resnet50-onnx") == before  # the previous version stays, nothing new
    # The next backend is built and stored all the same, and the table the build ends with says both.
    assert any(line.startswith("[2/2] resnet50-onnx-int8-dynamic: stored ") for line in said), said
    table = said[said.index("| model | outcome | why |") :]
    assert table[2].startswith("| resnet50-onnx | refused | the export diverges from PyTorch") and "\\|" in table[2]
    assert table[3].startswith("| resnet50-onnx-int8-dynamic | stored | resnet50-onnx-int8-dynamic:")
    assert table[-1] == "build: 1 stored, 1 refused"


def failing_export(monkeypatch) -> str:
    """pytorch's converter raises on this model."""

    def failing(ctx: Any, out_dir: Path) -> dict[str, Any]:
        raise RuntimeError("the converter cannot\nconvert this graph")

    monkeypatch.setitem(ARTIFACTS, "pytorch", replace(ARTIFACTS["pytorch"], export=failing))
    return "the export failed: RuntimeError: the converter cannot convert this graph. Nothing stored."


def failing_run(monkeypatch) -> str:
    """onnx's engine opens, then raises when run (review: that stopped the whole build with a traceback)."""
    import build_models

    real_open = build_models.open_engine

    class Failing:
        def run(self, batch: Any) -> Any:
            raise RuntimeError("simulated failure\nat run time")

    def opened(name: str, **options: Any) -> Any:
        return Failing() if name == "onnx" else real_open(name, **options)

    monkeypatch.setattr(build_models, "open_engine", opened)
    return "the export does not run: RuntimeError: simulated failure at run time. Nothing stored."


@pytest.mark.heavy  # a model build
@pytest.mark.parametrize(
    "break_, only", [(failing_export, ["pytorch", "onnx"]), (failing_run, ["onnx", "onnx-int8-dynamic"])]
)
def test_an_export_that_fails_or_fails_to_run_is_refused_and_the_next_backend_is_built(
    tmp_path, monkeypatch, break_, only
) -> None:
    """It stops nothing but its own backend (a store of this test's own; photos of 64 px, SMALL)."""
    from tests.conftest import model_store_at

    why = break_(monkeypatch)
    refused, built = (f"failing-{name}" for name in only)
    said: list[str] = []
    with model_store_at(tmp_path / "home"), pytest.raises(BuildRefused, match=f": {refused}$"):
        build("random", only=only, family="failing", progress=said.append, preprocess=SMALL)
    models = tmp_path / "home" / "models"
    assert not (models / refused).exists() and len(list((models / built).glob("*/model.yaml"))) == 1
    assert f"[1/2] {refused}: REFUSED: {why}" in said and f"| {refused} | refused | {why} |" in said


def test_int8_calibrated_on_a_black_image_is_refused_by_the_build_and_the_fidelity_gates(
    private_store, tmp_path, monkeypatch
) -> None:
    """The real INT8 tolerance against a real broken quantization (measured here: max |logit diff| 15.5); the
    fidelity gates (`fastinfer fidelity`, 36 other photos) refuse the same model."""
    from fastinfer.catalog.backends import open_engine
    from fastinfer.engines.onnx import OnnxEngine
    from fastinfer.measure import fidelity as fid

    black = tmp_path / "calibration"
    black.mkdir()
    Image.new("RGB", (300, 300)).save(black / "black.png")
    refused, export = tmp_path / "refused", ARTIFACTS["onnx-int8"].export

    def keeping_a_copy(ctx: Any, out_dir: Path) -> dict[str, Any]:
        meta = export(ctx, out_dir)
        shutil.copytree(out_dir, refused)
        return meta

    monkeypatch.setitem(ARTIFACTS, "onnx-int8", replace(ARTIFACTS["onnx-int8"], export=keeping_a_copy))
    before = {name: stored_tags(name) for name in ("resnet50-onnx-int8", "resnet50-openvino-int8")}
    said: list[str] = []
    # Not --force: asked for another calibration, the INT8 models are rebuilt from the stored FP32 ONNX file.
    with pytest.raises(BuildRefused, match=r"^1 model\(s\) refused.*: resnet50-onnx-int8$"):
        build("random", only=["onnx-int8", "openvino-int8"], progress=said.append, calibration_dir=black)
    assert any(re.search(r"resnet50-onnx-int8: REFUSED: .*max \|logit diff\| [\d.]+ > 5", line) for line in said)
    # openvino-int8 converts that export: skipped, and says why; the version stored before stays.
    skipped = "[2/2] resnet50-openvino-int8: skipped: converts resnet50-onnx-int8's export, refused in this build"
    assert any(line.startswith(skipped) for line in said), said
    assert {name: stored_tags(name) for name in before} == before
    images = fid.fidelity_images(PreprocessSpec())
    reference = fid.run_batched(open_engine("pytorch"), images)
    f = fid.compare("broken", reference, fid.run_batched(OnnxEngine(refused, cpu_only=True), images))
    assert not fid.INT8_GATE.passes(f), f


def test_a_runtime_that_cannot_run_here_skips_its_artifact_and_the_build_goes_on(private_store, monkeypatch) -> None:
    import build_models
    from fastinfer.engines import EngineUnavailable

    real = build_models.open_engine

    def crashing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("openvino"):
            raise EngineUnavailable("OpenVINO compile_model crashed with SIGFPE on this CPU")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(build_models, "open_engine", crashing)
    before = stored_tags("resnet50-openvino")
    said: list[str] = []
    results = build("random", only=["openvino", "onnx"], force=True, progress=said.append)
    assert [r.name for r in results] == ["resnet50-onnx"]  # built after the skipped one
    assert any("resnet50-openvino: skipped: OpenVINO compile_model crashed with SIGFPE" in s for s in said), said
    assert stored_tags("resnet50-openvino") == before


def test_an_export_that_does_not_load_is_refused_and_the_build_exits_1(private_store, monkeypatch, capsys) -> None:
    """A broken IR is the export's fault, not this CPU's: it is refused (not skipped), and the build exits 1."""
    from build_models import __main__ as cli

    def truncated(ctx: Any, out_dir: Path) -> dict[str, Any]:
        extra = exporters.export_openvino(ctx, out_dir)
        weights = out_dir / "model.bin"
        weights.write_bytes(weights.read_bytes()[:100_000])
        return extra

    monkeypatch.setitem(ARTIFACTS, "openvino", replace(ARTIFACTS["openvino"], export=truncated))
    before = stored_tags("resnet50-openvino")
    assert cli.main(["--weights", "random", "--only", "openvino", "--force"]) == 1
    out, err = capsys.readouterr()
    assert err.strip().startswith("build_models: 1 model(s) refused") and "\n" not in err.strip(), err
    assert err.strip().endswith(": resnet50-openvino")
    said = "[1/1] resnet50-openvino: REFUSED: the export does not load: OpenVINO "
    assert said in out and "Nothing stored; resnet50-openvino:" in out
    assert "| resnet50-openvino | refused | the export does not load: OpenVINO " in out
    assert stored_tags("resnet50-openvino") == before


def test_openvino_int8_is_the_conversion_of_the_stored_onnx_int8_model(built_models) -> None:
    from build_models.context import stored_int8_sha256
    from fastinfer.catalog import store

    meta = store.find("openvino-int8").info.metadata
    assert meta["int8_onnx_sha256"] == stored_int8_sha256(store.DEFAULT_FAMILY)  # one calibration for both runtimes
    assert meta["calibration_source"] == store.find("onnx-int8").info.metadata["calibration_source"]


class Stored:
    """A stored model's metadata, for the currency checks."""

    def __init__(self, **metadata: Any) -> None:
        self.info = type("Info", (), {"metadata": metadata})()


def test_int8_models_are_stale_when_calibrated_otherwise_than_asked(tmp_path, monkeypatch) -> None:
    from build_models import context as c

    def ctx(calibration_dir: Path | None = None, activations: str | None = None) -> c.BuildContext:
        return c.BuildContext(None, None, None, calibration_dir, activations)  # type: ignore[arg-type]

    bundled = {
        "calibration_source": ctx().calibration_source,
        "quantization": "static QDQ U8S8, per-channel weights, MinMax calibration",
    }
    assert ctx().calibrated_as_asked(Stored(**bundled))  # nothing asked: the stored calibration stands
    assert not ctx(tmp_path).calibrated_as_asked(Stored(**bundled))
    assert ctx(tmp_path).calibrated_as_asked(Stored(**{**bundled, "calibration_source": str(tmp_path)}))
    assert ctx(activations="u8").calibrated_as_asked(Stored(**bundled))
    assert not ctx(activations="s8").calibrated_as_asked(Stored(**bundled))

    monkeypatch.setattr(c, "stored_int8_sha256", lambda family_name: "abc")
    assert ctx().converts_stored_int8_as_asked(Stored(**bundled, int8_onnx_sha256="abc"))
    assert not ctx().converts_stored_int8_as_asked(Stored(**bundled, int8_onnx_sha256="old"))
    assert not ctx().converts_stored_int8_as_asked(Stored(**bundled))
    assert not ctx(tmp_path).converts_stored_int8_as_asked(Stored(**bundled, int8_onnx_sha256="abc"))
