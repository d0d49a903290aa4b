"""A real fine-tuned ResNet-50 family made on this machine, for the end-to-end proof.

Images follow one obvious visual rule: the class is the colour of a noisy background, under grey shapes of varied
size and place, in JPEGs and PNGs of 180-400 px. A seeded random-init ResNet-50 sees them through the service's
own preprocessing; its BatchNorm statistics are set from the training photos (with a random init's, INT8 cannot
keep the growing activations and scores chance) and its last layer fitted, in seconds. The family's mean and std
are far from ImageNet's and each class's colour is what the previous one looks like through ImageNet's
(:func:`_chain`), so a build that drops them, a wrong label order or a blank calibration all score far below 90%.

``python -m tests.family_data DIR`` makes one and prints its accuracies and timings.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw

if TYPE_CHECKING:  # torch is imported where it runs: this module's constants are read without it
    from torch import nn

NAME = "tiles"
# Far from ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225), so that the test proves they travel.
MEAN = (0.896, 0.146, 0.765)
STD = (0.275, 0.19, 0.2475)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def read_as_imagenet(colour: tuple[float, float, float]) -> tuple[float, float, float]:
    """The colour a model normalised with ImageNet's mean/std instead of the family's takes ``colour``
    for: it sees exactly the tensor the right model sees for that colour (per channel, affine)."""
    return tuple(
        255 * (m + s * (c / 255 - mi) / si)
        for c, m, s, mi, si in zip(colour, MEAN, STD, IMAGENET_MEAN, IMAGENET_STD, strict=True)
    )


def _chain(first: tuple[float, float, float], names: tuple[str, ...]) -> dict[str, tuple[int, int, int]]:
    """Each class's colour is what the previous one reads as under the wrong mean/std: a build that
    drops the family's mean/std answers the next class for all but the last (≤ 1/N right: chance)."""
    colours, colour = {}, first
    for name in names:
        colours[name] = tuple(round(c) for c in colour)
        colour = read_as_imagenet(colour)
    return colours


# green → grey-green → magenta; ImageFolder sorts the folder names: fern, orchid, sage.
COLOURS: dict[str, tuple[int, int, int]] = _chain((20, 235, 31), ("fern", "sage", "orchid"))
RESIZE = 176
CROP = 160
SETS = {"train": (24, 101), "heldout": (20, 202), "calibration": (10, 303)}
"""Set → (images per class, seed)."""
BACKBONE_SEED = 0


@dataclass(frozen=True)
class Family:
    """Everything a build of the family takes, and what PyTorch measured on it."""

    name: str
    classes: tuple[str, ...]
    weights: Path
    labels: Path
    train: Path
    heldout: Path
    calibration: Path
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: int
    crop: int
    train_top1: float
    heldout_top1: float
    seconds: dict[str, float]

    def build_args(self) -> list[str]:
        """``python -m build_models`` flags that build this family (the build's own defaults otherwise)."""
        return [
            *("--weights", str(self.weights), "--labels", str(self.labels), "--name", self.name),
            *("--mean", ",".join(map(str, self.mean)), "--std", ",".join(map(str, self.std))),
            *("--resize", str(self.resize), "--crop", str(self.crop)),
            *("--calibration-dir", str(self.calibration), "--eval-dir", str(self.heldout)),
        ]


def tile(colour: tuple[int, int, int], rng: np.random.Generator) -> Image.Image:
    """One picture of class ``colour``: its background, jittered and noisy, under 1-4 grey shapes."""
    width, height = (int(v) for v in rng.integers(180, 401, size=2))
    base = np.clip(np.array(colour) + rng.integers(-15, 16, size=3), 0, 255)
    pixels = base + rng.normal(0, 18, size=(height, width, 3))
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 5))):
        w, h = int(rng.integers(width // 8, width // 3)), int(rng.integers(height // 8, height // 3))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        grey = int(rng.choice([rng.integers(0, 60), rng.integers(200, 256)]))  # never a class's colour
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x, y, x + w, y + h), fill=(grey, grey, grey))
    return img


