"""Where the ResNet-50 weights come from: ImageNet (torchvision), a local file, or a seeded random init.

Offline, ``auto`` falls back to a seeded random init, loudly; the kind travels as a label into the store and every
response, so nobody mistakes a random model's answers for ImageNet's.
"""

from __future__ import annotations

import hashlib
import logging
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

from build_models.labels import IMAGENET_CLASSES
from build_models.text import as_text
from fastinfer.common.files import file_sha256

logger = logging.getLogger(__name__)

RANDOM_SEED = 0
WEIGHTS_ENUM = "ResNet50_Weights.IMAGENET1K_V2"
FEATURES = 2048  # ResNet-50's pooled features: its final layer's weight is [classes, FEATURES]


@dataclass(frozen=True)
class Weights:
    kind: str  # "imagenet" | "random-init" | "file"
    description: str
    state_dict: dict[str, torch.Tensor]
    source_hash: str  # sha256 of the tensors, first 16 hex digits
    num_classes: int = IMAGENET_CLASSES  # rows of the final layer (fc): a fine-tuned file's own


def state_hash(state_dict: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


def imagenet_url() -> str:
    from torchvision.models import ResNet50_Weights

    return ResNet50_Weights.IMAGENET1K_V2.url


def hub_file(url: str) -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(url).path).name


class WeightsHashMismatch(ValueError):
    """A cached weights file whose contents do not match the hash in its name."""


def verify_hub_file(path: Path) -> None:
    """Check a cached file against the sha256 prefix in its name: torch.hub checks it only when it downloads."""
    match = torch.hub.HASH_REGEX.search(path.name)
    expected = match.group(1) if match else ""
    if len(expected) < 8:
        raise WeightsHashMismatch(f"{path}: its name carries no sha256 prefix to verify it by")
    actual = file_sha256(path)
    if not actual.startswith(expected):
        raise WeightsHashMismatch(
            f"{path} is not the file its name claims: expected sha256 prefix {expected}, "
            f"actual {actual[: len(expected)]} (delete it to download it again)"
        )


def _imagenet() -> dict[str, torch.Tensor]:
    url = imagenet_url()
    cached = hub_file(url)
    if cached.exists():
        verify_hub_file(cached)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)  # an offline machine should fail fast, not hang
    try:
        # Loads the verified cached file, or downloads it and checks the hash as it does.
        return torch.hub.load_state_dict_from_url(url, progress=False, check_hash=True)
    finally:
        socket.setdefaulttimeout(previous)


class NotResNet50Weights(ValueError):
    """A weights file that does not hold a ResNet-50 state_dict; the message says what is wrong."""


