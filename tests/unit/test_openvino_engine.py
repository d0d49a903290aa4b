"""The OpenVINO engine: same logits as ORT at f32, an honest per-layer precision report, clear errors,
a compiled-model cache and a crash-proof preflight."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common import hardware
from fastinfer.engines import EngineUnavailable
from fastinfer.engines import openvino as ove
from fastinfer.engines.onnx import OnnxEngine
from fastinfer.measure import fidelity as fid

CONVOLUTIONS = 53  # ResNet-50


@pytest.fixture(scope="module")
def irs(built_models) -> dict[str, Path]:
    """The stored IRs: the build's conversions of the stored FP32 and static QDQ INT8 ONNX models."""
    return {"float": Path(store.find("openvino").path), "int8": Path(store.find("openvino-int8").path)}


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return fid.fidelity_images(PreprocessSpec())[::6]  # 6 real photos, differently framed


def native_bf16() -> bool:
    return "BF16" in ove.import_openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def test_importing_the_module_does_not_import_openvino() -> None:
    code = "import sys, fastinfer.engines.openvino; assert 'openvino' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_openvino_is_used_without_its_telemetry(irs, tmp_path) -> None:
    """Importing, converting and compiling leave no trace of openvino_telemetry (it writes ~/intel)."""
    code = (
        "from fastinfer.engines import openvino as ove\n"
        "ov = ove.import_openvino()\n"
        f"ov.convert_model({str(store.find('onnx-int8').path + '/model.onnx')!r})\n"
        f"ove.OpenVinoEngine({str(irs['int8'])!r}, threads=1, expect='int8')\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "CI": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[2])
    assert not (tmp_path / "intel").exists(), list((tmp_path / "intel").iterdir())


def test_f32_equals_onnx_runtime(irs, images) -> None:
    reference = OnnxEngine(store.find("onnx").path, threads=2, cpu_only=True).run(images)
    engine = ove.OpenVinoEngine(irs["float"], threads=2, precision="f32")
    logits = engine.run(images)
    assert logits.shape == (len(images), 1000) and logits.dtype == np.float32
    assert float(np.max(np.abs(logits - reference))) <= 1e-3
    assert engine.run(images[:1]).shape == (1, 1000)
    described = engine.describe()  # forced f32: f32 everywhere, and no fallback
    assert described["precision"] == described["precision_requested"] == "f32"
    assert described["layer_precision"]["Convolution"] == f"f32 {CONVOLUTIONS}/{CONVOLUTIONS}"
    assert described["fallbacks"] == [] and described["threads"] == 2


def test_auto_precision_is_reported_as_compiled(irs) -> None:
    described = ove.OpenVinoEngine.open({None: str(irs["float"])}).describe()
    actual = "bf16" if native_bf16() else "f32"  # OpenVINO's CPU default
    assert described["precision_requested"] == "auto" and described["precision"] == actual
    assert described["layer_precision"]["Convolution"] == f"{actual} {CONVOLUTIONS}/{CONVOLUTIONS}"
    assert described["layer_precision"]["FullyConnected"] == f"{actual} 1/1"
    assert described["fallbacks"] == []
    assert described["threads"] == hardware.cpu_count() and described["streams"] == 1
    assert described["runtime"].startswith("OpenVINO 20")


def test_int8_model_runs_its_convolutions_in_int8(irs, images) -> None:
    engine = ove.OpenVinoEngine(irs["int8"], threads=2, expect="int8")
    convolutions = engine.layers["Convolution"]
    assert sum(convolutions.values()) == CONVOLUTIONS
    assert set(convolutions) <= {"u8", "i8"}, convolutions
    assert engine.describe()["fallbacks"] == []
    reference = OnnxEngine(store.find("onnx-int8").path, threads=2, cpu_only=True).run(images)
    assert np.array_equal(np.argmax(engine.run(images), 1), np.argmax(reference, 1))


def test_bad_options_are_refused_before_loading(tmp_path) -> None:
    with pytest.raises(ValueError, match="auto, bf16, f32"):
        ove.OpenVinoEngine(tmp_path, precision="fp16")
    with pytest.raises(ValueError, match="float, int8"):
        ove.OpenVinoEngine(tmp_path, expect="int4")


def test_bf16_is_refused_on_a_cpu_without_native_bf16(irs, monkeypatch) -> None:
    ov = ove.import_openvino()

    class NoBf16Core(ov.Core):
        def get_property(self, device, name, *args):
            if name == "OPTIMIZATION_CAPABILITIES":
                return ["WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]
            return super().get_property(device, name, *args)

    monkeypatch.setattr(ov, "Core", NoBf16Core)
    with pytest.raises(EngineUnavailable, match="native BF16"):
        ove.OpenVinoEngine(irs["float"], precision="bf16")
    assert ove.OpenVinoEngine(irs["float"], precision="auto").describe()["fallbacks"] == []

    def no_preflight(*args: object) -> None:
        raise AssertionError("bf16 on this CPU is refused before a child compiles anything")

    monkeypatch.setattr(ove, "preflight", no_preflight)
    with pytest.raises(EngineUnavailable, match="native BF16"):
        ove.OpenVinoEngine.open({None: str(irs["float"])}, 2, precision="bf16", preflight=True)


def test_a_missing_or_corrupt_model_is_a_clear_error(irs, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no OpenVINO IR at .*model\.xml"):
        ove.OpenVinoEngine(tmp_path / "nowhere")
    (tmp_path / ove.MODEL_FILE).write_text("<net>not an IR")
    with pytest.raises(RuntimeError, match=r"OpenVINO could not compile .*Unable to read the model"):
        ove.OpenVinoEngine(tmp_path)
    (tmp_path / ove.MODEL_FILE).write_bytes((irs["int8"] / ove.MODEL_FILE).read_bytes())  # no model.bin
    with pytest.raises(RuntimeError, match=r"OpenVINO could not compile .*bin file"):
        ove.OpenVinoEngine(tmp_path)


def test_the_cache_is_filled_and_reused(irs, images, tmp_path) -> None:
    cache = tmp_path / "cache"
    first = ove.OpenVinoEngine(irs["int8"], threads=2, cache_dir=cache, expect="int8")
    assert list(cache.glob("*.blob")), list(cache.iterdir())
    assert first.describe()["loaded_from_cache"] is False
    second = ove.OpenVinoEngine(irs["int8"], threads=2, cache_dir=cache, expect="int8")
    assert second.describe()["loaded_from_cache"] is True  # imported, not compiled anew
    assert np.array_equal(first.run(images), second.run(images))
    described = second.describe()
    assert described["cache_dir"] == str(cache) and described["compile_s"] >= 0
    assert described["layer_precision"] == first.describe()["layer_precision"]


def test_preflight(irs, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    assert ove.preflight(irs["int8"], threads=2, cache_dir=cache) is None
    assert list(cache.glob("*.blob"))  # so that the engine's compile is a cache hit
    assert ove.OpenVinoEngine(irs["int8"], threads=2, cache_dir=cache).describe()["loaded_from_cache"] is True

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ove.MODEL_FILE).write_text("<net>not an IR")
    with pytest.raises(RuntimeError, match=r"compile_model failed .*Unable to read the model") as bad:
        ove.preflight(broken)
    assert not isinstance(bad.value, EngineUnavailable)  # a bad model is not this CPU's fault
    with pytest.raises(FileNotFoundError, match="no OpenVINO IR"):
        ove.preflight(tmp_path / "nowhere")

    # A crash on an instruction is about this CPU (EngineUnavailable); a kill is about the moment.
    monkeypatch.setattr(ove, "_PREFLIGHT", "import os, signal; os.kill(os.getpid(), signal.SIGFPE)")
    with pytest.raises(EngineUnavailable, match=r"^OpenVINO compile_model crashed with SIGFPE on this CPU$"):
        ove.preflight(irs["int8"])
    monkeypatch.setattr(ove, "_PREFLIGHT", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(RuntimeError, match=r"killed by SIGKILL \(out of memory\?\)") as killed:
        ove.preflight(irs["int8"])
    assert not isinstance(killed.value, EngineUnavailable)


def test_open_preflights_and_keeps_one_cache_folder_per_stored_version(irs, tmp_path, monkeypatch) -> None:
    version = tmp_path / "resnet50-openvino-int8" / "abc123"
    version.parent.mkdir()
    version.symlink_to(irs["int8"])
    engine = ove.OpenVinoEngine.open({None: str(version)}, 2, cache_dir=str(tmp_path / "cache"), preflight=True)
    cache_dir = Path(engine.describe()["cache_dir"])
    assert cache_dir.parent == tmp_path / "cache" / "resnet50-openvino-int8" / "abc123"
    assert engine.describe()["loaded_from_cache"] is True  # the preflight child compiled it

    def crash(*args: object) -> None:
        raise EngineUnavailable("OpenVINO compile_model crashed with SIGFPE on this CPU")

    monkeypatch.setattr(ove, "preflight", crash)
    with pytest.raises(EngineUnavailable, match="SIGFPE"):
        ove.OpenVinoEngine.open({None: str(version)}, 2, preflight=True)


def test_new_weights_under_the_same_path_are_not_served_from_the_old_cache(irs, images, tmp_path) -> None:
    version = tmp_path / "resnet50-openvino" / "v1"
    shutil.copytree(irs["float"], version)
    cache = str(tmp_path / "cache")
    old = ove.OpenVinoEngine.open({None: str(version)}, 2, cache_dir=cache, precision="f32").run(images)
    weights = np.fromfile(version / "model.bin", dtype=np.uint8)  # other weights, same path and size
    middle = weights[len(weights) // 2 : len(weights) // 2 + 4_000_000].view(np.float32)
    middle *= 3
    weights.tofile(version / "model.bin")
    reopened = ove.OpenVinoEngine.open({None: str(version)}, 2, cache_dir=cache, precision="f32")
    assert reopened.describe()["loaded_from_cache"] is False
    uncached = ove.OpenVinoEngine(version, threads=2, precision="f32").run(images)
    assert np.allclose(reopened.run(images), uncached, atol=1e-4)
    assert not np.allclose(old, uncached, atol=1e-2)


def test_a_batch_larger_than_one_request_is_split_and_answered_in_order(irs, images) -> None:
    engine = ove.OpenVinoEngine(irs["int8"], threads=2, expect="int8")
    many = np.concatenate([images] * (ove.MAX_REQUEST_ROWS // len(images) + 2))[: ove.MAX_REQUEST_ROWS + 5]
    whole = engine.run(many)
    assert whole.shape == (len(many), 1000)
    assert np.allclose(whole[-5:], engine.run(many[-5:]), atol=1e-4)


def op(layer: str | None, precision: str, wrapped: bool = False) -> SimpleNamespace:
    """Stands in for a runtime-graph op: rt_info values as plain strings or as OVAny-like objects."""
    wrap = (lambda text: SimpleNamespace(astype=lambda kind: text)) if wrapped else str
    info = {} if layer is None else {"layerType": wrap(layer), "runtimePrecision": wrap(precision)}
    return SimpleNamespace(get_rt_info=lambda: info)


def test_layer_precision_and_fallbacks_on_a_mixed_graph() -> None:
    ops = [op("Convolution", "u8", wrapped=True)] * 50 + [op("Convolution", "f32")] * 3
    ops += [op("FullyConnected", "f32"), op("Pooling", "u8"), op(None, "")]
    counts = ove.layer_precision(SimpleNamespace(get_ordered_ops=lambda: ops))
    assert counts == {
        "Convolution": Counter(u8=50, f32=3),
        "FullyConnected": Counter(f32=1),
        "Pooling": Counter(u8=1),
    }
    assert ove.summary(counts["Convolution"]) == "u8 50/53, f32 3/53"
    assert ove.fallbacks(counts, "int8", "bf16") == [
        "3/53 Convolution layers do not run in INT8: 3 in f32",
        "1/1 FullyConnected layers do not run in INT8: 1 in f32",
    ]

    float_counts = {"Convolution": Counter(bf16=52, f32=1), "FullyConnected": Counter(bf16=1)}
    assert ove.fallbacks(float_counts, "float", "bf16") == ["1/53 Convolution layers do not run in bf16: 1 in f32"]
    assert ove.fallbacks({"Convolution": Counter(f32=53)}, "float", "f32") == []  # asked for, not a fallback
    assert ove.fallbacks({"Convolution": Counter(bf16=53)}, "float", "bf16") == []
    assert ove.fallbacks({"Convolution": Counter(i8=53)}, "int8", "f32") == []
    assert ove.fallbacks({}, "int8", "bf16") == [
        "OpenVINO reported no Convolution layers in the runtime graph: their precision is unknown"
    ]
