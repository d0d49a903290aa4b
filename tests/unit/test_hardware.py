"""Device and execution-provider choice, checked with stand-ins for macOS and CUDA machines."""

from __future__ import annotations

from fastinfer import hardware

ALL = ["CoreMLExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def test_linux_without_gpu_uses_cpu(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: False)
    monkeypatch.setattr(hardware, "_cuda_device_present", lambda: False)
    assert hardware.onnx_providers(ALL) == ["CPUExecutionProvider"]


def test_linux_with_a_gpu_prefers_cuda(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: False)
    monkeypatch.setattr(hardware, "_cuda_device_present", lambda: True)
    assert hardware.onnx_providers(ALL) == ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_macos_prefers_coreml(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: True)
    monkeypatch.setattr(hardware, "_cuda_device_present", lambda: False)
    assert hardware.onnx_providers(ALL) == ["CoreMLExecutionProvider", "CPUExecutionProvider"]


def test_cpu_only_ignores_accelerators(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: True)
    assert hardware.onnx_providers(ALL, cpu_only=True) == ["CPUExecutionProvider"]


def test_a_provider_missing_from_the_wheel_is_not_requested(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: True)
    monkeypatch.setattr(hardware, "_cuda_device_present", lambda: True)
    assert hardware.onnx_providers(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_threads_split_the_cores_between_workers(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "cpu_count", lambda: 8)
    assert hardware.intra_op_threads(1) == 8
    assert hardware.intra_op_threads(3) == 2
    assert hardware.intra_op_threads(16) == 1
    assert hardware.intra_op_threads(2, override=5) == 5


EVERY = ["pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8", "coreml-batched"]


def test_the_rule_prefers_openvino_int8_on_integer_units_then_onnx_int8() -> None:
    hw = {"isa": ["avx512", "avx512_vnni"], "cuda": False}
    assert hardware.recommend(hw, EVERY)["backend"] == "openvino-int8"
    assert hardware.recommend(hw, [b for b in EVERY if not b.startswith("openvino")])["backend"] == "onnx-int8"


def test_the_rule_prefers_openvino_bf16_where_only_bf16_units_help() -> None:
    hw = {"isa": ["avx512", "avx512_bf16"], "cuda": False}
    assert hardware.recommend(hw, ["pytorch", "onnx", "openvino"])["backend"] == "openvino"
    assert "BF16" in hardware.recommend(hw, ["pytorch", "onnx", "openvino"])["why"]


def test_neural_engine_and_cuda_keep_their_backends() -> None:
    assert hardware.recommend({"isa": ["neon"], "neural_engine": True, "apple_chip": "M3"}, EVERY)["backend"] == (
        "coreml-batched"
    )
    assert hardware.recommend({"isa": ["avx512_vnni"], "cuda": True}, EVERY)["backend"] == "onnx"


def test_measurements_beat_the_rule() -> None:
    hw = {"isa": ["avx512_vnni"], "cuda": False}
    rec = hardware.recommend(hw, EVERY, {"onnx-int8": 60.0, "openvino-int8": 50.0})
    assert rec["backend"] == "onnx-int8" and "profile" in rec["why"]


def test_the_probe_says_what_amx_and_bf16_mean_for_the_backends(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "_cpu_linux", lambda: ("Xeon", {"avx512f", "avx512_vnni", "amx_int8", "amx_bf16"}))
    monkeypatch.setattr(hardware.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    info = hardware.probe()
    assert {"amx_int8", "amx_bf16", "avx512_vnni"} <= set(info["isa"])
    assert "openvino-int8" in info["isa_meaning"]["amx_int8"] and "BF16" in info["isa_meaning"]["amx_bf16"]
