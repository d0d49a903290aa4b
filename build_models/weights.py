"""Where the ResNet-50 weights come from: ImageNet (torchvision), a local file, or a seeded random init.

Pretrained weights may be impossible to fetch (an offline machine). ``auto`` then falls back
to a seeded random init, loudly; the kind travels as a label into the store, ``/backends``
and every response, so nobody mistakes a random model's answers for ImageNet's.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

RANDOM_SEED = 0
WEIGHTS_ENUM = "ResNet50_Weights.IMAGENET1K_V2"


@dataclass(frozen=True)
class Weights:
    kind: str  # "imagenet" | "random-init" | "file"
    description: str
    state_dict: dict[str, torch.Tensor]
    source_hash: str  # sha256 of the tensors, first 16 hex digits


def state_hash(state_dict: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def _imagenet() -> dict[str, torch.Tensor]:
    from torchvision.models import ResNet50_Weights

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)  # an offline machine should fail fast, not hang
    try:
        return ResNet50_Weights.IMAGENET1K_V2.get_state_dict(progress=False, check_hash=True)
    finally:
        socket.setdefaulttimeout(previous)


def _random() -> dict[str, torch.Tensor]:
    from torchvision.models import resnet50

    torch.manual_seed(RANDOM_SEED)
    return resnet50(weights=None).state_dict()


def _file(path: Path) -> dict[str, torch.Tensor]:
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, dict) and "state_dict" in loaded:
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} does not hold a state_dict")
    return {k.removeprefix("module."): v for k, v in loaded.items()}


def load_weights(choice: str) -> Weights:
    """``auto`` | ``imagenet`` | ``random`` | a path to a ``.pth`` state_dict."""
    if choice in ("auto", "imagenet"):
        try:
            state = _imagenet()
            return Weights("imagenet", f"torchvision {WEIGHTS_ENUM}", state, state_hash(state))
        except Exception as exc:  # any network/cache failure: fall back only in auto mode
            if choice == "imagenet":
                raise RuntimeError(f"ImageNet weights could not be loaded: {exc}") from exc
            logger.warning(
                "\n%s\n!! ImageNet weights unavailable (%s).\n!! Falling back to a RANDOM INIT "
                "(seed %d): predictions will be meaningless.\n!! Every model and response is "
                "labelled weights=random-init.\n%s",
                "!" * 78,
                type(exc).__name__,
                RANDOM_SEED,
                "!" * 78,
            )
    if choice in ("auto", "random"):
        state = _random()
        return Weights("random-init", f"seeded random init (seed {RANDOM_SEED})", state, state_hash(state))
    path = Path(choice)
    if not path.is_file():
        raise FileNotFoundError(f"--weights {choice!r}: not auto|imagenet|random and not a file")
    state = _file(path)
    return Weights("file", f"state_dict from {path.name}", state, state_hash(state))
