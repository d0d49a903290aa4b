"""Logits → softmax probabilities → the top-k labelled predictions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fastinfer.common.schemas import Prediction


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - np.max(logits)
    exp = np.exp(shifted)
    return exp / exp.sum()


def top_k(logits: np.ndarray, k: int, categories: Sequence[str]) -> list[Prediction]:
    """The ``k`` most probable classes of one image's logits, best first."""
    probs = softmax(np.asarray(logits).reshape(-1))
    k = min(k, probs.size)
    best = np.argpartition(-probs, k - 1)[:k]
    best = best[np.argsort(-probs[best], kind="stable")]
    return [
        Prediction(label=categories[i] if i < len(categories) else str(i), index=int(i), score=float(probs[i]))
        for i in best
    ]
