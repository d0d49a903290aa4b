"""Plots for the benchmarks (matplotlib, written as PNG): where people would rather look than read; and the one
Markdown table every report prints."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    """A Markdown table: ``header``, then one line per row, each cell as ``str`` makes it on one line, its ``|``
    escaped (an error message in a cell cannot break the table)."""

    def cell(value: Any) -> str:
        return " ".join(str(value).splitlines()).replace("|", r"\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows])


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), imported when first drawn. Every string is
    drawn as typed: names come from data (a server's, a results file's), where ``$`` would be mathtext."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"text.parse_math": False, "text.usetex": False})
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> None:
    """Lay out, write as PNG (its folder made if need be) and free a finished figure."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def plot_profile(result: dict[str, Any], path: Path) -> None:
    """Stacked CPU ms per request, by stage, for each backend at its best batch size."""
    plt = pyplot()
    best: dict[str, dict[str, Any]] = {}
    for c in result["ceilings"]:
        if c["backend"] not in best or c["req_per_s"] > best[c["backend"]]["req_per_s"]:
            best[c["backend"]] = c
    names = list(best)
    stages = ["decode", "preprocess", "postprocess", "http", "inference"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    left = [0.0] * len(names)
    measured = all(best[n].get("http_source") == "measured" for n in names)
    for stage in stages:
        widths = [best[n]["shares"].get(stage, 0) * best[n]["cpu_ms_per_request"] for n in names]
        label = f"http ({'measured' if measured else 'estimated'})" if stage == "http" else stage
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, n in enumerate(names):
        ax.text(left[i], i, f"  {best[n]['req_per_s']} req/s ceiling (b{best[n]['batch']})", va="center", fontsize=8)
    size = {c["size_class"] for c in best.values()}
    ax.set_xlabel(
        "CPU ms per request (the benchmark pool's mix of photos)" if size == {"pool"} else "CPU ms per request"
    )
    ax.set_title(f"Where a request's CPU goes, and the ceiling on {result['cores']} cores")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max(left) * 1.6)
    save(fig, path)


def plot_throughput(runs: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend in sorted({r["backend"] for r in runs if r["scenario"] == "inference"}):
        mine = sorted(
            (r for r in runs if r["backend"] == backend and r["scenario"] == "inference"), key=lambda r: r["users"]
        )
        ax.plot([r["users"] for r in mine], [r["req_per_s"] for r in mine], marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("requests / s (cache bypassed)")
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_latency(runs: list[dict[str, Any]], path: Path, users: int) -> None:
    plt = pyplot()
    mine = [r for r in runs if r["scenario"] == "inference" and r["users"] == users]
    if not mine:
        return
    names = [r["backend"] for r in mine]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.27
    for i, key in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        ax.bar([x + (i - 1) * width for x in range(len(names))], [r[key] for r in mine], width, label=key[:3])
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("ms")
    ax.set_title(f"Latency percentiles at {users} users")
    ax.legend()
    save(fig, path)


def plot_stages(sequential: list[dict[str, Any]], path: Path) -> None:
    """Per-stage stacked bars of the server-side timings of sequential requests."""
    plt = pyplot()
    stages = ["read", "cache", "decode", "preprocess", "inference"]
    names = [s["backend"] for s in sequential]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * len(names)
    for stage in stages:
        heights = [s["stages_p50_ms"].get(stage, 0) for s in sequential]
        ax.bar(names, heights, bottom=bottom, label=stage)
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    ax.set_ylabel("ms (p50 of each stage, server side)")
    ax.set_title("Where a single request's time goes")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=15)
    save(fig, path)


def plot_served(splits: list[dict[str, Any]], path: Path) -> None:
    """Per served run: the CPU per request of decode and inference, then the server's CPU beyond them by cause."""
    plt = pyplot()
    names = [
        f"{s['backend']} ({'in front' if s['placement'] == 'front worker' else 'runner'}"
        + (f", {s['scheduling']}" if s.get("scheduling") else "")
        + (f", step {s['run_round']})" if s.get("run_round") else ")")
        for s in splits
    ]
    parts = {
        "decode + preprocess (in process, or the run's if less)": [s["decode_ms"] for s in splits],
        "inference at the batch formed (likewise)": [s["inference_ms"] for s in splits],
    }
    for cause in splits[0]["causes"]:  # a negative cause (CPU the threads did not tell apart) draws nothing
        parts[cause] = [max(0.0, s["causes"].get(cause, 0.0)) for s in splits]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 2.8))
    left = [0.0] * len(names)
    for label, widths in parts.items():
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for i, s in enumerate(splits):
        ax.text(left[i], i, f"  {s['req_per_s']} req/s = {s['share']:.0%} of {s['ceiling_req_per_s']}", va="center",
                fontsize=8)  # fmt: skip
    users = sorted({s["users"] for s in splits})
    ax.set_xlabel(
        f"server CPU ms per request ({', '.join(map(str, users))} users, cache bypassed;\n"
        "a cause below zero (CPU the threads did not tell apart) is not drawn)"
    )
    ax.set_title("Served vs the engine's ceiling: where the CPU beyond decode and inference goes")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=7)
    ax.set_xlim(0, max(left) * 1.55)
    save(fig, path)


