"""ONNX Runtime runners.

* ``onnx``: FP32 — CoreML EP on macOS, CUDA EP when a GPU is present, else CPU EP.
* ``onnx-int8`` (static QDQ) and ``onnx-int8-dynamic`` (the seed's ConvInteger): CPU EP, where the
  integer kernels (VNNI/AMX on x86) are.
"""

from runners.base import make_runner

OnnxRunner = make_runner("onnx")
OnnxInt8Runner = make_runner("onnx-int8")
OnnxInt8DynamicRunner = make_runner("onnx-int8-dynamic")
