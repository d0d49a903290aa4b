"""``make tune-check`` (``python -m load_tests.tuning.check``): hold ``fastinfer tune`` against an
exhaustive sweep of the same space, on this machine, and put the verdict in BENCHMARKS.md.

1. the search (load_tests/tuning/search.py ``tune``), timed, as ``fastinfer tune`` runs it; its tuned
   file goes to OUT/tuning/, never to the server's store;
2. the sweep (``sweep``): every configuration of the same space served, unpruned, timed;
3. head to head: the sweep's best and the search's choice served again, alternating (A B B A …): the
   sweep's best is the maximum of many noisy runs, so its own figure flatters it (the winner's curse).

Targets (issue "Hardware-aware by default"): the choice reaches >= 95% of the sweep's best, in <= 1/4
of the sweep's time. The sweep costs ~25 s a server plus (``--seconds`` + ~9 s) a configuration: on 2
cores, 3 backends' space (108 configurations on 36 servers) is ~45 min at 12 s.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from fastinfer.common import hardware
from fastinfer.common.home import use_project_store
from load_tests.tuning import files
from load_tests.tuning.search import Config, Goal, Measure, Search, Trial, measure_locust, serve, sweep, tune

TARGET_SHARE = 0.95  # the search's choice against the sweep's best
TARGET_TIME = 0.25  # the search's time against the sweep's
SECTION = "## Tuning: `fastinfer tune` against an exhaustive sweep"


def head_to_head(search: Search, best: Config, chosen: Config, rounds: int, measure: Measure) -> dict[str, list[Trial]]:
    """``rounds`` fresh servers each for the sweep's best and the search's choice, alternating A B B A …
    so that a drift of the machine falls on both."""
    runs: dict[str, list[Trial]] = {"sweep best": [], "tuned": []}
    for i in range(rounds):
        order = [("sweep best", best), ("tuned", chosen)]
        for name, config in order if i % 2 == 0 else order[::-1]:
            runs[name] += serve([config], "head to head", search, measure)
    return runs


def mean_score(goal: Goal, trials: list[Trial]) -> float:
    scores = [goal.score(t) for t in trials]
    return sum(scores) / len(scores) if scores else -math.inf


def share(goal: Goal, mine: float, best: float) -> float | None:
    """``mine`` as a share of ``best`` for the goal (req/s: mine/best; latency, scored as −p50: best/mine)."""
    if not (math.isfinite(mine) and math.isfinite(best)) or mine == 0 or best == 0:
        return None
    return mine / best if goal.kind == "throughput" else best / mine


def verdict(result: dict[str, Any]) -> list[str]:
    """The two target lines, each met / NOT met with its numbers."""
    cpu = f"{result['hardware'].get('cpu')}, {result['hardware'].get('cores')} cores"
    lines = []
    ratio = result.get("share_head_to_head")
    if ratio is None:
        ratio = result.get("share_in_sweep")
    where = "head to head" if result.get("share_head_to_head") is not None else "the sweep's own runs"
    if ratio is None:
        lines.append(f"- The tuned configuration >= {TARGET_SHARE:.0%} of the sweep's best: not judged "
                     "(nothing served)")  # fmt: skip
    else:
        met = "met" if ratio >= TARGET_SHARE else "NOT met"
        lines.append(
            f"- The tuned configuration >= {TARGET_SHARE:.0%} of the sweep's best: **{met}**, {ratio:.0%} "
            f"({where}; in the sweep's own runs {_pct(result.get('share_in_sweep'))}) — {cpu}"
        )
    t, s = result["tune"]["elapsed_s"], result["sweep"]["elapsed_s"]
    met = "met" if t <= TARGET_TIME * s else "NOT met"
    lines.append(f"- In <= 1/4 of the sweep's time: **{met}**, {t / 60:.1f} min vs {s / 60:.1f} min "
                 f"({_pct(t / s if s else None)}) — {cpu}")  # fmt: skip
    return lines


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def section(result: dict[str, Any] | None, plot: str | None) -> list[str]:
    """BENCHMARKS.md's section: the verdicts, the sweep's best configurations, the plot."""
    if result is None:
        return [SECTION, "", "Not run on this machine: `make tune-check` (on 2 cores ~45 min for 3 backends).", ""]
    tuned, best = result["tune"]["chosen"], result["sweep"]["best"]
    lines = [
        SECTION,
        "",
        f"`{result['command']}` on {result['date']}: {result['hardware'].get('cpu')}, "
        f"{result['hardware'].get('cores')} cores usable; goal {result['goal']}; backends "
        f"{', '.join(result['backends'])}; {result['seconds']:g} s of load per run (locust, the benchmark "
        "pool, cache bypassed), every run on a fresh server after a warm-up.",
        "",
        *verdict(result),
        "",
        f"- `fastinfer tune` chose **{tuned['label'] if tuned else 'nothing'}** after {result['tune']['trials']} "
        f"served trials in {result['tune']['elapsed_s'] / 60:.1f} min.",
        f"- The sweep served all {result['sweep']['configurations']} configurations on {result['sweep']['servers']} "
        f"servers in {result['sweep']['elapsed_s'] / 60:.1f} min; its best: **{best['label'] if best else 'none'}**.",
    ]
    if result.get("head_to_head"):
        h = result["head_to_head"]
        lines.append(
            "- Head to head (fresh servers, alternating): the sweep's best "
            + ", ".join(_fig(t) for t in h["sweep best"])
            + "; the tuned one "
            + ", ".join(_fig(t) for t in h["tuned"])
            + "."
        )
    elif tuned and best and tuned["label"] == best["label"]:
        lines.append("- The search chose the sweep's best itself: no head to head needed.")
    if plot:
        lines += ["", f"![every configuration of the sweep]({plot})"]
    lines += ["", "The sweep's ten best:", "", "| configuration | req/s | p50 ms | p95 ms |", "|---|---|---|---|"]
    served = [t for t in result["sweep"]["trials"] if not t["error"] and t["requests"]]
    key = (lambda t: -t["p50_ms"]) if result["goal"].startswith("latency") else (lambda t: t["req_per_s"])
    for t in sorted(served, key=key, reverse=True)[:10]:
        mark = " ★ tuned" if tuned and t["label"] == tuned["label"] else ""
        lines.append(f"| {t['label']}{mark} | {t['req_per_s']} | {t['p50_ms']:g} | {t['p95_ms']:g} |")
    return [*lines, ""]


def _fig(trial: dict[str, Any]) -> str:
    return f"{trial['req_per_s']} req/s (p50 {trial['p50_ms']:g} ms)" if not trial["error"] else trial["error"][:60]


def replace_section(markdown: str, new: list[str]) -> str:
    """``markdown`` with its tuning section (up to the next ``## ``) replaced by ``new``, or ``new``
    appended."""
    lines = markdown.rstrip("\n").split("\n")
    if SECTION in lines:
        start = lines.index(SECTION)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = new
    else:
        lines += ["", *new]
    return "\n".join(lines).rstrip("\n") + "\n"


def plot_sweep(result: dict[str, Any], path: Path) -> bool:
    """req/s against p95 for every configuration of the sweep, the sweep's best and the tuned one marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = [t for t in result["sweep"]["trials"] if not t["error"] and t["requests"]]
    if not served:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for backend in dict.fromkeys(t["config"]["backend"] for t in served):
        mine = [t for t in served if t["config"]["backend"] == backend]
        ax.scatter([t["p95_ms"] for t in mine], [t["req_per_s"] for t in mine], label=backend, s=30, alpha=0.8)
    marks = [("sweep best", result["sweep"]["best"], "D", "red"), ("tuned", result["tune"]["chosen"], "*", "gold")]
    for name, chosen, marker, colour in marks:
        found = [t for t in served if chosen and t["label"] == chosen["label"]]
        if found:
            ax.scatter([found[0]["p95_ms"]], [found[0]["req_per_s"]], marker=marker, s=260, c=colour,
                       edgecolors="black", label=f"{name}: {chosen['label']}", zorder=3)  # fmt: skip
    ax.set(xlabel="p95 latency, ms", ylabel="req/s",
           title=f"Sweep of the tuner's space ({result['hardware'].get('cpu')}, {result['goal']})")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def compare(tuner: Search, swept: Search, rounds: int, measure: Measure = measure_locust) -> dict[str, Any]:
    """What the check found: the tuner's choice and the sweep's best, each as the sweep measured it, and
    head to head when they differ (``rounds`` each)."""
    goal = swept.goal
    chosen, best = tuner.chosen, swept.chosen
    in_sweep = next((t for t in swept.trials if chosen and t.config == chosen.config), None)
    result: dict[str, Any] = {
        "tune": {
            "elapsed_s": round(tuner.elapsed(), 1),
            "trials": len(tuner.trials),
            "chosen": chosen.as_dict() if chosen else None,
            "decisions": tuner.decisions,
        },
        "sweep": {
            "elapsed_s": round(swept.elapsed(), 1),
            "configurations": len(swept.trials),
            "servers": swept.servers,
            "best": best.as_dict() if best else None,
            "trials": [t.as_dict() for t in swept.trials],
        },
        "share_in_sweep": share(goal, goal.score(in_sweep), goal.score(best)) if in_sweep and best else None,
        "share_head_to_head": None,
        "head_to_head": None,
    }
    if chosen and best and chosen.config != best.config and rounds > 0:
        runs = head_to_head(swept, best.config, chosen.config, rounds, measure)
        result["head_to_head"] = {name: [t.as_dict() for t in trials] for name, trials in runs.items()}
        mine, theirs = mean_score(goal, runs["tuned"]), mean_score(goal, runs["sweep best"])
        result["share_head_to_head"] = share(goal, mine, theirs)
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from fastinfer.cli import tune_arguments
    from load_tests.tuning.__main__ import backends_to_tune, interrupt_on_signals

    parser = argparse.ArgumentParser(prog="python -m load_tests.tuning.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    tune_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2, help="head-to-head rounds of each (default: 2)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--plots", type=Path, default=Path("docs/bench"), help="where BENCHMARKS.md's PNGs go")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.budget <= 0 or args.seconds <= 0 or args.rounds < 0:
        parser.error("--clients, --budget and --seconds must be positive, --rounds not negative")
    use_project_store()
    wanted = backends_to_tune(args.backends)
    if isinstance(wanted, str):
        print(f"tune-check: {wanted}", file=sys.stderr)
        return 1
    goal = Goal(args.goal, args.clients, args.p95_ms)
    where = args.out / "tuning"
    command = shlex.join(["python", "-m", "load_tests.tuning.check", *(sys.argv[1:] if argv is None else argv)])
    interrupt_on_signals()
    try:
        tuner = tune(goal, args.budget, args.seconds, where / "tune-runs", wanted)
        files.write(tuner, command, where / "tuned.json")  # its report beside it; no server reads this file
        swept = sweep(goal, args.seconds, where / "sweep-runs", wanted)
        result = compare(tuner, swept, args.rounds)
    except KeyboardInterrupt:
        print("tune-check: interrupted; every server it started was stopped", file=sys.stderr)
        return 130
    result |= {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware.probe(),
        "goal": goal.describe(),
        "backends": wanted,
        "seconds": args.seconds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tuning.json").write_text(json.dumps(result, indent=2))
    args.plots.mkdir(parents=True, exist_ok=True)
    drawn = plot_sweep(result, args.plots / "tuning.png")
    rel = Path(*[".."] * len(args.markdown.parent.parts), args.plots, "tuning.png") if drawn else None
    old = args.markdown.read_text() if args.markdown.exists() else "# Benchmarks\n"
    args.markdown.write_text(replace_section(old, section(result, str(rel) if rel else None)))
    print("\n".join(verdict(result)))
    print(f"wrote {args.out / 'tuning.json'} and the section of {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