def plot_tuning(
    points: list[dict[str, Any]],
    group: Callable[[dict[str, Any]], str],
    marks: list[tuple[str, dict[str, Any] | None, str, str]],
    title: str,
    path: Path,
    named: bool = False,
) -> bool:
    """req/s against p95 of configurations served, one colour per ``group``, each mark (legend, point, marker, colour)
    drawn over its point; ``named``: every point's label beside it. False, and nothing drawn, without points."""
    if not points:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(map(group, points)):
        mine = [t for t in points if group(t) == name]
        ax.scatter([t["p95_ms"] for t in mine], [t["req_per_s"] for t in mine], label=name, s=36, alpha=0.8)
    for t in points if named else []:
        ax.annotate(t["label"], (t["p95_ms"], t["req_per_s"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    for legend, t, marker, colour in marks:
        if t is not None:
            ax.scatter([t["p95_ms"]], [t["req_per_s"]], marker=marker, s=280, c=colour, edgecolors="black",
                       label=legend, zorder=3)  # fmt: skip
    ax.set(xlabel="p95 latency, ms", ylabel="req/s", title=title)
    if named:
        ax.margins(x=0.35, y=0.1)  # room for the labels right of the points
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, path)
    return True


FRONTIER_COLOURS = {True: "tab:blue", False: "tab:red", None: "0.45"}  # within the limit, over it, no drop known


def plot_frontier(
    points: list[dict[str, Any]], path: Path, title: str, xlabel: str, limit: tuple[float, str] | None = None
) -> None:
    """Accuracy against speed, one point per backend: top-1 with its interval (top-5 below where known), the Pareto
    front dashed, the fastest within the limit ringed, the limit dotted; without speeds, the backends side by side.
    The y axis spans the intervals, not 0 to 100%, so close figures look apart."""
    plt = pyplot()
    panels = [("top1", "top-1")] + ([("top5", "top-5")] if any("top5" in p for p in points) else [])
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 4.6 * len(panels)), squeeze=False)
    timed = any(p.get("images_per_s") for p in points)  # else the backends side by side
    drawn = [p for p in points if p.get("images_per_s")] if timed else points
    untimed = [f"{p['backend']} {p['top1']:.1%}" for p in points if p not in drawn]
    xs = [p["images_per_s"] if timed else i for i, p in enumerate(drawn)]
    for ax, (key, name) in zip(axes[:, 0], panels, strict=True):
        mine = [(x, p) for x, p in zip(xs, drawn, strict=True) if key in p]
        if not mine:
            continue
        for x, p in mine:
            y, low, high = (100 * p[k] for k in (key, f"{key}_low", f"{key}_high"))
            ax.errorbar(x, y, yerr=[[max(0.0, y - low)], [max(0.0, high - y)]], fmt="o", capsize=4, ms=6, zorder=3,
                        color=FRONTIER_COLOURS[p.get("within_limit")])  # fmt: skip
        if key == "top1":
            front = sorted((x, 100 * p["top1"]) for x, p in mine if p.get("on_front"))
            if timed and len(front) > 1:
                ax.plot(*zip(*front, strict=True), "--", color="0.35", lw=1, zorder=2, label="Pareto front")
            for x, p in mine:
                if p.get("fastest_within_limit"):
                    ax.scatter(x, 100 * p["top1"], s=320, facecolors="none", edgecolors="tab:green", lw=2, zorder=4,
                               label=f"fastest within the limit: {p['backend']}")  # fmt: skip
            if limit is not None:
                ax.axhline(100 * limit[0], ls=":", color="tab:red", lw=1, label=limit[1])
            for within in sorted({p.get("within_limit") for _, p in mine} - {None}, reverse=True):
                ax.errorbar([], [], fmt="o", color=FRONTIER_COLOURS[within],
                            label=f"drop {'within' if within else 'over'} the limit")  # fmt: skip
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, borderaxespad=0)
        lows = [100 * p[f"{key}_low"] for _, p in mine] + ([100 * limit[0]] if limit and key == "top1" else [])
        highs = [100 * p[f"{key}_high"] for _, p in mine]
        pad = max(0.5, (max(highs) - min(lows)) * 0.08)
        ax.set_ylim(max(0.0, min(lows) - pad), min(100.0, max(highs)) + pad)
        if timed:
            ax.set_xlim(0, max(xs) * 1.18)
        else:
            ax.set_xlim(-0.6, len(drawn) - 0.4)
            ax.set_xticks(list(range(len(drawn))), [p["backend"] for p in drawn], fontsize=8)
        ax.set_ylabel(f"{name} accuracy (%), 95% interval")
        ax.grid(alpha=0.3)
        if timed:
            _label(ax, [(x, 100 * p[key], f"{p['backend']} ({p['precision']})" if p.get("precision") else p["backend"])
                        for x, p in mine])  # fmt: skip
    axes[0, 0].set_title(title, fontsize=10)
    # Wrapped here: matplotlib's wrap=True measures the text as mathtext whatever text.parse_math says.
    xlabel += f"; not timed (top-1): {', '.join(untimed)}" if untimed else ""
    axes[-1, 0].set_xlabel(textwrap.fill(xlabel, 110), fontsize=8)
    save(fig, path)