CHECKPOINT_KEYS = ("state_dict", "model")  # where a training checkpoint keeps the model's weights
UNSAFE_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _file(path: Path) -> tuple[dict[str, torch.Tensor], int]:
    """A ResNet-50 state_dict from a file (or a checkpoint holding one), ``module.`` prefixes stripped, and its
    class count."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # empty, truncated, not a torch file, or unsafe to unpickle
        if found := UNSAFE_GLOBAL.search(str(exc)):  # torch.save(model): pickled code, which is never run here
            raise NotResNet50Weights(
                f"{path} holds a pickled {found.group(1)}, not a state_dict: save model.state_dict() instead "
                "(weights are loaded with weights_only=True, never unpickled)"
            ) from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotResNet50Weights(f"{path} is not a readable torch file: {type(exc).__name__}: {first}") from exc
    if isinstance(loaded, dict):
        inner = next((loaded[k] for k in CHECKPOINT_KEYS if isinstance(loaded.get(k), dict)), None)
        loaded = loaded if inner is None else inner
    if not isinstance(loaded, dict):
        raise NotResNet50Weights(f"{path} does not hold a state_dict")
    state = {str(k).removeprefix("module."): v for k, v in loaded.items()}
    return state, check_resnet50(state, path)


def final_layer_classes(state: dict[str, object], source: Path) -> int:
    """The class count N >= 2 of the final layer's weight (fc.weight [N, 2048]); ImageNet's without one."""
    fc = state.get("fc.weight")
    if fc is None:
        return IMAGENET_CLASSES
    if not isinstance(fc, torch.Tensor) or fc.ndim != 2:
        got = list(fc.shape) if isinstance(fc, torch.Tensor) else type(fc).__name__
        raise NotResNet50Weights(
            f"{source}: its final layer's weight fc.weight is {got}; a ResNet-50's is 2-D, [classes, {FEATURES}]"
        )
    classes = int(fc.shape[0])
    if classes < 2:
        raise NotResNet50Weights(
            f"{source}: its final layer (fc) has {classes} class{'' if classes == 1 else 'es'}; a classifier "
            "needs at least 2"
        )
    return classes


def check_resnet50(state: dict[str, object], source: Path) -> int:
    """Every tensor torchvision's ResNet-50 has, with its shape, and nothing else, every value finite, else
    NotResNet50Weights in one line; returns the final layer's class count."""
    from torchvision.models import resnet50

    classes = final_layer_classes(state, source)
    with torch.device("meta"):  # shapes only: no memory, no random init
        reference = resnet50(weights=None, num_classes=classes)
    shapes = reference.state_dict()
    expected = {k: tuple(v.shape) for k, v in shapes.items()}
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    misshapen = sorted(
        k
        for k in expected.keys() & state.keys()
        if not isinstance(state[k], torch.Tensor) or tuple(state[k].shape) != expected[k]
    )
    problems = [
        f"{len(names)} {what} (e.g. {names[0]})"
        for what, names in (("missing", missing), ("unexpected", unexpected))
        if names
    ]
    if misshapen:
        name, got = misshapen[0], state[misshapen[0]]
        shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        problems.append(f"{len(misshapen)} of the wrong shape (e.g. {name} {shape}, expected {list(expected[name])})")
    if problems:
        raise NotResNet50Weights(f"{source} is not a ResNet-50 state_dict: tensors {'; '.join(problems)}")
    floating = {k for k, v in shapes.items() if v.is_floating_point()}
    for name in expected:  # one no model can compute with fails here in one line, not deep in torch
        if (why := not_plain(state[name], name in floating)) is not None:
            raise NotResNet50Weights(f"{source}: tensor {name} {why}; save plain dense CPU tensors (a state_dict)")
    for name in expected:  # a NaN (a diverged fine-tune) would fail only a later backend's verification
        tensor = state[name]
        if tensor.is_floating_point() and not (finite := torch.isfinite(tensor)).all():
            bad = int((~finite).sum())
            raise NotResNet50Weights(
                f"{source}: tensor {name} holds {bad} of {tensor.numel()} values that are NaN or infinite; "
                "no model can be built from it"
            )
    return classes


def not_plain(tensor: torch.Tensor, floating: bool) -> str | None:
    """Why ``tensor`` is no plain dense tensor of real numbers holding its values (None: it is one); a
    ``floating`` one (every weight but BatchNorm's counters) must hold floating-point numbers."""
    if tensor.layout != torch.strided:
        return f"is {tensor.layout}, not a dense tensor"
    if tensor.is_meta:
        return "holds no values (a meta-device tensor)"
    if tensor.is_quantized:
        return f"is quantized ({tensor.dtype})"
    if tensor.is_complex() or tensor.dtype == torch.bool or (floating and not tensor.is_floating_point()):
        return f"holds {tensor.dtype}, not floating-point numbers"
    return None


def _random_init(fallback_reason: str | None = None) -> Weights:
    from torchvision.models import resnet50

    torch.manual_seed(RANDOM_SEED)
    state = resnet50(weights=None).state_dict()
    description = f"seeded random init (seed {RANDOM_SEED})"
    if fallback_reason:  # says why in the store too, not only in this build's log
        description += f"; {as_text(fallback_reason)}"
    return Weights("random-init", description, state, state_hash(state))


def load_weights(choice: str) -> Weights:
    """``auto`` | ``imagenet`` | ``random`` | a path to a ``.pth`` state_dict of a ResNet-50 of any class count."""
    if choice in ("auto", "imagenet"):
        try:
            state = _imagenet()
        except Exception as exc:  # offline, or a cached file that fails its hash: fall back only in auto mode
            if choice == "imagenet":
                raise RuntimeError(f"ImageNet weights could not be loaded: {exc}") from exc
            reason = f"ImageNet weights not used: {type(exc).__name__}: {exc}"
            logger.warning(
                "\n%s\n!! %s\n!! Falling back to a RANDOM INIT (seed %d): predictions will be meaningless."
                "\n!! Every model and response is labelled weights=random-init.\n%s",
                "!" * 78,
                reason,
                RANDOM_SEED,
                "!" * 78,
            )
            return _random_init(reason)
        return Weights("imagenet", f"torchvision {WEIGHTS_ENUM}", state, state_hash(state))
    if choice == "random":
        return _random_init()
    path = Path(choice)
    if not path.is_file():
        raise FileNotFoundError(f"--weights {choice!r}: not auto|imagenet|random and not a file")
    state, classes = _file(path)
    # The name as text: a byte that is not UTF-8 (os.fsdecode makes it a surrogate) breaks every page showing it.
    description = f"state_dict from {as_text(path.name)} ({classes} classes)"
    return Weights("file", description, state, state_hash(state), classes)
