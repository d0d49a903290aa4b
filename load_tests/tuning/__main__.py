"""``fastinfer tune`` (``make tune``, ``python -m load_tests.tuning``): find the configuration that serves
best on this machine, within a time budget, and make it the server's default.

The search is load_tests/tuning/search.py. The tuned file ($BENTOML_HOME/tuned/tuned.json, which
fastinfer/catalog/tuned.py reads) is written only at the end, by an atomic rename, so an interrupted
tune leaves the previous one as it was; beside it: report.md, report.json and tuned.png
(load_tests/tuning/files.py).
"""

from __future__ import annotations

import signal
import sys

from fastinfer.common.home import bentoml_home, use_project_store
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

    wanted = backends_to_tune(args.backends)
    if isinstance(wanted, str):
        print(f"fastinfer tune: {wanted}", file=sys.stderr)
        return 1
    target = tuning.path() or tuning.default_path()  # where the server reads it (FASTINFER_TUNED)
    if target.exists() and not target.is_file():
        print(f"fastinfer tune: {target} is not a file; FASTINFER_TUNED names the file to write", file=sys.stderr)
        return 1
    where = target.parent
    command = shlex.join(["fastinfer", "tune", *(sys.argv[1:] if argv is None else argv)])
    goal = Goal(args.goal, args.clients, args.p95_ms)
    if args.goal == "latency" and (args.p95_ms is not None or args.clients != 10):
        print("fastinfer tune: --goal latency measures one client; --clients and --p95-ms are not used",
              file=sys.stderr)  # fmt: skip
    interrupt_on_signals()
    try:
        search = tune(goal, args.budget, args.seconds, where / "runs", wanted)
        written = files.write(search, command, target)
    except KeyboardInterrupt:  # every server was stopped on the way out (serve's finally)
        print("fastinfer tune: interrupted; the previous tuned file is as it was", file=sys.stderr)
        return 130
    best = search.chosen
    if written is None or best is None:
        print(f"fastinfer tune: no configuration served; see {files.report_path(target, failed=True)}", file=sys.stderr)
        return 1
    print(f"chosen: {best.config.label()} {shown(best)}")
    read = "the server's default from now on" if tuning.path() else "FASTINFER_TUNED=off: no server reads it"
    print(f"wrote {written} ({read}), {files.report_path(target)}, {files.plot_path(target)}")
    return 0


def backends_to_tune(requested: str | None) -> list[str] | str:
    """The backends named (comma-separated), else every one that can run here; or why not."""
    from fastinfer.catalog.backends import unavailable_reason
    from fastinfer.catalog.tune_space import BACKENDS_TUNED

    reasons = {b: unavailable_reason(b) for b in BACKENDS_TUNED}
    runnable = [b for b, why in reasons.items() if why is None]
    if not runnable:
        example = next(iter(reasons.items()))
        store = bentoml_home() / "models"
        return f"no backend can run here (model store {store}); for example {example[0]}: {example[1]}"
    wanted = list(dict.fromkeys(b.strip() for b in requested.split(","))) if requested else runnable
    if unknown := [b for b in wanted if b not in runnable]:
        return f"cannot tune {', '.join(unknown)}: not a backend that can run here ({', '.join(runnable)})"
    return wanted


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP (a closed terminal) end it like Ctrl-C: through every server's stop. A signal
    this process was started ignoring stays ignored: ``nohup fastinfer tune &`` must outlive the terminal."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _interrupt)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main())
