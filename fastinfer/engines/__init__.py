"""One plain class per runtime (load an artifact, run a uint8 batch → logits) and the contract they share.
No BentoML, no HTTP: runners, the profiler, fidelity and build verification all use these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Engine(Protocol):
    """A loaded model: uint8 [N,S,S,3] → float32 [N,C] (S: ``input_size``, C: the class count). Each engine class
    also has ``open(dirs, threads, **options)``: ``{None: dir}`` or one dir per static batch size."""

    input_size: int  # S: read from the model itself where its runtime says it, so that nothing assumes 224

    def run(self, images: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]:
        """Where it runs: device or execution providers, threads."""
        ...

    def identity(self) -> str:
        """What decides its numbers beside the model (runtime, version, device, precision): the cache shares
        answers between engines of the same model and identity."""
        ...


class EngineUnavailable(RuntimeError):
    """This machine cannot run this engine: not a defect of the model (the build skips it, a runner says so)."""


# The default family's values (torchvision's IMAGENET1K_V2 transforms); a family's own travel with its models.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_INPUT_SIZE = 224
MIN_INPUT_SIZE, MAX_INPUT_SIZE = 32, 1024  # ResNet-50 downsamples by 32; beyond 1024, no workload here
MAX_ROWS = 256  # the most images one engine call takes: beyond, a caller's bug


def check_batch(images: object, size: int | None = None) -> np.ndarray:
    """The contract's input (uint8 [N,S,S,3], 1 <= N <= MAX_ROWS, S ``size`` or any), else ValueError: runners
    check at their door, rather than fail inside a batch with other callers' images."""
    if not isinstance(images, np.ndarray):
        raise ValueError(f"images must be a numpy array, not {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, not {images.dtype}")
    square = images.ndim == 4 and images.shape[3] == 3 and images.shape[1] == images.shape[2]
    side = images.shape[1] if square else 0
    if not (side == size if size is not None else MIN_INPUT_SIZE <= side <= MAX_INPUT_SIZE):
        s = "S" if size is None else size
        raise ValueError(f"images must be [N,{s},{s},3] NHWC RGB, not {list(images.shape)}")
    if not 1 <= len(images) <= MAX_ROWS:
        raise ValueError(f"a batch holds 1..{MAX_ROWS} images, not {len(images)}")
    return images


def warm_up(engine: Engine, batch_sizes: tuple[int, ...] = (1,)) -> None:
    """Run zeros through the engine so that lazy allocation and kernel choice happen before traffic."""
    for n in batch_sizes:
        engine.run(np.zeros((n, engine.input_size, engine.input_size, 3), dtype=np.uint8))


def square_side(shape: Sequence[int | str | None]) -> int:
    """S of a model input declared [N,S,S,3] (the batch may be symbolic), or ValueError."""
    dims = list(shape)
    if len(dims) != 4 or dims[3] != 3 or not isinstance(dims[1], int) or dims[1] != dims[2]:
        raise ValueError(f"the model's input is {dims}, not [N,S,S,3] with a fixed S")
    return dims[1]
