"""One function per artifact: write the model files into a directory, return extra metadata.

A new backend adds one function here and one row in ``ARTIFACTS`` (build_models/__init__.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import torch

from fastinfer.engines.onnx import MODEL_FILE as ONNX_FILE
from fastinfer.engines.pytorch import STATE_FILE
from fastinfer.torch_model import Uint8Classifier

ONNX_OPSET = 18


def export_pytorch(model: Uint8Classifier, out_dir: Path) -> dict[str, Any]:
    """The backbone's state_dict; the engine rebuilds the uint8 wrapper around it (eager)."""
    torch.save(model.backbone.state_dict(), out_dir / STATE_FILE)
    return {"format": "torch state_dict", "file": STATE_FILE, "precision": "fp32"}


def export_onnx(model: Uint8Classifier, out_dir: Path) -> dict[str, Any]:
    """ONNX FP32 with a dynamic batch dimension; cast and normalisation are in the graph."""
    example = torch.zeros((2, 224, 224, 3), dtype=torch.uint8)
    batch = torch.export.Dim("batch", min=1, max=1024)
    # The exporter narrates every step on stdout and warns about versions: keep our progress readable.
    noisy = [logging.getLogger(n) for n in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [log.level for log in noisy]
    for log in noisy:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (example,),
                str(out_dir / ONNX_FILE),
                input_names=["images"],
                output_names=["logits"],
                dynamic_shapes={"images": {0: batch}},
                opset_version=ONNX_OPSET,
                dynamo=True,
                external_data=False,
                optimize=True,
            )
    finally:
        for log, lvl in zip(noisy, levels, strict=True):
            log.setLevel(lvl)
    return {"format": "onnx", "file": ONNX_FILE, "precision": "fp32", "opset": ONNX_OPSET}