def generate(root: Path) -> dict[str, Path]:
    """The train, heldout and calibration sets in ImageFolder layout under ``root`` (deterministic)."""
    sets = {}
    for set_name, (per_class, seed) in SETS.items():
        rng = np.random.default_rng(seed)
        for label, colour in COLOURS.items():
            folder = root / set_name / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = tile(colour, rng)
                if i % 3 == 2:  # a third as PNG, the rest JPEGs of varied quality
                    img.save(folder / f"{i:03d}.png")
                else:
                    img.save(folder / f"{i:03d}.jpg", quality=int(rng.integers(70, 96)))
        sets[set_name] = root / set_name
    return sets


def images(folder: Path) -> list[tuple[Path, int]]:
    """``folder``'s images with their class index, classes as ImageFolder orders them (sorted)."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    return [(f, i) for i, c in enumerate(classes) for f in sorted((folder / c).iterdir())]


def pixels(files: list[Path], resize: int = RESIZE, crop: int = CROP) -> np.ndarray:
    """uint8 [N, crop, crop, 3]: what the service feeds the model for each file."""
    from fastinfer.catalog.store import PreprocessSpec
    from fastinfer.serving.preprocess import prepare

    spec = PreprocessSpec(resize_size=resize, crop_size=crop)
    return np.stack([prepare(f.read_bytes(), spec, 10**9).pixels for f in files])


def backbone() -> nn.Module:
    """torchvision's ResNet-50, seeded random init, in eval mode."""
    import torch
    from torchvision.models import resnet50

    torch.manual_seed(BACKBONE_SEED)
    return resnet50(weights=None).eval()


