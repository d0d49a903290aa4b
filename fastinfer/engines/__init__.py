"""One plain class per backend: load an artifact from the store, run a uint8 batch → logits.

No BentoML, no HTTP: runners, the profiler, fidelity and build verification all use these.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Engine(Protocol):
    """A loaded model that honours the contract uint8 [N,224,224,3] → float32 [N,1000]."""

    def run(self, images: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]:
        """Where it runs: device or execution providers, threads."""
        ...


def warm_up(engine: Engine, batch_sizes: tuple[int, ...] = (1,)) -> None:
    """Run zeros through the engine so that lazy allocation and kernel choice happen before traffic."""
    for n in batch_sizes:
        engine.run(np.zeros((n, 224, 224, 3), dtype=np.uint8))
