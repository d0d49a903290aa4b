"""The command that builds a model family again as its stored models were built, for every message about a model
missing, corrupt or not served; where it needs a file the store does not keep, the whole family.
"""

from __future__ import annotations

from fastinfer.catalog.store import DEFAULT_FAMILY, PreprocessSpec

WEIGHTS_ARGUMENT = {"imagenet": "imagenet", "random-init": "random"}  # stored label → --weights
WHOLE_FAMILY = "the whole family, without --only"


def _channels(values: tuple[float, float, float]) -> str:
    return ",".join(repr(float(v)) for v in values)  # repr: the shortest text that reads back as the same float


def preprocess_args(spec: PreprocessSpec | None) -> str:
    """``--mean``/``--std``/``--resize``/``--crop`` for each value of ``spec`` that is not the default ("" for none)."""
    if spec is None:
        return ""
    default = PreprocessSpec()
    flags = [
        f"--mean {_channels(spec.mean)}" if tuple(spec.mean) != tuple(default.mean) else "",
        f"--std {_channels(spec.std)}" if tuple(spec.std) != tuple(default.std) else "",
        f"--resize {spec.resize_size}" if spec.resize_size != default.resize_size else "",
        f"--crop {spec.crop_size}" if spec.crop_size != default.crop_size else "",
    ]
    return " ".join(flag for flag in flags if flag)


def source_args(family: str, weights: str | None, spec: PreprocessSpec | None) -> str:
    """The build arguments naming a family's source: weights (their stored label), labels, name, preprocessing."""
    default_family = family in ("", DEFAULT_FAMILY)
    if weights:
        weights_arg = f"--weights {WEIGHTS_ARGUMENT.get(weights, 'PATH')}"
    else:
        weights_arg = "" if default_family else "--weights PATH"
    labels = "" if default_family or weights in WEIGHTS_ARGUMENT else "--labels PATH"
    name = "" if default_family else f"--name {family}"
    return " ".join(part for part in (weights_arg, labels, name, preprocess_args(spec)) if part)


def needs_files(args: str) -> bool:
    """Whether build arguments name a file the store does not keep: then only the whole family is safe."""
    return "PATH" in args


def family_weights(family: str, weights: str | None) -> str | None:
    """The ``weights`` a rebuild of the whole family names: none for the default family's own, else ``weights``."""
    return None if family in ("", DEFAULT_FAMILY) and weights in (*WEIGHTS_ARGUMENT, None) else weights


def build_command(
    family: str, weights: str | None = None, spec: PreprocessSpec | None = None, whole: bool = False
) -> str:
    """The command that builds ``family`` as its stored models were built, quoted for a message."""
    args = source_args(family, family_weights(family, weights), spec)
    if not args:
        said = WHOLE_FAMILY if whole else "ImageNet's weights; `--weights PATH --labels PATH` for your own"
        return f"`fastinfer build` ({said})"
    command = f"`fastinfer build {args}`"
    return f"{command} ({WHOLE_FAMILY})" if whole or needs_files(args) else command
