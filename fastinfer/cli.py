"""``fastinfer``: the command line.

* ``fastinfer build ...``   build every model into the store (same as ``python -m build_models``)
* ``fastinfer doctor``      this machine, every backend's availability and placement, the recommendation
* ``fastinfer fidelity``    every available backend against the FP32 PyTorch reference on real photos
* ``fastinfer bench``       in-process model latency per backend (b1 and b8): the INT8 finding
* ``fastinfer profile``     per-stage CPU cost, the ceiling of this machine, and what binds it
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fastinfer import hardware
from fastinfer.config import BACKENDS


def _available() -> dict[str, str | None]:
    from fastinfer.backends import unavailable_reason

    return {name: unavailable_reason(name) for name in BACKENDS}


# What an engine's describe() says about where its work runs (see "No silent fallbacks", README).
PLACEMENT_KEYS = ("node_placement", "layer_precision", "precision", "precision_requested", "fallbacks")


def _write_json(path: Path | None, data: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))
        print(f"wrote {path}", file=sys.stderr)


def doctor(args: argparse.Namespace) -> int:
    from fastinfer.backends import open_engine

    hw = hardware.probe(check_torch=True)
    reasons = _available()
    profile = json.loads(args.profile.read_text()) if args.profile and args.profile.exists() else None
    throughput = {r["backend"]: r["images_per_s"] for r in profile["engines"]} if profile else None
    report: dict[str, Any] = {"hardware": hw, "backends": {}}
    print("FastInfer doctor\n")
    for key in ("os", "cpu", "cores", "isa", "apple_chip", "neural_engine", "cuda", "mps"):
        source = f" — {hw['cores_source']}" if key == "cores" and hw.get("cores_source") else ""
        print(f"  {key:14} {hw.get(key)}{source}")
    meaning: dict[str, str] = hw.get("isa_meaning", {})  # type: ignore[assignment]
    for label, text in meaning.items():
        print(f"  {'':14} {label}: {text}")
    print("\nbackends:")
    for name, reason in reasons.items():
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
        if "precision" in entry:
            print(f"  {'':18}   precision {entry['precision']} (requested {entry.get('precision_requested')})")
        for placement in ("node_placement", "layer_precision"):
            for what, count in entry.get(placement, {}).items():
                print(f"  {'':18}   {what} {count}")
        for fallback in entry.get("fallbacks", []):
            print(f"  {'':18}   WARNING: {fallback}")
    # Only from what actually loaded: a backend whose model fails here is not recommended.
    available = [n for n, e in report["backends"].items() if e["available"]]
    rec = report["recommended"] = hardware.recommend(hw, available, throughput)
    print(f"\nrecommended here: {rec['backend']} — {rec['why']}")
    _write_json(args.json, report)
    return 0


def fidelity(args: argparse.Namespace) -> int:
    from fastinfer import fidelity as fid
    from fastinfer.backends import open_engine
    from fastinfer.preprocess import PreprocessSpec

    images = fid.fidelity_images(PreprocessSpec())
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
    from fastinfer import bench as engine_bench
    from fastinfer.backends import open_engine
    from fastinfer.fidelity import fidelity_images
    from fastinfer.preprocess import PreprocessSpec

    images = fidelity_images(PreprocessSpec())[:8]
    timings = []
    for name, reason in _available().items():
        if reason is not None:
            continue
        engine = open_engine(name, threads=args.threads)
        for batch in args.batches:
            print(f"{name} b{batch} ...", file=sys.stderr, flush=True)
            timings.append(engine_bench.time_engine(name, engine, images, batch, args.repeats))
    print(engine_bench.table(timings))
    _write_json(args.json, {"hardware": hardware.probe(), "engines": [t.as_dict() for t in timings]})
    return 0


def profile(args: argparse.Namespace) -> int:
    from fastinfer import profile as prof
    from fastinfer.backends import open_engine
    from fastinfer.preprocess import PreprocessSpec

    engines = {}
    for name, reason in _available().items():
        if reason is None and name != "coreml":  # coreml-batched covers the CoreML models
            print(f"loading {name} ...", file=sys.stderr, flush=True)
            engines[name] = open_engine(name, threads=args.threads)
    print("measuring stages ...", file=sys.stderr, flush=True)
    result = prof.run(engines, args.batches, args.repeats, PreprocessSpec())
    if args.load_test and args.load_test.exists():
        result["load_test"] = prof.against_load_test(result, json.loads(args.load_test.read_text()))
    print(prof.table(result))
    _write_json(args.json, result)
    if args.plot:
        from fastinfer.plots import plot_profile

        plot_profile(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "build":
        # The CLI is the composition root: the one place in fastinfer/ that reaches build_models.
        from build_models.__main__ import main as build_main

        return build_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="fastinfer", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build every model into the BentoML store (see python -m build_models -h)")
    p = sub.add_parser("doctor", help="hardware, backends, node placement, recommendation")
    p.add_argument("--json", type=Path, help="also write the report as JSON")
    p.add_argument("--profile", type=Path, default=Path("artifacts/bench.json"), help="measured data to recommend from")
    p.set_defaults(func=doctor)
    p = sub.add_parser("fidelity", help="every backend vs the FP32 PyTorch reference")
    p.add_argument("--json", type=Path, default=Path("artifacts/fidelity.json"))
    p.set_defaults(func=fidelity)
    p = sub.add_parser("bench", help="in-process model latency per backend")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: the cores this process may use)")
    p.add_argument("--json", type=Path, default=Path("artifacts/bench.json"))
    p.set_defaults(func=bench_engines)
    p = sub.add_parser("profile", help="per-stage costs in-process, and the ceiling they allow")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: the cores this process may use)")
    p.add_argument("--json", type=Path, default=Path("artifacts/profile.json"))
    p.add_argument("--plot", type=Path, default=Path("artifacts/profile.png"))
    p.add_argument("--load-test", type=Path, help="a load-test result (results.json) to compare with the ceiling")
    p.set_defaults(func=profile)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
