"""What ``fastinfer tune`` leaves: the tuned file the server reads (fastinfer/catalog/tuned.py), and beside
it a report (report.md, report.json) with a plot of every configuration tried (tuned.png)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from fastinfer.catalog import tune_space
from fastinfer.catalog import tuned as tuning
from fastinfer.common import hardware
from fastinfer.measure.plots import plot_tuning, table
from load_tests.tuning.search import Search, Trial


def tuned_settings(best: Trial) -> dict[str, str]:
    """The chosen configuration's settings, without those that only restate the table or the rule."""
    return tune_space.written(best.config.settings())


def tuned_file(search: Search, best: Trial, command: str) -> dict[str, Any]:
    from fastinfer.catalog.backends import SPECS

    served = sorted({t.config.backend for t in search.trials})
    models = [name for backend in served for name in SPECS[backend].model_names()]
    return {
        "format": tuning.FORMAT,
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "goal": search.goal.describe(),
        "settings": tuned_settings(best),
        "chosen": best.as_dict(),
        "decisions": search.decisions,
        "fingerprint": {**tuning.machine_fingerprint(), "models": tuning.model_tags(models)},
    }


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one step: a reader sees the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        # "x": a new file (O_EXCL), never through a link planted at that name; the usual mode (umask), so that
        # a server running as another user reads it
        with tmp.open("x", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except FileExistsError:  # someone else's file at a random name: left alone
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def report(search: Search, best: Trial | None, command: str) -> dict[str, Any]:
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "hardware": hardware.probe(),
        "goal": search.goal.describe(),
        "budget_s": search.budget_s,
        "elapsed_s": round(search.elapsed(), 1),
        "seconds_per_run": search.seconds,
        "in_process": search.figures,
        "dropped": search.dropped,
        "trials": [t.as_dict() for t in search.trials],
        "chosen": best.as_dict() if best else None,
        # which row it is: three rounds of one configuration can read the same
        "chosen_trial": next((i for i, t in enumerate(search.trials) if t is best), None),
        "decisions": search.decisions,
        "skipped": search.skipped,
    }


def markdown(result: dict[str, Any], plot: str | None) -> str:
    hw = result["hardware"]
    chosen = result["chosen"]
    lines = [
        "# fastinfer tune",
        "",
        f"`{result['command']}` on {result['date']}: {hw.get('cpu')}, {hw.get('cores')} cores usable "
        f"({', '.join(hw.get('isa') or []) or 'no AVX2'}); goal {result['goal']}; {result['elapsed_s']:g} s of a "
        f"{result['budget_s']:g} s budget, {result['seconds_per_run']:g} s per load run (locust, the benchmark "
        "pool, cache bypassed).",
        "",
        f"**Chosen: {chosen['label']}.** Decode pool: {decode_pool(chosen['config']['decode_threads'])}."
        if chosen
        else "**Nothing served: no configuration to choose.**",
        "",
    ]
    if plot:
        lines += [f"![every configuration tried]({plot})", ""]
    trials = [[t["stage"], t["label"] + " ★" * (i == result.get("chosen_trial")),
               *([t["req_per_s"], f"{t['p50_ms']:g}", f"{t['p95_ms']:g}", t["failures"]] if not t["error"]
                 else ["–", "–", "–", t["error"][:120]])] for i, t in enumerate(result["trials"])]  # fmt: skip
    lines.append(table(["stage", "configuration", "req/s", "p50 ms", "p95 ms", "errors"], trials))
    lines += ["", "## Why", ""] + [f"- {d}" for d in result["decisions"]]
    lines += ["", "## In process (stage 1: what decided which backends were served)", ""]
    backends = [[name, f"{f['ceiling_req_per_s']:.1f}", f"{f['latency_ms']:.1f}", result["dropped"].get(name, "yes")]
                for name, f in result["in_process"].items()]  # fmt: skip
    lines.append(table(["backend", "ceiling req/s", "single photo ms", "served?"], backends))
    if result["skipped"]:
        lines += ["", "Not tried (the budget ran out): " + "; ".join(result["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def decode_pool(threads: int) -> str:
    return f"{threads} decode threads" if threads else "a decode thread per core"


def plot(result: dict[str, Any], path: Path) -> bool:
    """Throughput against p95 for every configuration served, the chosen one marked."""
    served = [t for t in result["trials"] if not t["error"] and t["requests"]]
    picked = result.get("chosen_trial")  # its row: three rounds of one configuration can read the same
    best = result["trials"][picked] if picked is not None and result["trials"][picked] in served else None
    title = f"fastinfer tune: {result['goal']} ({result['hardware'].get('cpu')})"
    return plot_tuning(served, lambda t: t["stage"], [("chosen", best, "*", "gold")], title, path, named=True)


def report_path(target: Path, failed: bool = False) -> Path:
    """report.md beside the tuned file (failed-report.md for a tune that chose nothing, so that the
    report explaining the tuned file in force stays)."""
    return target.parent / ("failed-report.md" if failed else "report.md")


def plot_path(target: Path) -> Path:
    return target.parent / "tuned.png"


def write(search: Search, command: str, target: Path) -> Path | None:
    """The report always; the tuned file (``target``) only when a configuration was chosen, written last.
    Returns the tuned file written, or None."""
    best = search.chosen
    result = report(search, best, command)
    report_md = report_path(target, failed=best is None)
    report_md.parent.mkdir(parents=True, exist_ok=True)
    drawn = best is not None and plot(result, plot_path(target))
    write_atomically(report_md.with_suffix(".json"), json.dumps(result, indent=2))
    write_atomically(report_md, markdown(result, plot_path(target).name if drawn else None))
    if best is None:
        return None
    write_atomically(target, json.dumps(tuned_file(search, best, command), indent=2))
    return target
