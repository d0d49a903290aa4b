"""Eager PyTorch ResNet-50 (state_dict in the store, architecture from torchvision).

Beside the state_dict, ``normalisation.json`` holds what the other runtimes carry in their graph: the family's
mean, std and crop size (ImageNet's where missing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.common import hardware
from fastinfer.engines import DEFAULT_INPUT_SIZE, IMAGENET_MEAN, IMAGENET_STD

STATE_FILE = "state_dict.pt"
NORMALISATION_FILE = "normalisation.json"


def write_normalisation(model_dir: Path, mean: Sequence[float], std: Sequence[float], crop_size: int) -> None:
    """What the build writes beside the state_dict (fastinfer/engines/pytorch.py reads it)."""
    record = {"mean": list(mean), "std": list(std), "crop_size": crop_size}
    (Path(model_dir) / NORMALISATION_FILE).write_text(json.dumps(record))


class TorchEngine:
    def __init__(self, model_dir: str | Path, device: str | None = None, threads: int = 0) -> None:
        import torch

        from fastinfer.engines.torch_model import resnet50

        self.device = device or hardware.torch_device()
        # torch's own default is the machine's cores, blind to a container's CPU quota.
        torch.set_num_threads(threads if threads > 0 else hardware.cpu_count())
        state = torch.load(Path(model_dir) / STATE_FILE, map_location="cpu", weights_only=True)
        recorded = Path(model_dir) / NORMALISATION_FILE
        norm = json.loads(recorded.read_text()) if recorded.is_file() else {}
        self.input_size = int(norm.get("crop_size", DEFAULT_INPUT_SIZE))
        mean, std = norm.get("mean", IMAGENET_MEAN), norm.get("std", IMAGENET_STD)
        self.model = resnet50(state, mean, std).to(self.device)
        self._torch = torch

    @classmethod
    def open(cls, dirs: Mapping[int | None, str], threads: int = 0, **options: Any) -> TorchEngine:
        return cls(dirs[None], threads=threads, **options)

    def run(self, images: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            batch = torch.from_numpy(np.ascontiguousarray(images)).to(self.device)
            return self.model(batch).float().cpu().numpy()

    def identity(self) -> str:
        torch, device = self._torch, self.device
        if device.startswith("cuda"):  # the card, and TF32: cuDNN's convolutions use it by default on Ampere and later
            ampere = torch.cuda.get_device_capability(device)[0] >= 8
            precision = "tf32" if torch.backends.cudnn.allow_tf32 and ampere else "fp32"
            return f"PyTorch {torch.__version__} on {device} ({torch.cuda.get_device_name(device)}) at {precision}"
        return f"PyTorch {torch.__version__} on {device} at fp32"

    def describe(self) -> dict[str, Any]:
        return {"device": self.device, "threads": self._torch.get_num_threads(), "precision": "fp32"}
