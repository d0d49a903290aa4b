"""``fastinfer``: the command line. ``fastinfer build`` builds the models (same as ``python -m build_models``)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="fastinfer", description="FastInfer command line")
    parser.add_argument("command", choices=["build"], help="build: build every model into the BentoML store")
    args, rest = parser.parse_known_args(argv)
    if args.command == "build":
        # The CLI is the composition root: the one place in fastinfer/ allowed to reach build_models.
        from build_models.__main__ import main as build_main

        return build_main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
