"""The ``fastinfer`` command line; what each command does is said once, in :func:`parser`."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from fastinfer.catalog import choice
from fastinfer.catalog.config import BACKENDS, get_settings
from fastinfer.common import hardware
from fastinfer.common.home import bentoml_home, use_project_store


def _available() -> dict[str, str | None]:
    from fastinfer.catalog.backends import unavailable_reason

    return {name: unavailable_reason(name) for name in BACKENDS}


def _runnable(command: str, exclude: tuple[str, ...] = ()) -> list[str] | None:
    """The backends that can run here (but ``exclude``), or None after saying in one line that none can."""
    reasons = {name: why for name, why in _available().items() if name not in exclude}
    if runnable := [name for name, why in reasons.items() if why is None]:
        return runnable
    name, why = next(iter(reasons.items()))
    _fail(command, f"no backend can run here (model store {bentoml_home() / 'models'}); for example {name}: {why}")
    return None


def _fail(command: str, why: str) -> int:
    print(f"fastinfer {command}: {why}", file=sys.stderr)
    return 1


# What an engine's describe() says about where its work runs (see "No silent fallbacks", README).
PLACEMENT_KEYS = ("node_placement", "layer_precision", "precision", "precision_requested", "fallbacks")


def _write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
        print(f"wrote {path}", file=sys.stderr)


def placement_lines(entry: dict[str, Any]) -> list[str]:
    """What doctor prints under a backend about where its work runs; OpenVINO's precision hint and the
    precision its layers ended up in (an INT8 model's run in u8 whatever the hint) are told apart."""
    lines = []
    if "precision_requested" in entry:  # OpenVINO: the compiled model's INFERENCE_PRECISION_HINT
        how = (
            "OpenVINO's default on this CPU"
            if entry["precision_requested"] == "auto"
            else f"as set by FASTINFER_OPENVINO_PRECISION={entry['precision_requested']}"
        )
        lines.append(f"inference precision hint: {entry['precision']} ({how}): layers not quantized compute in it")
    elif "precision" in entry:
        lines.append(f"computes in {entry['precision']}")
    for provider, nodes in entry.get("node_placement", {}).items():
        lines.append(f"{provider} runs {nodes} of the graph")
    for layer, summary in entry.get("layer_precision", {}).items():
        lines.append(f"{layer} layers run in {_per_precision(summary)}")
    lines.extend(f"WARNING: {fallback}" for fallback in entry.get("fallbacks", []))
    return lines


def _per_precision(summary: str) -> str:
    """OpenVINO's per-layer summary ``"u8 50/53, f32 3/53"`` as ``"u8: 50 of 53, f32: 3 of 53"``."""
    parts = [re.fullmatch(r"(\S+) (\d+)/(\d+)", part) for part in summary.split(", ")]
    if not all(parts):
        return summary
    return ", ".join(f"{m[1]}: {m[2]} of {m[3]}" for m in parts if m)


def doctor(args: argparse.Namespace) -> int:
    from fastinfer.catalog import family, store, store_check
    from fastinfer.catalog.backends import open_engine, served_models

    hw = hardware.probe(check_torch=True)
    reasons = _available()
    if args.profile == BENCH_RESULT:  # this project's measurements: served by `make bench` first
        measured, measured_why = choice.measurements(hw)
        unit = measured_why  # what measurements() says of its figures (recommend ignores it when there are none)
    else:
        measured, measured_why = choice.measured_here(args.profile, hw)
        unit = choice.IN_PROCESS_UNIT
    report: dict[str, Any] = {"hardware": hw, "backends": {}}
    print("FastInfer doctor\n")
    for key in ("os", "cpu", "cores", "isa", "apple_chip", "neural_engine", "cuda", "mps"):
        source = f" — {hw['cores_source']}" if key == "cores" and hw.get("cores_source") else ""
        print(f"  {key:14} {hw.get(key)}{source}")
    meaning: dict[str, str] = hw.get("isa_meaning", {})  # type: ignore[assignment]
    for label, text in meaning.items():
        print(f"  {'':14} {label}: {text}")
    print(f"\nmodel store: {bentoml_home() / 'models'}")
    served = family.summary(store.family(), served_models())
    report["family"] = served.model_dump()
    print(served.summary())
    started = time.perf_counter()
    health = store_check.stored_health()  # every stored file against its recorded sha256
    checked_s = time.perf_counter() - started
    print("\nbackends:")
    for name, reason in reasons.items():
        reason = reason or store_check.unhealthy_reason(name, health)  # a corrupt model is not served
        entry: dict[str, Any] = {"available": reason is None, "reason": reason}
        if reason is None and not name.startswith("coreml"):  # CoreML's placement is CoreML's secret
            try:
                runs_on = open_engine(name).describe()
            except Exception as exc:  # a model that cannot load here: said, not a crash of doctor
                entry |= {"available": False, "reason": f"could not be loaded: {type(exc).__name__}: {exc}"}
            else:
                entry |= {key: runs_on[key] for key in PLACEMENT_KEYS if key in runs_on}
        report["backends"][name] = entry
        status = "available" if entry["available"] else f"unavailable: {entry['reason']}"
        print(f"  {name:18} {status}")
        for line in placement_lines(entry):
            print(f"  {'':18}   {line}")
    print("\nstored models:")
    for line in store_check.summary(health, checked_s):
        print(f"  {line}")
    report["store"] = {name: h.as_dict() for name, h in health.items()}
    # Only from what actually loaded: a backend whose model fails here is not recommended.
    available = [n for n, e in report["backends"].items() if e["available"]]
    rec = report["recommended"] = choice.recommend(hw, available, measured, unit)
    print(f"\nrecommended here: {rec['backend'] or 'none'} — {rec['why']} ({rec['source']})")
    if measured is None:
        print(f"  {measured_why}: `make bench` (served) or `fastinfer bench` (in process) measures each backend here")
    try:
        settings = get_settings()
    except ValueError as exc:  # a setting that would stop the server: said, and doctor says so in its exit code
        print(f"\nsettings: a server started here would refuse to start: {exc}")
        _write_json(args.json, {**report, "settings_error": str(exc)})
        return 1
    named_by = settings.sources.get("FASTINFER_DEFAULT_BACKEND", "environment")
    default = choice.choose_default(settings.default_backend, hw, available, measured, named_by=named_by, unit=unit)
    report["default"] = default.as_dict()
    report["configuration"] = choice.configuration(settings, default)
    tuned = report["tuned"] = settings.tuned
    print(f"default backend of a server started here: {default.describe()}")
    print(f"tuned configuration ({tuned.get('path') or 'off'}): {tuned.get('status')}"
          + (f" — {tuned['why']}" if tuned.get("why") else ""))  # fmt: skip
    print("configuration a server started here would use (value, source):")
    for name, entry in report["configuration"].items():
        print(f"  {name:36} {entry['value']}  ({entry['source']})")
    _write_json(args.json, report)
    return 0


def fidelity(args: argparse.Namespace) -> int:
    from fastinfer.catalog.backends import open_engine
    from fastinfer.catalog.store import family_spec
    from fastinfer.measure import fidelity as fid

    if (why := _available()["pytorch"]) is not None:
        return _fail(
            "fidelity", f"the reference, pytorch FP32, cannot run: {why} (model store {bentoml_home() / 'models'})"
        )
    images = fid.fidelity_images(family_spec())
    print(f"reference: pytorch FP32 on {len(images)} real photos", file=sys.stderr)
    reference = fid.run_batched(open_engine("pytorch"), images)
    results = []
    for name, reason in _available().items():
        if name == "pytorch":
            continue
        if reason is not None:
            print(f"{name}: skipped ({reason})", file=sys.stderr)
            continue
        print(f"{name}: running ...", file=sys.stderr)
        results.append(fid.measure(name, open_engine(name), images, reference))
    print(fid.table(results))
    _write_json(args.json, results)
    return 0


def bench_engines(args: argparse.Namespace) -> int:
    from fastinfer.catalog.backends import open_engine
    from fastinfer.catalog.store import family_spec
    from fastinfer.measure import bench as engine_bench
    from fastinfer.measure.fidelity import fidelity_images

    if (runnable := _runnable("bench")) is None:
        return 1
    images = fidelity_images(family_spec())[:8]
    timings = []
    for name in runnable:
        engine = open_engine(name, threads=args.threads)
        for batch in args.batches:
            print(f"{name} b{batch} ...", file=sys.stderr, flush=True)
            timings.append(engine_bench.time_engine(name, engine, images, batch, args.repeats))
    print(engine_bench.table(timings))
    _write_json(args.json, {"hardware": hardware.probe(), "engines": [t.as_dict() for t in timings]})
    return 0


def profile(args: argparse.Namespace) -> int:
    from fastinfer.catalog.backends import open_engine
    from fastinfer.catalog.store import family_spec
    from fastinfer.measure import profile as prof

    if (runnable := _runnable("profile", exclude=("coreml",))) is None:  # coreml-batched covers CoreML's models
        return 1
    engines = {}
    for name in runnable:
        print(f"loading {name} ...", file=sys.stderr, flush=True)
        engines[name] = open_engine(name, threads=args.threads)
    print("measuring stages ...", file=sys.stderr, flush=True)
    result = prof.run(engines, args.batches, args.repeats, family_spec())
    print(prof.table(result))
    _write_json(args.json, result)
    if args.plot:
        from fastinfer.measure.plots import plot_profile

        plot_profile(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from fastinfer.catalog.store import BadFamilyName
    from fastinfer.measure import evaluate as ev
    from fastinfer.measure.accuracy import EvalDirError, visible

    if args.clients is not None and not args.url:
        return _fail("evaluate", "--clients times a server's clients: it needs --url")
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".svg", ".pdf"):
        return _fail("evaluate", f"--plot names a .png, .svg or .pdf file, got {args.plot}")
    if args.max_drop is not None and args.max_drop > 100:
        return _fail("evaluate", f"--max-drop is in points of top-1, 0 to 100, got {args.max_drop:g}")
    try:  # the folders it writes into, before minutes of measuring
        for folder in {args.out, args.json and args.json.parent, args.plot and args.plot.parent} - {None}:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _fail("evaluate", f"cannot write there: {exc}")
    timing = ev.Timing(seconds=args.seconds, clients=args.clients or choice.SERVED_USERS)
    try:
        result = ev.evaluate(args.dir, args.backends, args.url, family_name=args.model, timing=timing,
                             max_drop_pp=args.max_drop)  # fmt: skip
        for line in result.report.summary():
            print(line, file=sys.stderr)
        print(result.table())
        family = str(result.report.extra.get("family") or "")
        out = args.out or (None if args.json and args.plot else ev.artifacts_dir(family))
    except (ev.EvaluateError, EvalDirError, BadFamilyName) as exc:  # said in one line, no traceback
        return _fail("evaluate", visible(str(exc)))  # it may quote a server's text
    try:
        _write_json(args.json or out / "evaluate.json", result.as_dict())
        print(f"wrote {ev.plot(result, args.plot or out / 'evaluate.png')}", file=sys.stderr)
    except (OSError, ValueError) as exc:  # the table above stands; only its files are missing
        return _fail("evaluate", f"cannot write its files: {exc}")
    return 0


def _positive(kind: type) -> Any:
    """An argparse type: a number of ``kind`` above zero (``float``: zero allowed, for --seconds 0)."""

    def check(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 <= value < float("inf") or (kind is int and value < 1):  # NaN fails the first
            raise argparse.ArgumentTypeError(f"{text!r}: give a {'whole ' if kind is int else ''}number above 0")
        return value

    return check


TUNER = "load_tests.tuning"
# Where the server looks for it (FASTINFER_DEFAULT_BACKEND=auto), wherever the command runs from.
BENCH_RESULT = choice.bench_result() or choice.BENCH_RESULT
TUNE_DESCRIPTION = (
    "Find the configuration that serves best on this machine (backend, where its engine runs, batching, front "
    "workers, engine threads) by serving the promising ones for real (bentoml serve, locust, the benchmark pool), "
    "within a time budget, and make it the server's default: make serve (or bentoml serve with the same "
    "BENTOML_HOME) reads it; environment variables still win. Writes $BENTOML_HOME/tuned/tuned.json (or "
    "FASTINFER_TUNED) and, beside it, report.md and tuned.png."
)


def tune_arguments(p: argparse.ArgumentParser) -> None:
    """``fastinfer tune``'s options: checked here, then the tuner (load_tests/tuning) parses them again."""
    p.add_argument(
        "--goal",
        choices=["throughput", "latency"],
        default="throughput",
        help="throughput: most req/s at --clients; latency: lowest single-client p50 (default: %(default)s)",
    )
    p.add_argument("--clients", type=int, default=10, help="concurrent clients for --goal throughput (default: 10)")
    p.add_argument("--p95-ms", type=float, help="with --goal throughput: only configurations whose p95 stays under it")
    p.add_argument(
        "--budget",
        type=float,
        default=420,
        help="seconds for the served trials; the in-process and backend stages always run (default: 420)",
    )
    p.add_argument("--seconds", type=float, default=12, help="seconds of load per trial (default: 12)")
    p.add_argument("--backends", help="comma-separated backends to consider (default: every one that can run here)")


def tune(args: argparse.Namespace) -> int:
    """The tuner lives with the servers and load it starts (load_tests/, the layer above); this process becomes
    it, so that Ctrl-C and SIGTERM reach the tuner itself, which stops its servers before it exits."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", TUNER, *args.argv])
    return 1  # not reached: execv returns only by raising


THREADS_HELP = "intra-op threads per model (default: the cores this process may use)"


def parser() -> argparse.ArgumentParser:
    """``fastinfer``'s arguments: every command with a one-line help, a description and a help for every option
    (plain text: argparse prints it as written)."""
    top = argparse.ArgumentParser(
        prog="fastinfer",
        description="FastInfer's command line: build the models, check this machine, measure every backend.",
        epilog="fastinfer <command> --help says more about each command.",
    )
    sub = top.add_subparsers(dest="command", required=True, title="commands")

    def command(name: str, help: str, description: str, func: Any = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description)
        p.set_defaults(func=func)
        return p

    def output(p: argparse.ArgumentParser, flag: str, default: Path, help: str) -> None:
        p.add_argument(flag, type=Path, default=default, help=f"{help} (default: %(default)s)")

    def timing(p: argparse.ArgumentParser, what: str, repeats: int, per: str) -> None:
        p.add_argument("--batches", type=int, nargs="+", default=[1, 8], help=f"batch sizes to {what} (default: 1 8)")
        p.add_argument("--repeats", type=int, default=repeats, help=f"timed runs per {per} (default: %(default)s)")
        p.add_argument("--threads", type=int, default=0, help=THREADS_HELP)

    # Its arguments are build_models' own: `fastinfer build --help` prints them (main() hands over).
    command(
        "build",
        "build every model into the BentoML store",
        "Build every model into the BentoML store: the same as python -m build_models.",
    )
    p = command(
        "tune", "find the configuration that serves best here and make it the server's default", TUNE_DESCRIPTION, tune
    )
    tune_arguments(p)
    p = command(
        "doctor",
        "this machine, each backend's availability and placement, the recommendation",
        "Probe this machine (CPU, cores, instruction sets, accelerators), load every backend that can run "
        "here and say where its work runs (execution provider nodes, OpenVINO's precision per layer), "
        "and recommend a backend: from measurements of this machine when a bench result exists (served by make "
        "bench, else in process by fastinfer bench), else by rule. Then what a server started here would use: its "
        "default backend, the tuned file's status, and each setting with its source.",
        doctor,
    )
    p.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    output(p, "--profile", BENCH_RESULT, "a fastinfer bench result to recommend from, when it exists")
    p = command(
        "fidelity",
        "every available backend against the FP32 PyTorch reference",
        "Run every backend that can run here on real photos and compare its answers with the FP32 PyTorch "
        "reference: top-1 agreement, top-5 overlap, cosine similarity and the largest logit error, each "
        "held to the gate of the precision it runs at (FP32, BF16 or INT8).",
        fidelity,
    )
    output(p, "--json", Path("artifacts/fidelity.json"), "write the results here")
    p = command(
        "evaluate",
        "the accuracy-speed frontier of every stored backend on your labelled photos",
        "Measure what each backend stored for a model family costs in accuracy and gives in speed, on a folder of "
        "labelled photos (ImageFolder layout: one sub-folder per class, named as its label): top-1 (with its 95% "
        "interval) and top-5 (with more than 5 classes) beside the stored PyTorch model's, then images/s: each "
        "engine's own in this process, or, with --url, what a running server serves to several clients on your "
        "photos, cache bypassed, after a warm-up. Photos that cannot be decoded are skipped and counted. Prints "
        "the table naming the fastest backend within the accuracy limit; writes it as evaluate.json and draws "
        "the frontier (top-1 against images/s, the Pareto front marked) as evaluate.png, beside the family in the "
        "store's home ($BENTOML_HOME/artifacts/NAME) or in --out.",
        evaluate,
    )
    p.add_argument("dir", type=Path, help="the labelled photos: DIR/<label>/<image>")
    p.add_argument("--backends", help="comma-separated backends (default: every one stored and able to run here)")
    p.add_argument("--model", help="the model family (default: FASTINFER_MODEL, else resnet50)")
    p.add_argument(
        "--url",
        help="a running server to ask through POST /classify (answers computed for each request: no-cache); "
        "with API keys, set FASTINFER_API_KEY",
    )
    p.add_argument(
        "--seconds",
        type=_positive(float),
        default=5.0,
        help="seconds of timing per backend, after a 1 s warm-up; 0 measures accuracy alone (default: %(default)s)",
    )
    p.add_argument(
        "--clients",
        type=_positive(int),
        help=f"with --url: concurrent clients while timing, as make bench's headline (default: {choice.SERVED_USERS})",
    )
    p.add_argument(
        "--max-drop",
        type=_positive(float),
        metavar="PP",
        help="the most points of top-1 below PyTorch's a backend may lose to count as within the limit (default: "
        "the limit the family's build recorded, else the build's default, 1)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="the folder for evaluate.json and evaluate.png (default: $BENTOML_HOME/artifacts/NAME, NAME the family)",
    )
    p.add_argument("--json", type=Path, help="write the table here instead (default: evaluate.json in --out)")
    p.add_argument("--plot", type=Path, help="draw the frontier here instead (default: evaluate.png in --out)")
    p = command(
        "bench",
        "in-process model latency per backend",
        "Time every backend that can run here in this process (no server), at each batch size: median "
        "latency and images per second. doctor recommends from the result.",
        bench_engines,
    )
    timing(p, "time", 20, "backend and batch size")
    output(p, "--json", BENCH_RESULT, "write the results here")
    p = command(
        "profile",
        "per-stage costs in-process, and the ceiling they allow",
        "Measure the CPU cost of every stage of a request (decode, preprocess, inference per backend) in this "
        "process, the throughput ceiling they allow on this machine, and which stage binds it.",
        profile,
    )
    timing(p, "measure", 10, "stage and batch size")
    output(p, "--json", Path("artifacts/profile.json"), "write the results here")
    output(p, "--plot", Path("artifacts/profile.png"), "draw the stages here")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    use_project_store()  # the store `make` uses, not ~/bentoml, wherever this runs from
    if argv and argv[0] == "build":
        # The CLI is the composition root: the one place in fastinfer/ that reaches build_models.
        from build_models.__main__ import main as build_main

        return build_main(argv[1:], prog="fastinfer build")
    args = parser().parse_args(argv)
    args.argv = argv[1:]  # for a command handed over as it was given (tune)
    from fastinfer.catalog.backends import NotStored
    from fastinfer.catalog.store import FAMILY_ENV, BadFamilyName
    from fastinfer.common.client import BadApiKey

    try:
        return int(args.func(args))
    except (BadApiKey, NotStored, BadFamilyName) as exc:  # a server's key, a model needed, FASTINFER_MODEL: one line
        return _fail(args.command, f"{FAMILY_ENV}: {exc}" if isinstance(exc, BadFamilyName) else str(exc))


if __name__ == "__main__":
    sys.exit(main())
