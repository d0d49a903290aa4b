"""``make tune-check`` (``python -m load_tests.tuning.check``): hold ``fastinfer tune`` against an
exhaustive sweep of the same space, on this machine; the verdict goes into BENCHMARKS.md, rewritten from the
bench's results.json beside its plots (without one, only OUT/tuning.json is saved: ``make bench`` shows it).

The search runs as ``fastinfer tune`` does (its tuned file to OUT/tuning/), then the sweep, then the sweep's
best few (CONTENDERS) and the search's choice head to head on fresh servers, ``--rounds`` times in alternating
order: the sweep's own best figure flatters it (winner's curse), so the verdict is judged on those means.
Results are saved (OUT/tuning.json) after every server, so an interrupted check keeps its runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastinfer.catalog import tune_space
from fastinfer.common import hardware
from fastinfer.measure.plots import plot_tuning, table
from load_tests.report import Target, machine
from load_tests.report import write_markdown as write_report
from load_tests.tuning import files
from load_tests.tuning.search import (
    Config,
    Goal,
    Measure,
    Search,
    Trial,
    cores_said,
    measure_locust,
    serve,
    sweep,
    sweep_estimate_s,
    tune,
)

TARGET_SHARE = 0.95  # the search's choice against the best
TARGET_TIME = 0.25  # the search's time against the sweep's
CONTENDERS = 3  # the sweep's best configurations served again head to head
FORMAT = 2  # of OUT/tuning.json: `make bench` reads only this one
SECTION = "## Tuning: `fastinfer tune` against an exhaustive sweep"
NOT_RUN = "Not run on this machine: `make tune-check` (half an hour to an hour; it says how long first)."


def contenders(goal: Goal, swept: Search, chosen: Config | None) -> list[Config]:
    """The sweep's CONTENDERS best configurations that served within the goal, and the search's choice."""
    ranked = sorted((t for t in swept.trials if goal.score(t) > -math.inf), key=goal.score, reverse=True)
    best = list(dict.fromkeys(t.config for t in ranked))[:CONTENDERS]
    return best + ([chosen] if chosen and chosen not in best else [])


def mean_score(goal: Goal, trials: list[Trial]) -> float:
    """The mean of the goal's scores; -inf if any run failed or broke the goal's limit."""
    scores = [goal.score(t) for t in trials]
    return sum(scores) / len(scores) if scores else -math.inf


def share(goal: Goal, mine: float, best: float) -> float | None:
    """``mine`` as a share of ``best`` for the goal (req/s: mine/best; latency, scored as −p50: best/mine)."""
    if not (math.isfinite(mine) and math.isfinite(best)) or mine == 0 or best == 0:
        return None
    return mine / best if goal.kind == "throughput" else best / mine


def trial_dict(goal: Goal, trial: Trial) -> dict[str, Any]:
    return trial.as_dict() | {"qualified": goal.score(trial) > -math.inf}


def compare(
    tuner: Search,
    tune_s: float,
    swept: Search,
    rounds: int,
    measure: Measure = measure_locust,
    save: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """The search's choice and the sweep's best, as the sweep measured them and head to head (``rounds`` each;
    0: judged on the sweep's own runs); ``save``d after the sweep and after each head-to-head round."""
    goal = swept.goal
    chosen = tuner.chosen.config if tuner.chosen else None
    result = sweep_result(tuner, tune_s, swept) | {"stage": "head to head"}
    best = swept.chosen
    in_sweep = next((t for t in swept.trials if t.config == chosen), None)
    result["share_in_sweep"] = share(goal, goal.score(in_sweep), goal.score(best)) if in_sweep and best else None
    save(result)
    if chosen is not None and best is not None and rounds > 0:
        configs = contenders(goal, swept, chosen)
        runs: dict[Config, list[Trial]] = {c: [] for c in configs}
        for i in range(rounds):  # alternating order, so that a drift of the machine falls on all of them
            for config in configs if i % 2 == 0 else configs[::-1]:
                runs[config] += serve([config], "head to head", swept, measure)
            result |= head_to_head_result(goal, runs, chosen)
            save(result)
    return result | {"stage": "done"}


def head_to_head_result(goal: Goal, runs: dict[Config, list[Trial]], chosen: Config) -> dict[str, Any]:
    """The head to head so far: each contender's runs, the best mean, the tuned one's share of it."""
    means = {config: mean_score(goal, trials) for config, trials in runs.items()}
    finite = {c: m for c, m in means.items() if math.isfinite(m)}
    winner = max(finite, key=lambda c: finite[c]) if finite else None
    return {
        "head_to_head": [  # qualified: every run served within the goal
            dict(label=c.label(), tuned=c == chosen, qualified=c in finite, runs=[trial_dict(goal, t) for t in ts])
            for c, ts in runs.items()
        ],
        "head_to_head_best": winner.label() if winner else None,
        "share_head_to_head": share(goal, means[chosen], finite[winner]) if winner else None,
    }


def sweep_result(tuner: Search, tune_s: float, swept: Search | None) -> dict[str, Any]:
    """The measurements so far (saved after the tune and after each sweep server)."""
    result: dict[str, Any] = {
        "format": FORMAT,
        "stage": "sweep" if swept is not None else "tune",  # what was under way when it was saved
        "tune": {
            "elapsed_s": round(tune_s, 1),
            "budget_s": tuner.budget_s,
            "trials": len(tuner.trials),
            "chosen": tuner.chosen.as_dict() if tuner.chosen else None,
            "decisions": tuner.decisions,
            "skipped": tuner.skipped,
        },
        **dict.fromkeys(("sweep", "share_in_sweep", "share_head_to_head", "head_to_head", "head_to_head_best")),
    }
    if swept is not None:
        runs = [t for t in swept.trials if t.stage == "sweep"]
        best = max((t for t in runs if tuner.goal.score(t) > -math.inf), key=tuner.goal.score, default=None)
        result["sweep"] = {
            "elapsed_s": round(swept.elapsed(), 1),
            "estimate_s": round(swept.budget_s),
            "configurations": len({t.config for t in runs}),
            "servers": swept.servers,
            "best": best.as_dict() if best else None,
            "trials": [trial_dict(tuner.goal, t) for t in runs],
        }
    return result


def targets(result: dict[str, Any]) -> list[Target]:
    """The two targets as rows of BENCHMARKS.md's first table, each with its numbers (or why it is not judged)."""
    where, name = machine(result["hardware"]), "`fastinfer tune`'s choice vs the sweep's best"
    both = f">= {TARGET_SHARE:.0%} of the best, in <= 1/4 of the sweep's time"
    tuned, swept, stage = result["tune"]["chosen"], result["sweep"], result["stage"]
    if swept is None or stage == "sweep":
        return [Target(name, f"the check was interrupted ({_done(result)})", both, "not judged", where)]
    if swept["best"] is None:
        return [Target(name, "no configuration of the sweep served within the goal", both, "not judged", where)]
    rows, said, figure = result["head_to_head"] or [], "not judged", ""
    if tuned is None:
        said, figure = "NOT met", "the tune chose nothing"
    elif rows:
        ratio, mine = result["share_head_to_head"], next((r for r in rows if r["tuned"]), None)
        others = [r for r in rows if not r["tuned"]]
        if mine is None or not mine["qualified"]:
            said, figure = "NOT met", "the tuned configuration failed or broke the goal's limit head to head"
        elif ratio is not None:
            said = "met" if ratio >= TARGET_SHARE else "NOT met"
            figure = (f"{ratio:.0%} head to head (means of {len(mine['runs'])} fresh servers each; in the sweep's "
                      f"own runs {_pct(result['share_in_sweep'])})")  # fmt: skip
        if failed := [r["label"] for r in others if not r["qualified"]]:
            figure += (f"; judged against {len(others) - len(failed)} of the sweep's {len(others)} best: "
                       f"{'; '.join(failed)} failed or broke the goal's limit head to head")  # fmt: skip
        if stage != "done":
            figure += "; the head to head was interrupted after this round"
        if cores := cores_said(tuned.get("config") or {}):
            figure += f"; the choice's decode pool: {cores}"
    elif stage != "done":
        figure = ("the head to head was interrupted before its first round (in the sweep's own runs "
                  f"{_pct(result['share_in_sweep'])})")  # fmt: skip
    else:
        ratio = result["share_in_sweep"]
        said = "NOT met" if ratio is None or ratio < TARGET_SHARE else "met"
        figure = f"{_pct(ratio)} in the sweep's own runs (no head to head)"
    t, s = result["tune"]["elapsed_s"], swept["elapsed_s"]
    budget = result["tune"]["budget_s"] / 60
    took = f"{t / 60:.1f} min (its budget {budget:g} min) vs {s / 60:.1f} min ({_pct(t / s if s else None)})"
    if tuned is not None and "decode_threads" not in (tuned.get("config") or {}):  # saved before either existed
        older = f"; a check of {result.get('date', '?')}, before the scheduling and decode pool were tuned"
        figure, took = figure + older, took + older
    return [
        Target(name, figure, f">= {TARGET_SHARE:.0%} of the best", said, where),
        Target("`fastinfer tune`'s time vs the sweep's", took, "<= 1/4 of the sweep's time",
               "met" if tuned is not None and t <= TARGET_TIME * s else "NOT met", where),
    ]  # fmt: skip


def verdict(result: dict[str, Any]) -> list[str]:
    """The target rows as lines, for the terminal."""
    return [f"- {t.name}, {t.goal}: **{t.verdict}**, {t.figure} — {t.machine}" for t in targets(result)]


def _done(result: dict[str, Any]) -> str:
    swept = result["sweep"]
    if swept is None:
        return "after the tune, before the sweep"
    return f"{swept['configurations']} configurations swept in {swept['elapsed_s'] / 60:.1f} min"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def section(result: dict[str, Any] | None, plot: str | None) -> list[str]:
    """BENCHMARKS.md's section: the verdicts, the head to head, the sweep's best configurations, the plot."""
    if result is None:
        return [SECTION, "", NOT_RUN, ""]
    tune_part, swept = result["tune"], result["sweep"]
    tuned = tune_part["chosen"]
    cores = cores_said(tuned.get("config") or {}) if tuned else ""
    lines = [
        SECTION,
        "",
        f"`{result['command']}` on {result['date']}: {result['hardware'].get('cpu')}, "
        f"{result['hardware'].get('cores')} cores usable; goal {result['goal']}; backends "
        f"{', '.join(result['backends'])}; {result['seconds']:g} s of load per run.",
        "",
        f"- `fastinfer tune` chose **{tuned['label'] if tuned else 'nothing'}**"
        + (f" (decode pool: {cores})" if cores else "")
        + f" after {tune_part['trials']} "
        f"served trials in {tune_part['elapsed_s'] / 60:.1f} min"
        + (f"; the budget left untried: {'; '.join(tune_part['skipped'])}" if tune_part["skipped"] else "")
        + ".",
    ]
    if swept:
        best = swept["best"]
        lines.append(
            f"- The sweep served {swept['configurations']} configurations on {swept['servers']} servers in "
            f"{swept['elapsed_s'] / 60:.1f} min; its best run: **{best['label'] if best else 'none'}**."
        )
    latency = result["goal"].startswith("latency")
    if result.get("head_to_head"):
        rows = []
        for row in result["head_to_head"]:
            name = row["label"] + (" ★ tuned" if row["tuned"] else "")
            figures = [t["p50_ms" if latency else "req_per_s"] for t in row["runs"]]
            mean = f"{sum(figures) / len(figures):.1f}" if row["qualified"] and figures else "– (a run failed)"
            won = row["label"] == result.get("head_to_head_best")
            rows.append([f"**{name}**" if won else name, ", ".join(_fig(t) for t in row["runs"]), mean])
        header = ["configuration", "runs, req/s (p50 ms)", f"mean {'p50 ms' if latency else 'req/s'}"]
        lines += ["", "Head to head (each on fresh servers, alternating order):", "", table(header, rows)]
    if plot:
        lines += ["", f"![every configuration of the sweep]({plot})"]
    if swept:
        served = [t for t in swept["trials"] if t["qualified"]]
        ten = sorted(served, key=lambda t: -t["p50_ms"] if latency else t["req_per_s"], reverse=True)[:10]
        rows = []
        for t in ten:
            mark = " ★ tuned" if tuned and t["label"] == tuned["label"] else ""
            rows.append([t["label"] + mark, t["req_per_s"], f"{t['p50_ms']:g}", f"{t['p95_ms']:g}", t["position"] + 1])
        header = ["configuration", "req/s", "p50 ms", "p95 ms", "run on its server"]
        lines += ["", "The sweep's ten best (within the goal):", "", table(header, rows)]
        if variants := cores_rows(swept["trials"]):
            rows = [[t["config"]["decode_threads"] or "one per core", _fig(t), f"{t['p95_ms']:g}"] for t in variants]
            header = ["decode threads", "req/s (p50 ms)", "p95 ms"]
            lines += ["", "The sweep's best with each decode pool:", "", table(header, rows)]
    return [*lines, ""]


def cores_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep's runs of its best configuration under each decode pool (none in a check saved before it was
    tuned): the one configuration served more than once when that setting is set aside."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for t in trials:
        rest = {k: v for k, v in (t.get("config") or {}).items() if k not in tune_space.CORES_DIMENSIONS}
        groups.setdefault(json.dumps(rest, sort_keys=True), []).append(t)
    return next((ts for ts in groups.values() if len(ts) > 1 and "decode_threads" in (ts[0].get("config") or {})), [])


