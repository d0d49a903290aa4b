"""``python -m build_models``: see build_models/__init__.py."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from build_models import (
    ARTIFACT_NAMES,
    BadPreprocessing,
    BuildRefused,
    MixedSources,
    NonFiniteLogits,
    UnknownArtifact,
    VerificationError,
    artifact_names,
    build,
    preprocess_spec,
    unusable,
)
from build_models.accuracy_gate import AccuracyRefused, BadAccuracyDrop, max_drop
from build_models.context import BadCalibrationDir
from build_models.labels import BadLabels
from build_models.weights import NotResNet50Weights
from fastinfer.catalog.store import DEFAULT_FAMILY, BadFamilyName, PreprocessSpec, check_family
from fastinfer.common.home import use_project_store
from fastinfer.measure.accuracy import EvalDirError


class WithoutEvalDir(ValueError):
    """A flag of --eval-dir's given without it: a measurement asked for that would not happen."""


# What the build refuses with a reason: said in one line, no traceback, exit status 1.
ONE_LINE = (NotResNet50Weights, BadLabels, BadFamilyName, BadPreprocessing, FileNotFoundError, VerificationError)
ONE_LINE += (MixedSources, WithoutEvalDir, EvalDirError, AccuracyRefused, BadAccuracyDrop)
ONE_LINE += (UnknownArtifact, BadCalibrationDir, NonFiniteLogits, BuildRefused)
DEFAULTS = PreprocessSpec()
EVAL_ONLY = {"--max-accuracy-drop": "max_accuracy_drop", "--accuracy-json": "accuracy_json", "--out": "out"}


def channels(flag: str, text: str) -> tuple[float, ...]:
    """``R,G,B`` as three numbers (range checked by preprocess_spec), or BadPreprocessing naming the flag."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise BadPreprocessing(f"{flag} {text!r}: three numbers R,G,B separated by commas, e.g. 0.5,0.5,0.5")
    return values


def pixels(flag: str, text: str) -> int:
    """A number of pixels written in ASCII digits (int() also takes "١٢٨", "1_0", " 128 "), or BadPreprocessing."""
    if not (text.isascii() and text.isdigit()):
        raise BadPreprocessing(f"{flag} {text!r}: a whole number of pixels, in the digits 0-9")
    return int(text)


def family_preprocess(args: argparse.Namespace) -> PreprocessSpec:
    """The family's preprocessing from the flags, each checked (one line naming the first bad one)."""
    return preprocess_spec(
        mean=None if args.mean is None else channels("--mean", args.mean),
        std=None if args.std is None else channels("--std", args.std),
        resize_size=None if args.resize is None else pixels("--resize", args.resize),
        crop_size=None if args.crop is None else pixels("--crop", args.crop),
    )


