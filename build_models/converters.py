"""The ONNX files other exports start from: FP32 from the torch module, static INT8 from FP32."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ONNX_OPSET = 18


@contextlib.contextmanager
def quiet(*loggers: str) -> Iterator[None]:
    """Silence converters that narrate every step, so that our progress stays readable."""
    logs = [logging.getLogger(n) for n in loggers]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def write_onnx_fp32(model: Any, path: Path, crop_size: int) -> None:
    """ONNX FP32 with a dynamic batch dimension and the family's ``crop_size`` square images.

    By tracing (``dynamo=False``): ResNet-50's graph has no control flow, and the build's ``onnx`` step takes 2.1 s
    where the torch.export path took 7.3 s, for the same runtime speed (docs/backends.md, "The build")."""
    import torch

    example = torch.zeros((2, crop_size, crop_size, 3), dtype=torch.uint8)
    with quiet("torch.onnx"):
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def write_onnx_int8_static(
    fp32: Path, images: Sequence[np.ndarray], activation_type: str, path: Path
) -> dict[str, Any]:
    """Static QDQ INT8, per-channel weights, calibrated (MinMax) on ``images``; returns its metadata. Activations
    are u8 by default: S8S8 left 20 of 53 convolutions unfused here and ran no faster than FP32."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Photos(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            img = next(self.remaining, None)
            return None if img is None else {"images": img[np.newaxis]}

    activations = QuantType.QUInt8 if activation_type == "u8" else QuantType.QInt8
    with tempfile.TemporaryDirectory() as tmp, quiet("onnxruntime", "root"):
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(path),
            Photos(),
            quant_format=QuantFormat.QDQ,
            activation_type=activations,
            weight_type=QuantType.QInt8,
            per_channel=True,
            calibrate_method=CalibrationMethod.MinMax,
        )
    return {
        "quantization": f"{int8_scheme(activation_type)}, per-channel weights, MinMax calibration",
        "calibration_images": len(images),
    }


def int8_scheme(activation_type: str) -> str:
    return f"static QDQ {activation_type.upper()}S8"
