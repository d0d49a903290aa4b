"""CoreML runner (macOS only): FP16 mlprograms at static batch 1/2/4/8, ComputeUnit.ALL.

It serves two backends: ``coreml`` (``infer``: as sent, batch 1) and ``coreml-batched``
(``infer_batched``: concurrent requests batched, padded to the next static size, sliced back).
"""

from runners.base import make_runner

CoremlRunner = make_runner("coreml-batched", batching_backend="coreml-batched")