def main(argv: list[str] | None = None, prog: str = "python -m build_models") -> int:
    """The build command; ``prog``: how it was invoked (``fastinfer build`` hands over with its own name)."""
    parser = argparse.ArgumentParser(prog=prog, description="Build every model into the store.")
    parser.add_argument(
        "--weights",
        default="auto",
        help="auto | imagenet | random (ImageNet's 1000 classes) | PATH: your torchvision ResNet-50, a state_dict "
        "or a checkpoint holding one under 'state_dict' or 'model', any number of classes (default: auto)",
    )
    family = parser.add_argument_group("your own model family (its labels and preprocessing travel with it)")
    family.add_argument(
        "--labels",
        type=Path,
        metavar="PATH",
        help="the class names, in the order of the final layer's rows: a text file (one label a line), JSON "
        "(a list, or an object index -> name), or your ImageFolder training directory (its sorted class folder "
        "names). Needed unless the weights have ImageNet's 1000 classes",
    )
    family.add_argument(
        "--name",
        default=DEFAULT_FAMILY,
        metavar="NAME",
        help=f"the family: its models are stored as NAME-<backend>; a server serves it with FASTINFER_MODEL=NAME "
        f"(default: {DEFAULT_FAMILY})",
    )
    family.add_argument(
        "--mean",
        metavar="R,G,B",
        help=f"the normalisation mean of pixels scaled to 0..1 (default: {','.join(map(str, DEFAULTS.mean))})",
    )
    family.add_argument(
        "--std",
        metavar="R,G,B",
        help=f"the normalisation std (default: {','.join(map(str, DEFAULTS.std))}). A value beginning with '-' "
        "is written --std=R,G,B, as for --mean",
    )
    family.add_argument(
        "--resize",
        metavar="N",
        help=f"the shorter side is resized to N pixels before the centre crop (default: {DEFAULTS.resize_size})",
    )
    family.add_argument(
        "--crop", metavar="N", help=f"the centre crop's side, the model's input size (default: {DEFAULTS.crop_size})"
    )
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(ARTIFACT_NAMES)}")
    parser.add_argument("--force", action="store_true", help="rebuild even when the store is current")
    parser.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing when every model is stored and its files match their recorded sha256",
    )
    parser.add_argument(
        "--calibration-dir", type=Path, help="your own images to calibrate static INT8 on (rebuilds both INT8 models)"
    )
    parser.add_argument(
        "--int8-activations",
        choices=["u8", "s8"],
        help="static INT8 activation type (default u8); given, it rebuilds INT8 models of the other type",
    )
    parser.add_argument(
        "--eval-dir",
        type=Path,
        metavar="DIR",
        help="your labelled photos (DIR/<label>/<image>): measure top-1/top-5 of every model built or kept on them "
        "beside PyTorch's, record it with each model built, and refuse an INT8/BF16 model shown to lose too much",
    )
    parser.add_argument(
        "--max-accuracy-drop",
        metavar="PP",
        help="with --eval-dir: the most percentage points of top-1 below PyTorch's that an INT8 or BF16 model may "
        "lose: one whose drop's 95%% interval lies wholly above it is refused; never for one photo (default: 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="with --eval-dir: the folder the accuracy table is written to as accuracy.json (default: beside the "
        "family in the store's home, BENTOML_HOME/artifacts/NAME)",
    )
    parser.add_argument(
        "--accuracy-json",
        type=Path,
        metavar="PATH",
        help="with --eval-dir: the file the accuracy table is written to (default: accuracy.json in --out)",
    )
    args = parser.parse_args(argv)
    try:  # the family's arguments, checked before anything else happens
        check_family(args.name)
        preprocess = family_preprocess(args)
        if args.eval_dir is None:  # they say what to do with a measurement no one asked for
            given = [flag for flag, value in EVAL_ONLY.items() if getattr(args, value) is not None]
            if given:
                raise WithoutEvalDir(f"{' and '.join(given)}: only with --eval-dir DIR, the photos to measure on")
        drop = max_drop(args.max_accuracy_drop)
        only = artifact_names([n.strip() for n in args.only.split(",") if n.strip()] or None)
    except ONE_LINE as exc:
        print(f"build_models: {exc}", file=sys.stderr)
        return 1
    home = use_project_store()  # the store `make` uses, not ~/bentoml, wherever this runs from
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(f"build_models: model store {home / 'models'} (BENTOML_HOME={home})", flush=True)
    if args.if_missing:
        todo = unusable(args.name)  # reads every stored file (~0.35 s for the whole store)
        if not todo:
            print(
                f"build_models: every model of {args.name} is in the store, its files intact; nothing to do "
                "(--force rebuilds)"
            )
            return 0
        for name, why in todo.items():
            print(f"build_models: {name}: {why}", flush=True)
    try:
        build(
            args.weights,
            only=only,
            force=args.force,
            progress=lambda m: print(m, flush=True),
            calibration_dir=args.calibration_dir,
            int8_activations=args.int8_activations,
            family=args.name,
            labels_path=args.labels,
            preprocess=preprocess,
            eval_dir=args.eval_dir,
            max_accuracy_drop=drop,
            accuracy_json=args.accuracy_json or (None if args.out is None else args.out / "accuracy.json"),
            if_missing=args.if_missing,
        )
    except ONE_LINE as exc:  # said in one line, no traceback
        print(f"build_models: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
