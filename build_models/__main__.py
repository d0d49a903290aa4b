"""``python -m build_models``: see build_models/__init__.py."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from build_models import ARTIFACT_NAMES, VerificationError, build, unusable
from build_models.weights import NotResNet50Weights
from fastinfer.common.home import use_project_store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_models", description="Build every model into the store.")
    parser.add_argument("--weights", default="auto", help="auto | imagenet | random | PATH.pth (default: auto)")
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
    args = parser.parse_args(argv)
    home = use_project_store()  # the store `make` uses, not ~/bentoml, wherever this runs from
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(f"build_models: model store {home / 'models'} (BENTOML_HOME={home})", flush=True)
    if args.if_missing:
        todo = unusable()  # reads every stored file (~0.35 s for the whole store)
        if not todo:
            print("build_models: every model is in the store, its files intact; nothing to do (--force rebuilds)")
            return 0
        for name, why in todo.items():
            print(f"build_models: {name}: {why}", flush=True)
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    try:
        build(
            args.weights,
            only=only,
            force=args.force,
            progress=lambda m: print(m, flush=True),
            calibration_dir=args.calibration_dir,
            int8_activations=args.int8_activations,
        )
    except (NotResNet50Weights, FileNotFoundError, VerificationError) as exc:  # said in one line, no traceback
        print(f"build_models: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
