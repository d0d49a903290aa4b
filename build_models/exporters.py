"""One function per artifact: write the model files into a directory, return extra metadata.

Each takes the :class:`build_models.context.BuildContext` (weights, the PyTorch model, the FP32
ONNX file, calibration photos) and the directory to fill. A new backend adds one function here
and one row in ``ARTIFACTS`` (build_models/__init__.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastinfer.engines.coreml import PACKAGE_DIR as COREML_PACKAGE
from fastinfer.engines.onnx import MODEL_FILE as ONNX_FILE
from fastinfer.engines.openvino import MODEL_FILE as OPENVINO_FILE
from fastinfer.engines.pytorch import STATE_FILE

if TYPE_CHECKING:
    from build_models.context import BuildContext

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


def export_pytorch(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The backbone's state_dict; the engine rebuilds the uint8 wrapper around it (eager)."""
    import torch

    torch.save(ctx.model.backbone.state_dict(), out_dir / STATE_FILE)
    return {"format": "torch state_dict", "file": STATE_FILE}


def write_onnx_fp32(ctx: BuildContext, path: Path) -> None:
    """ONNX FP32 with a dynamic batch dimension; cast and normalisation are in the graph."""
    import torch

    example = torch.zeros((2, 224, 224, 3), dtype=torch.uint8)
    batch = torch.export.Dim("batch", min=1, max=1024)
    with quiet("torch.onnx", "onnxscript", "onnx_ir"):
        torch.onnx.export(
            ctx.model,
            (example,),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes={"images": {0: batch}},
            opset_version=ONNX_OPSET,
            dynamo=True,
            external_data=False,
            optimize=True,
        )


def export_onnx(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    shutil.copyfile(ctx.onnx_fp32(), out_dir / ONNX_FILE)
    return {"format": "onnx", "file": ONNX_FILE, "opset": ONNX_OPSET}


def write_onnx_int8_static(ctx: BuildContext, path: Path) -> dict[str, Any]:
    """Static QDQ INT8, per-channel weights, calibrated (MinMax) on real photos; returns its metadata.

    Activations are uint8 by default (U8S8): measured on ORT 1.32 / AVX-512 VNNI, S8S8 QDQ left 20 of
    53 convolutions unfused in FP32 and ran no faster than FP32 (33.6 vs 31.6 ms), while U8S8 fused all
    53 into QLinearConv (14.8 ms). ``--int8-activations s8`` builds S8S8 for machines where it fuses.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    images = ctx.calibration_images()

    class Photos(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(images)

        def get_next(self) -> dict[str, np.ndarray] | None:
            img = next(self.remaining, None)
            return None if img is None else {"images": img[np.newaxis]}

    activations = QuantType.QUInt8 if ctx.activation_type == "u8" else QuantType.QInt8
    with tempfile.TemporaryDirectory() as tmp, quiet("onnxruntime", "root"):
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(ctx.onnx_fp32()), str(prepared), skip_symbolic_shape=True)
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
        "quantization": f"{int8_scheme(ctx)}, per-channel weights, MinMax calibration",
        "calibration_images": len(images),
        "calibration_source": ctx.calibration_source,
    }


def int8_scheme(ctx: BuildContext) -> str:
    return f"static QDQ {ctx.activation_type.upper()}S8"


def export_onnx_int8_static(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    path, calibration = ctx.onnx_int8(fresh=True)
    shutil.copyfile(path, out_dir / ONNX_FILE)
    return {"format": "onnx", "file": ONNX_FILE, **calibration}


def export_onnx_int8_dynamic(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The original FastInfer API's dynamic INT8 (ConvInteger): weights quantized, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet("onnxruntime", "root"):
        quantize_dynamic(str(ctx.onnx_fp32()), str(out_dir / ONNX_FILE), weight_type=QuantType.QUInt8)
    return {"format": "onnx", "file": ONNX_FILE, "quantization": "dynamic (ConvInteger/MatMulInteger), uint8 weights"}


def export_coreml(ctx: BuildContext, out_dir: Path, batch: int) -> dict[str, Any]:
    """CoreML FP16 mlprogram at one static batch size (ComputeUnit.ALL: ANE, GPU or CPU).

    CoreML multi-arrays have no uint8 type, so the declared input is int32 holding 0..255; the
    engine casts the uint8 batch. Cast, normalisation and NHWC→NCHW stay inside the program.
    """
    import coremltools as ct
    import torch
    from coremltools.converters.mil.mil import types

    example = torch.zeros((batch, 224, 224, 3), dtype=torch.uint8)
    with quiet("coremltools"), torch.no_grad():
        traced = torch.jit.trace(ctx.model, example)
        mlmodel = ct.convert(
            traced,
            inputs=[ct.TensorType(name="images", shape=example.shape, dtype=types.uint8)],
            outputs=[ct.TensorType(name="logits")],
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT16,
            minimum_deployment_target=ct.target.macOS14,
            compute_units=ct.ComputeUnit.ALL,
        )
        mlmodel.save(str(out_dir / COREML_PACKAGE))
    return {
        "format": "coreml mlprogram",
        "file": COREML_PACKAGE,
        "static_batch": batch,
        "input_dtype": "int32 (0..255)",
    }


def write_openvino(onnx_file: Path, out_dir: Path) -> str:
    """Convert an ONNX model to OpenVINO IR (model.xml + model.bin), weights kept as they are; returns
    OpenVINO's version. ``ov.save_model`` would halve FP32 weights to FP16 by default: not here, so that
    the runtime (not the file) decides the precision (FASTINFER_OPENVINO_PRECISION)."""
    from fastinfer.engines.openvino import import_openvino

    ov = import_openvino()  # without its usage telemetry
    with quiet("openvino"):
        model = ov.convert_model(str(onnx_file))
        ov.save_model(model, str(out_dir / OPENVINO_FILE), compress_to_fp16=False)
    return ov.get_version()


def export_openvino(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The FP32 ONNX export as OpenVINO IR: same graph, same uint8 NHWC contract."""
    version = write_openvino(ctx.onnx_fp32(), out_dir)
    return {"format": "openvino ir", "file": OPENVINO_FILE, "converted_from": "onnx fp32", "openvino": version}


def export_openvino_int8(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The static QDQ INT8 ONNX model of this build as OpenVINO IR: one calibration for both runtimes."""
    from fastinfer.store import file_sha256

    path, calibration = ctx.onnx_int8()
    version = write_openvino(path, out_dir)
    return {
        "format": "openvino ir",
        "file": OPENVINO_FILE,
        "converted_from": "onnx int8 (the onnx-int8 model's QDQ graph)",
        "int8_onnx_sha256": file_sha256(path),
        "openvino": version,
        **calibration,
    }
