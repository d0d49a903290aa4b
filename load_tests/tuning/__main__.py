"""``fastinfer tune`` (``make tune``, ``python -m load_tests.tuning``): find the configuration that serves best here
(load_tests/tuning/search.py) and make it the server's default; the tuned file is written last, atomically.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

from fastinfer.common.client import BadApiKey, auth_headers
from fastinfer.common.home import bentoml_home, use_project_store
from load_tests.tuning import files
from load_tests.tuning.search import Goal, shown, tune


def main(argv: list[str] | None = None) -> int:
    from fastinfer.cli import TUNE_DESCRIPTION, tune_arguments

    parser = argparse.ArgumentParser(prog="fastinfer tune", description=TUNE_DESCRIPTION)
    tune_arguments(parser)  # the same arguments `fastinfer tune` checks before it hands over
    args = parser.parse_args(argv)
    try:  # its requests send it: a bad one is said before any server starts
        auth_headers()
    except BadApiKey as exc:
        print(f"fastinfer tune: {exc}", file=sys.stderr)
        return 1
    if args.clients < 1 or args.budget <= 0 or args.seconds <= 0:
        parser.error("--clients, --budget and --seconds must be positive")
    if not (wanted := backends_to_tune(args.backends)):
        return 1
    from fastinfer.catalog import tuned as tuning

    target = tuning.path() or tuning.default_path()  # where the server reads it (FASTINFER_TUNED)
    if target.exists() and not target.is_file():
        print(f"fastinfer tune: {target} is not a file; FASTINFER_TUNED names the file to write", file=sys.stderr)
        return 1
    command = shlex.join(["fastinfer", "tune", *(sys.argv[1:] if argv is None else argv)])
    goal = Goal(args.goal, args.clients, args.p95_ms)
    if args.goal == "latency" and (args.p95_ms is not None or args.clients != 10):
        print("fastinfer tune: --goal latency measures one client; --clients and --p95-ms are not used",
              file=sys.stderr)  # fmt: skip
    interrupt_on_signals()
    try:
        search = tune(goal, args.budget, args.seconds, target.parent / "runs", wanted)
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


def backends_to_tune(named: str | None) -> list[str]:
    """The project's store in use, and the backends to tune: those ``named`` (comma-separated), else every one
    that can run here; none when that cannot be (why: on stderr)."""
    from fastinfer.catalog.backends import over_accuracy_limit, unavailable_reason
    from fastinfer.catalog.tune_space import BACKENDS_TUNED

    use_project_store()
    reasons = {b: unavailable_reason(b) for b in BACKENDS_TUNED}
    lossy = {b: lost for b, why in reasons.items() if why is None and (lost := over_accuracy_limit(b)) is not None}
    if any(why is None and b not in lossy for b, why in reasons.items()):  # within the limit only, where any is
        reasons |= lossy
    runnable = [b for b, why in reasons.items() if why is None]
    wanted = list(dict.fromkeys(b.strip() for b in named.split(","))) if named else runnable
    why = ""
    if not runnable:
        example, reason = next(iter(reasons.items()))
        why = f"no backend can run here (model store {bentoml_home() / 'models'}); for example {example}: {reason}"
    elif unknown := [b for b in wanted if b not in runnable]:
        said = "; ".join(f"{b}: {reasons.get(b) or 'no such backend'}" for b in unknown)
        why = f"cannot tune {said} (tunable here: {', '.join(runnable)})"
    if why:
        print(f"fastinfer tune: {why}", file=sys.stderr)
    return [] if why else wanted


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