def _label(ax: Any, marks: list[tuple[float, float, str]]) -> None:
    """Each point's name at the nearest of a few places around it, ring by ring, where it covers no name placed before
    and no other point; a name placed farther out gets a thin line to its point."""
    ax.figure.tight_layout()  # the axes where they will be drawn, so that display coordinates hold
    renderer = ax.figure.canvas.get_renderer()
    dots = [ax.transData.transform((x, y)) for x, y, _ in marks]
    sides = [(1, 1, "left", "bottom"), (1, -1, "left", "top"), (-1, 1, "right", "bottom"), (-1, -1, "right", "top"),
             (0, 1.6, "center", "bottom"), (0, -1.6, "center", "top")]  # fmt: skip
    places = [(r * dx, r * dy, ha, va) for r in (7, 20, 36) for dx, dy, ha, va in sides]
    taken: list[Any] = []
    for (x, y, text), dot in zip(marks, dots, strict=True):
        others = [d for d in dots if d is not dot]
        for i, (dx, dy, ha, va) in enumerate([*places, places[0]]):  # nowhere clear: the first place
            far = abs(dx) > 7 or abs(dy) > 12
            note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=8)
            box = note.get_window_extent(renderer).expanded(1.05, 1.15)  # the name's own box, before any line
            mine = 0.0 if far else _gap(box, dot) + 2  # tied by its line, a name need only keep off the others
            clear = not any(box.overlaps(t) for t in taken) and all(_gap(box, d) > mine for d in others)
            note.remove()
            if clear or i == len(places):
                line = {"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if far else None
                ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=8,
                            arrowprops=line)  # fmt: skip
                break
        taken.append(box)


def _gap(box: Any, dot: Any) -> float:
    """Pixels from a point to the nearest edge of a box (0 inside it)."""
    dx = max(box.x0 - dot[0], 0.0, dot[0] - box.x1)
    dy = max(box.y0 - dot[1], 0.0, dot[1] - box.y1)
    return float((dx * dx + dy * dy) ** 0.5)
