"""Plots for the benchmarks (matplotlib, written as PNG): where people would rather look than read."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any


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


def plot_accuracy(rows: list[dict[str, Any]], path: Path, family: str, images: int, speed_source: str = "") -> None:
    """Top-1 accuracy against the req/s ``make bench`` served, per backend, where both were measured; else top-1
    and top-5 per backend as bars, titled with why there is no speed."""
    plt = pyplot()
    measured = [r for r in rows if r.get("top1") is not None]
    paired = [r for r in measured if r.get("req_per_s")]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    title = f"{family}: accuracy on {images} of your labelled photos"
    if paired:
        for r in paired:
            ax.scatter(r["req_per_s"], r["top1"] * 100, s=40)
            ax.annotate(f"{r['backend']} ({r['precision']})", (r["req_per_s"], r["top1"] * 100),
                        textcoords="offset points", xytext=(5, 4), fontsize=8)  # fmt: skip
        alone = [f"{r['backend']} {r['top1']:.1%}" for r in measured if not r.get("req_per_s")]
        ax.set_xlabel("requests / s served by `make bench` (10 clients, cache bypassed)"
                      + (f"\nnot benchmarked, top-1: {', '.join(alone)}" if alone else ""))  # fmt: skip
        ax.set_ylabel("top-1 accuracy (%)")
        ax.set_title(f"{title}, against speed")
        ax.grid(alpha=0.3)
    else:
        names = [f"{r['backend']}\n({r['precision']})" for r in measured]
        x = range(len(names))
        for shift, key in ((-0.2, "top1"), (0.2, "top5")):
            bars = ax.bar([i + shift for i in x], [r[key] * 100 for r in measured], 0.4, label=key[:3] + "-" + key[3])
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(list(x), names, fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 105)
        why = speed_source.removeprefix("none: ") or "no `make bench` result of this machine and family"
        # Wrapped here: matplotlib's wrap=True measures the text as mathtext whatever text.parse_math says.
        ax.set_title(f"{title}\n" + textwrap.fill(f"(not set against speed: {why})", 100), fontsize=9)
        ax.legend(fontsize=8)
    save(fig, path)
