"""``fastinfer tune`` (``make tune``, ``python -m load_tests.tuning``): find the configuration that serves
best on this machine, within a time budget, and make it the server's default.

The search is load_tests/tuning/search.py. The tuned file ($BENTOML_HOME/tuned/tuned.json, which
fastinfer/catalog/tuned.py reads) is written only at the end, by an atomic rename, so an interrupted
tune leaves the previous one as it was; beside it: report.md, report.json and tuned.png
(load_tests/tuning/files.py).
"""

from __future__ import annotations

import sys

from fastinfer.common.home import use_project_store
from load_tests.tuning import files
from load_tests.tuning.search import Goal, shown, tune


def main(argv: list[str] | None = None) -> int:
    import argparse
    import shlex

    from fastinfer.cli import TUNE_DESCRIPTION, tune_arguments

    parser = argparse.ArgumentParser(prog="fastinfer tune", description=TUNE_DESCRIPTION)
    tune_arguments(parser)  # the same arguments `fastinfer tune` checks before it hands over
    args = parser.parse_args(argv)
    if args.clients < 1 or args.budget <= 0 or args.seconds <= 0:
        parser.error("--clients, --budget and --seconds must be positive")
    use_project_store()
    from fastinfer.catalog import tuned as tuning
    from fastinfer.catalog.backends import BACKENDS, unavailable_reason

    runnable = [b for b in BACKENDS if unavailable_reason(b) is None and b != "coreml"]  # coreml-batched covers it
    wanted = [b.strip() for b in args.backends.split(",")] if args.backends else runnable
    if unknown := [b for b in wanted if b not in runnable]:
        print(f"fastinfer tune: cannot tune {', '.join(unknown)}: not a backend that can run here "
              f"({', '.join(runnable) or 'none can'})", file=sys.stderr)  # fmt: skip
        return 1
    where = (tuning.path() or tuning.default_path()).parent
    out = where / "runs"
    command = "fastinfer tune " + shlex.join(sys.argv[1:] if argv is None else argv)
    goal = Goal(args.goal, args.clients, args.p95_ms)
    try:
        search = tune(goal, args.budget, args.seconds, out, wanted)
    except KeyboardInterrupt:  # every server was stopped on the way out (serve's finally)
        print("fastinfer tune: interrupted; the previous tuned file is as it was", file=sys.stderr)
        return 130
    written = files.write(search, command, where)
    best = search.chosen
    if written is None or best is None:
        print(f"fastinfer tune: no configuration served; see {where / 'report.md'}", file=sys.stderr)
        return 1
    print(f"chosen: {best.config.label()} {shown(best)}")
    print(f"wrote {written} (the server's default from now on), {where / 'report.md'}, {where / 'tuned.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
