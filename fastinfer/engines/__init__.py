"""One plain class per runtime: load an artifact from the store, run a uint8 batch → logits; and the
model contract they share (input shape, the batch check).

No BentoML, no HTTP: runners, the profiler, fidelity and build verification all use these. Imports
common/ only (the backend table above names each engine class by its import path).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Engine(Protocol):
    """A loaded model that honours the contract uint8 [N,224,224,3] → float32 [N,1000].

    Each engine class also has ``open(dirs, threads, **options)``: its stored model directories
    (``{None: dir}``, or one per static batch size) and the options of its row in fastinfer/catalog/backends.py.
    """

    def run(self, images: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]:
        """Where it runs: device or execution providers, threads."""
        ...

    def identity(self) -> str:
        """What decides its numbers beside the model: the runtime and its version, the device or execution
        providers, the precision it actually computes at. Two engines with the same model and identity
        answer the same (the response cache shares their answers; fastinfer/serving/cache.py)."""
        ...


class EngineUnavailable(RuntimeError):
    """This machine cannot run this engine (its runtime crashes here, or lacks what was asked for).

    Not a defect of the model: the build skips the artifact with the reason, a runner reports it.
    """


INPUT_SHAPE = (224, 224, 3)


MAX_ROWS = 256
"""The most images one engine call takes: a batch beyond it is a caller's bug, not a workload."""


def check_batch(images: object) -> np.ndarray:
    """The contract's input (uint8 [N,224,224,3], 1 <= N <= MAX_ROWS), or ValueError saying what is wrong.

    Runners check at their door, so that a malformed array is refused with a clear message
    instead of failing inside a batch with other callers' images.
    """
    if not isinstance(images, np.ndarray):
        raise ValueError(f"images must be a numpy array, not {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, not {images.dtype}")
    if images.ndim != 4 or images.shape[1:] != INPUT_SHAPE:
        raise ValueError(f"images must be [N,224,224,3] NHWC RGB, not {list(images.shape)}")
    if not 1 <= len(images) <= MAX_ROWS:
        raise ValueError(f"a batch holds 1..{MAX_ROWS} images, not {len(images)}")
    return images


def warm_up(engine: Engine, batch_sizes: tuple[int, ...] = (1,)) -> None:
    """Run zeros through the engine so that lazy allocation and kernel choice happen before traffic."""
    for n in batch_sizes:
        engine.run(np.zeros((n, 224, 224, 3), dtype=np.uint8))