def bench_section(
    result: dict[str, Any] | None, plots: Path, rel: str, cpu: str | None, redraw: bool = True
) -> list[str]:
    """The section as `make bench` shows the last check, its plot drawn again from it (``redraw`` False: kept, for
    results rebuilt from tables), said to be from another machine when it is."""
    try:
        png = plots / "tuning.png"
        drawn = result is not None and (plot_sweep(result, png) if redraw else png.exists())
        lines = section(result, f"{rel}/tuning.png" if drawn else None)
    except Exception as exc:  # a hand-edited file: the rest of BENCHMARKS.md is still written
        drawn, lines = False, [*section(None, None), f"(The saved check could not be read: {type(exc).__name__})"]
    if not drawn:
        (plots / "tuning.png").unlink(missing_ok=True)
    if result and drawn and result["hardware"].get("cpu") != cpu:
        lines[1:1] = ["", f"**Measured on {result['hardware'].get('cpu')}, not on this run's CPU.**"]
    return lines


def _fig(trial: dict[str, Any]) -> str:
    if trial["error"]:
        return trial["error"][:60]
    failures = f", {trial['failures']} errors" if trial["failures"] else ""
    return f"{trial['req_per_s']} ({trial['p50_ms']:g}{failures})"


def plot_sweep(result: dict[str, Any], path: Path) -> bool:
    """req/s against p95 for every configuration of the sweep within the goal, the tuned one marked."""
    served = [t for t in (result["sweep"] or {}).get("trials", []) if t["qualified"]]
    chosen = {"sweep's best run": ((result["sweep"] or {}).get("best"), "D", "red"),
              "tuned": (result["tune"]["chosen"], "*", "gold")}  # fmt: skip
    marks = [(f"{name}: {c['label']}", next((t for t in served if t["label"] == c["label"]), None), marker, colour)
             for name, (c, marker, colour) in chosen.items() if c]  # fmt: skip
    title = f"Sweep of the tuner's space ({result['hardware'].get('cpu')}, {result['goal']})"
    return plot_tuning(served, lambda t: t["config"]["backend"], marks, title, path)