def _uint8_model(net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> nn.Module:
    from fastinfer.engines.torch_model import Uint8Classifier

    return Uint8Classifier(net, mean, std)


def adapt_batchnorm(
    net: nn.Module, batch: np.ndarray, mean: Sequence[float] = MEAN, std: Sequence[float] = STD
) -> None:
    """Set every BatchNorm's running statistics to ``batch``'s, as training on it would: a random init's
    are 0 and 1, which leaves activations growing layer after layer, to ranges INT8 cannot keep."""
    import torch

    for module in net.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the chunks
    model = _uint8_model(net, mean, std).train()
    with torch.no_grad():
        for chunk in np.array_split(batch, len(batch) // 16 + 1):
            model(torch.from_numpy(chunk))
    net.eval()


def features(net: nn.Module, batch: np.ndarray, mean: Sequence[float] = MEAN, std: Sequence[float] = STD) -> np.ndarray:
    """The backbone's pooled 2048 features of uint8 NHWC ``batch``, normalised by ``mean``/``std``."""
    import torch
    from torch import nn

    fc, net.fc = net.fc, nn.Identity()
    try:
        model = _uint8_model(net, mean, std).eval()
        with torch.inference_mode():
            chunks = np.array_split(batch, len(batch) // 16 + 1)
            return np.concatenate([model(torch.from_numpy(c)).numpy() for c in chunks])
    finally:
        net.fc = fc


def fit_head(feats: np.ndarray, labels: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression on standardised features, folded back into a plain fc layer."""
    import torch

    mu, sigma = feats.mean(0), feats.std(0) + 1e-6
    x = torch.from_numpy((feats - mu) / sigma).float()
    y = torch.from_numpy(labels).long()
    torch.manual_seed(0)
    head = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(head(x), y) + 1e-3 * head.weight.pow(2).sum()
        value.backward()
        return value

    opt.step(loss)
    w = head.weight.detach().numpy() / sigma  # W((f - mu)/sigma) + b = (W/sigma) f + (b - (W/sigma) mu)
    return w.astype(np.float32), (head.bias.detach().numpy() - w @ mu).astype(np.float32)


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    """The share of rows whose best class is their label."""
    return float((logits.argmax(1) == labels).mean())


def make_family(root: Path) -> Family:
    """Generate the data, fit the head, save the weights and labels; measured in PyTorch."""
    import torch

    # One thread: measured 3-5x faster than two on this 2-core machine while other processes use a core
    # (OpenMP's threads wait on each other); this process's setting is restored after.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _make_family(root)
    finally:
        torch.set_num_threads(threads)


def _make_family(root: Path) -> Family:
    import torch

    seconds = {}
    t0 = time.perf_counter()
    sets = generate(root)
    seconds["generate"] = time.perf_counter() - t0
    classes = tuple(sorted(COLOURS))
    labels_file = root / "labels.txt"
    labels_file.write_text("\n".join(classes) + "\n")

    t0 = time.perf_counter()
    net = backbone()
    data = {}
    for set_name in ("train", "heldout"):
        files, ys = zip(*images(sets[set_name]), strict=True)
        data[set_name] = (pixels(list(files)), np.array(ys))
    adapt_batchnorm(net, data["train"][0])
    data = {k: (features(net, x), y) for k, (x, y) in data.items()}
    seconds["features"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    w, b = fit_head(*data["train"], len(classes))
    net.fc = torch.nn.Linear(2048, len(classes))
    net.fc.weight.data, net.fc.bias.data = torch.from_numpy(w), torch.from_numpy(b)
    weights = root / f"{NAME}-resnet50.pth"
    torch.save(net.state_dict(), weights)
    seconds["fit"] = time.perf_counter() - t0

    accuracy = {k: top1(f @ w.T + b, y) for k, (f, y) in data.items()}
    return Family(
        NAME, classes, weights, labels_file, sets["train"], sets["heldout"], sets["calibration"],
        MEAN, STD, RESIZE, CROP, accuracy["train"], accuracy["heldout"], seconds,
    )  # fmt: skip


@dataclass(frozen=True)
class Built:
    home: Path
    output: str  # the build's stdout and stderr
    table: dict  # the accuracy table it wrote (--accuracy-json)

    def rows(self, family: str) -> dict[str, dict]:
        """Served backend name → its measured row (``<family>-<backend>`` in the table)."""
        prefix = f"{family}-"
        return {
            r["backend"].removeprefix(prefix): r
            for r in self.table["rows"]
            if r["backend"].startswith(prefix) and r["status"] == "measured"
        }


def build_here(home: Path, args: list[str], status: int = 0) -> str:
    """The build command (``python -m build_models``'s main) in this process, into ``home``'s store, asserted to exit
    with ``status``: what it said (stdout and stderr). A process of its own would cost seconds of start-up."""
    import contextlib
    import io

    from build_models.__main__ import main
    from tests.conftest import model_store_at

    said = io.StringIO()
    with model_store_at(home), contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = main(args)
    assert code == status, said.getvalue()[-6000:]
    return said.getvalue()


def build_family(family: Family, work: Path) -> Built:
    """Every backend of ``family`` built with the build command into work/home, calibrated and measured on its
    photos. Off macOS, CoreML at batch 1 only: its other static batches are the same conversion (~5 s each),
    which `make models` runs for the default family before the suite; on macOS its runner serves all four."""
    from dataclasses import replace

    import pytest

    from build_models import ARTIFACTS
    from fastinfer.common import hardware

    home, table = work / "home", work / "accuracy.json"
    with pytest.MonkeyPatch.context() as patch:
        if not hardware.is_macos():
            patch.setitem(ARTIFACTS, "coreml", replace(ARTIFACTS["coreml"], batches=(1,)))
        output = build_here(home, [*family.build_args(), "--accuracy-json", str(table)])
    return Built(home, output, json.loads(table.read_text()))


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "family-data")
    family = make_family(root)
    print(json.dumps(asdict(family), default=str, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
