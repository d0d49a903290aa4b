"""One function per artifact: write the model files into a directory, return extra metadata. A new backend adds
one function here and one row in ``ARTIFACTS`` (build_models/__init__.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from build_models.converters import ONNX_OPSET, quiet
from fastinfer.common.files import file_sha256
from fastinfer.engines.coreml import PACKAGE_DIR as COREML_PACKAGE
from fastinfer.engines.onnx import MODEL_FILE as ONNX_FILE
from fastinfer.engines.openvino import MODEL_FILE as OPENVINO_FILE
from fastinfer.engines.openvino import import_openvino
from fastinfer.engines.pytorch import STATE_FILE, write_normalisation

if TYPE_CHECKING:
    from build_models.context import BuildContext


def export_pytorch(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The backbone's state_dict, and the normalisation the engine wraps around it (eager)."""
    import torch

    torch.save(ctx.model.backbone.state_dict(), out_dir / STATE_FILE)
    write_normalisation(out_dir, ctx.spec.mean, ctx.spec.std, ctx.spec.crop_size)
    return {"format": "torch state_dict", "file": STATE_FILE}


def export_onnx(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    shutil.copyfile(ctx.onnx_fp32, out_dir / ONNX_FILE)
    return {"format": "onnx", "file": ONNX_FILE, "opset": ONNX_OPSET}


def export_onnx_int8_static(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    path, calibration = ctx.onnx_int8(fresh=True)
    shutil.copyfile(path, out_dir / ONNX_FILE)
    return {"format": "onnx", "file": ONNX_FILE, **calibration}


def export_onnx_int8_dynamic(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The original FastInfer API's dynamic INT8 (ConvInteger): weights quantized, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet("onnxruntime", "root"):
        quantize_dynamic(str(ctx.onnx_fp32), str(out_dir / ONNX_FILE), weight_type=QuantType.QUInt8)
    return {"format": "onnx", "file": ONNX_FILE, "quantization": "dynamic (ConvInteger/MatMulInteger), uint8 weights"}


def export_coreml(ctx: BuildContext, out_dir: Path, batch: int) -> dict[str, Any]:
    """CoreML FP16 mlprogram at one static batch size; its input is int32 holding 0..255 (CoreML has no uint8)."""
    import coremltools as ct
    import torch
    from coremltools.converters.mil.mil import types

    size = ctx.spec.crop_size
    example = torch.zeros((batch, size, size, 3), dtype=torch.uint8)
    with quiet("coremltools"), torch.no_grad():
        # check_trace=False: the check reruns the model to compare (3 s of a build's 16 s of CoreML); the
        # converted model is checked against PyTorch on macOS, where it can run (fidelity).
        traced = torch.jit.trace(ctx.model, example, check_trace=False)
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
    """Convert an ONNX model to OpenVINO IR, weights kept as they are (the runtime decides the precision, not the
    file); returns OpenVINO's version."""
    ov = import_openvino()  # without its usage telemetry
    with quiet("openvino"):
        model = ov.convert_model(str(onnx_file))
        ov.save_model(model, str(out_dir / OPENVINO_FILE), compress_to_fp16=False)
    return ov.get_version()


def export_openvino(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The FP32 ONNX export as OpenVINO IR: same graph, same uint8 NHWC contract."""
    version = write_openvino(ctx.onnx_fp32, out_dir)
    return {"format": "openvino ir", "file": OPENVINO_FILE, "converted_from": "onnx fp32", "openvino": version}


def export_openvino_int8(ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
    """The static QDQ INT8 ONNX model of this build as OpenVINO IR: one calibration for both runtimes."""
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