def load(path: Path, key: str | None = None) -> dict[str, Any] | None:
    """A saved check of this FORMAT (``key``: the one a bench's results.json holds there), or None if there is none
    or it cannot be read (`make bench` goes on)."""
    try:
        result = json.loads(path.read_text())
        result = result.get(key) if key else result
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return result if isinstance(result, dict) and result.get("format") == FORMAT else None


def write_benchmarks(results: dict[str, Any], markdown: Path, out: Path, plots: Path | None = None) -> None:
    """BENCHMARKS.md from the bench's ``results`` with the last tune-check (OUT/tuning.json, else ``results``'s, else
    the previous results.json's): its rows end the targets table, its section the report."""
    plots = plots or markdown.parent / "docs" / "bench"
    plots.mkdir(parents=True, exist_ok=True)
    fresh = load(out / "tuning.json")  # a check of its own: drawn, even over results rebuilt from tables
    # Else the one the results carry, else the one the report held before this run (a tune-check is run apart).
    results["tuning"] = tuning = fresh or results.get("tuning") or load(plots / "results.json", "tuning")
    rows: list[Target] = []
    with contextlib.suppress(Exception):  # a hand-edited tune-check file: its section says so
        rows = targets(tuning) if tuning else []
    rel = os.path.relpath(plots, markdown.parent)
    redraw = bool(fresh) or not results.get("rebuilt")
    write_report(
        results, markdown, out, plots, (rows, bench_section(tuning, plots, rel, results["hardware"].get("cpu"), redraw))
    )


