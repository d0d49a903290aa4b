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
