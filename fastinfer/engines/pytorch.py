"""Eager PyTorch ResNet-50 (state_dict in the store, architecture from torchvision)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fastinfer.common import hardware

STATE_FILE = "state_dict.pt"


class TorchEngine:
    def __init__(self, model_dir: str | Path, device: str | None = None, threads: int = 0) -> None:
        import torch

        from fastinfer.engines.torch_model import resnet50

        self.device = device or hardware.torch_device()
        # torch's own default is the machine's cores, blind to a container's CPU quota.
        torch.set_num_threads(threads if threads > 0 else hardware.cpu_count())
        state = torch.load(Path(model_dir) / STATE_FILE, map_location="cpu", weights_only=True)
        self.model = resnet50(state).to(self.device)
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