def write_markdown(markdown: Path, plots: Path, out: Path) -> bool:
    """``markdown`` rewritten from the bench's results.json beside the plots, with the check saved in ``out``
    (tuning.json); False, nothing written, without one (`make bench` shows the check)."""
    if not (bench := plots / "results.json").exists():
        return False
    write_benchmarks(json.loads(bench.read_text()), markdown, out, plots)
    return True


def main(argv: list[str] | None = None) -> int:
    import argparse

    from fastinfer.cli import tune_arguments
    from load_tests.tuning.__main__ import interrupt_on_signals, parse

    parser = argparse.ArgumentParser(prog="python -m load_tests.tuning.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    tune_arguments(parser)
    parser.add_argument("--rounds", type=int, default=2, help="head-to-head rounds of each (default: 2)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--plots", type=Path, default=Path("docs/bench"), help="where BENCHMARKS.md's PNGs go")
    args, wanted = parse(parser, argv, "tune-check")
    if not wanted:
        return 1
    goal = Goal(args.goal, args.clients, args.p95_ms)
    where, saved = args.out / "tuning", args.out / "tuning.json"
    command = shlex.join(["python", "-m", "load_tests.tuning.check", *(sys.argv[1:] if argv is None else argv)])
    about = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware.probe(),
        "goal": goal.describe(),
        "backends": wanted,
        "seconds": args.seconds,
    }
    estimate = sweep_estimate_s(wanted, hardware.cpu_count(), goal, args.seconds)
    print(f"tune-check: the tune (<= {args.budget / 60:g} min), then the sweep (~{estimate / 60:.0f} min), "
          f"then the head to head", file=sys.stderr)  # fmt: skip

    def save(result: dict[str, Any]) -> None:
        files.write_atomically(saved, json.dumps(result | about, indent=2))

    interrupt_on_signals()
    try:
        tuner = tune(goal, args.budget, args.seconds, where / "tune-runs", wanted)
        tune_s = tuner.elapsed()
        save(sweep_result(tuner, tune_s, None))
        files.write(tuner, command, where / "tuned.json")  # its report beside it; no server reads this file
        swept = sweep(goal, args.seconds, where / "sweep-runs", wanted,
                      after_each=lambda s: save(sweep_result(tuner, tune_s, s)))  # fmt: skip
        result = compare(tuner, tune_s, swept, args.rounds, save=save) | about
        save(result)
    except KeyboardInterrupt:
        print(f"tune-check: interrupted; every server it started was stopped; what was measured is in {saved}",
              file=sys.stderr)  # fmt: skip
        return 130
    print("\n".join(verdict(result)))
    if not write_markdown(args.markdown, args.plots, args.out):
        print(f"wrote {saved}; no bench results in {args.plots}: `make bench` shows the check in {args.markdown}")
    else:
        png = args.plots / "tuning.png"
        print(f"wrote {saved}{f', {png}' if png.exists() else ''} and {args.markdown} with its tuning section")
    return 0


if __name__ == "__main__":
    sys.exit(main())
