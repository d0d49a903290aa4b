"""The uint8 model contract in PyTorch: ``uint8 [N,S,S,3] RGB → float32 logits [N,C]``.

Cast, normalisation and NHWC→NCHW live inside the module, so every export carries them and the front never
normalises. Imports torch: keep it out of the HTTP front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from fastinfer.engines import IMAGENET_MEAN, IMAGENET_STD


class Uint8Classifier(nn.Module):
    """Wraps an NCHW float classifier so that it takes uint8 NHWC pixels."""

    def __init__(
        self, backbone: nn.Module, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
    ) -> None:
        super().__init__()
        self.backbone = backbone
        # x/255 then (x-mean)/std folded into one multiply-add: x*scale + shift.
        scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(1, 3, 1, 1)
        shift = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)]).view(1, 3, 1, 1)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("shift", shift, persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).to(torch.float32)
        return self.backbone(x * self.scale + self.shift)


def resnet50(
    state_dict: Mapping[str, torch.Tensor], mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> Uint8Classifier:
    """torchvision's ResNet-50 holding ``state_dict``'s tensors (any class count) behind the uint8 contract, in eval.
    Laid out on the meta device and given the tensors: no random init of 25M parameters to overwrite (~0.6 CPU-s)."""
    from torchvision.models import resnet50 as tv_resnet50

    with torch.device("meta"):  # shapes only
        backbone = tv_resnet50(weights=None, num_classes=int(state_dict["fc.weight"].shape[0]))
    # Each tensor copied once, as load_state_dict's copy made it: in the model's dtype (FP16 weights run in FP32), in
    # a compact storage of its own (a slice of a larger tensor would otherwise be saved whole with the model), and
    # outside autograd (a tensor saved requiring grad would make BatchNorm's running stats fail every export).
    layout = backbone.state_dict()
    contiguous = torch.contiguous_format
    tensors = {
        k: v.detach().to(layout[k].dtype, memory_format=contiguous, copy=True) if k in layout else v
        for k, v in state_dict.items()
    }
    backbone.load_state_dict(tensors, assign=True)  # strict: every tensor, none left on the meta device
    return Uint8Classifier(backbone, mean, std).eval()
