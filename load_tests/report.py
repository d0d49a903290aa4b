"""BENCHMARKS.md, its plots and its targets (load_tests/targets.py), from one results.json of ``python -m load_tests``.
What each figure means and how each verdict is judged is written once, in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastinfer.measure.plots import plot_latency, plot_served, plot_stages, plot_throughput, table
from fastinfer.measure.profile import Ceiling, best_ceiling, in_process_latency_ms
from load_tests.targets import _costs, _run, _share, served_splits, targets

DOCS = "docs/benchmarks.md"
NOISE_CORES = 0.2  # cores busy elsewhere (or stolen) during a run from which the report says so
# Published in-process throughput per core for ResNet-50 (OpenVINO's benchmark data, MLPerf Inference).
ANCHORS = {
    "openvino-int8": "Xeon with AMX ~170–200; AVX-512 VNNI without AMX ~50–60",
    "openvino": "BF16 on Xeon with AMX ~70–110; FP32 ~14–17",
    "onnx-int8": "ORT default CPU EP on a Xeon with AMX ~26", "onnx": "FP32 ~14–17", "pytorch": "FP32 ~14–17",
}  # fmt: skip


Cell = str | Callable[[dict[str, Any]], Any]  # a format string for the row's dict, or a function of it


def _columns(columns: dict[str, Cell], items: Iterable[dict[str, Any]]) -> str:
    """A table with one row per item and one cell per column (its header → the item's cell)."""
    cells = [[c.format_map(item) if isinstance(c, str) else c(item) for c in columns.values()] for item in items]
    return table(list(columns), cells)


def _section(title: str, *blocks: str) -> list[str]:
    return [f"## {title}", *(line for block in blocks for line in ("", block)), ""]


def render_targets(rows: list[dict[str, Any]]) -> str:
    """The one renderer of the targets: BENCHMARKS.md's first table, from results.json's rows."""
    cells = [[r["name"], r["figure"], r["goal"], f"**{r['verdict']}**", r["machine"]] for r in rows]
    return table(["target", "measured", "goal", "verdict", "machine"], cells)


def _served_section(results: dict[str, Any], rel: str) -> list[str]:
    if not (splits := served_splits(results)):
        return []
    causes = next((list(s["causes"]) for s in splits if s["causes"]), [])
    pool: dict[str, Cell] = {"decode threads": lambda s: "—" if s["decode_threads"] is None
                             else s["decode_threads"] or "one per core"}  # fmt: skip
    if any(s["scheduling"] for s in splits):  # a run while FASTINFER_SCHEDULING existed (removed) recorded it
        pool = {"scheduling (decode threads)": lambda s: f"{s['scheduling']} ({s['decode_threads'] or 'one per core'})"
                if s["scheduling"] else "—"}  # fmt: skip
    columns: dict[str, Cell] = {
        "backend": "`{backend}`", "engine in": lambda s: s["placement"] + (
            f" (placement step, round {s['run_round']})" if s["run_round"] else ""),
        **pool, "users": "{users}", "served req/s": "{req_per_s}",
        "ceiling req/s (decode + inference CPU ms)": lambda s: "{ceiling_req_per_s} ({decode_ms:g} + {inference_ms:g} "
        "ms at b{batch:g}".format_map(s) + "".join(f", {p} from the run" for p in s["base_from_run"]) + ")",
        "served / ceiling": lambda s: f"**{_share(s['share'])}**",
        "ceiling on the server's cores (cores)": lambda s: "{server_ceiling_req_per_s} ({server_cores:g})".format_map(s)
        if s["server_cores"] else "—", "served / ceiling on the server's cores": lambda s: "**" + _share(
            s["server_share"]) + "**" if s["server_cores"] else "—", "server CPU ms/req": "{server_ms}",
        "beyond decode + inference": "**{beyond_ms:g}**",
        **{c: lambda s, c=c: f"{s['causes'][c]:g}" if c in s["causes"] else "—" for c in causes},
    }  # fmt: skip
    links = {
        'What the ceiling and "beyond" are': "the-ceiling-without-http",
        "on the server's cores": "the-ceiling-on-the-servers-cores",
        "drift": "drift",
        "the placement step": "the-placement-step",
    }
    how = ", ".join(f"[{text}]({DOCS}#{anchor})" for text, anchor in links.items()) + "."
    return _section("Served vs the engine's ceiling", how, _columns(columns, splits))  # fmt: skip


def _profile_section(results: dict[str, Any], rel: str) -> list[str]:
    if not (profile := results.get("profile")):
        return []
    by_size: dict[str, dict[tuple[str, int], float]] = {}
    for c in profile.get("ceilings_by_size", []):
        by_size.setdefault(c["size_class"], {})[(c["backend"], c["batch"])] = c["req_per_s"]
    columns: dict[str, Cell] = {
        "backend": "{backend}", "batch": "{batch}", "CPU ms / request": "{cpu_ms_per_request}",
        "ceiling req/s": "{req_per_s}", "binding stage": lambda c: f"{c['binding_stage']} "
        f"({c['shares'][c['binding_stage']]:.0%})", "HTTP ms": "{http_ms:g} ({http_source})",
        **{f"all {k}": lambda c, k=k: by_size[k].get((c["backend"], c["batch"]), "—") for k in by_size},
    }  # fmt: skip
    stages = {"stage": "{stage}", "detail": "{detail}", "CPU ms": "{cpu_ms:.2f}", "wall ms": "{wall_ms:.2f}"}
    pool = ", ".join(f"{n} {cls}" for cls, n in profile.get("pool", {}).items()) or "—"
    # In-process images/s per core (wall time at all cores' threads ÷ cores), beside the published anchors.
    wall = {s["detail"]: s["wall_ms"] for s in profile["stages"] if s["stage"] == "inference"}
    per = {b: {n: round(1000 / wall[f"{b} b{n}"] / profile["cores"], 1) for n in (1, 8) if f"{b} b{n}" in wall}
           for b in dict.fromkeys(d.rsplit(" b", 1)[0] for d in wall)}  # fmt: skip
    cores = [[f"`{b}`", p.get(1, "—"), p.get(8, "—"), ANCHORS.get(b, "—")] for b, p in per.items()]
    fidelity: dict[str, Cell] = {
        "backend": "`{backend}`", "runs at": lambda f: f.get("precision", "—"), "top-1": "{top1_agreement:.1%}",
        "top-5": "{top5_overlap:.1%}", "cosine": "{cosine:.5f}", "max abs logit error": "{max_abs_error:.3g}",
        "gate": lambda f: f.get("gate", "—") + (" passed" if f.get("gate_passed") else " FAILED" * bool(f.get("gate"))),
    }  # fmt: skip
    return [
        *_section("Where the time goes (in-process profile)", f"![CPU per request by stage]({rel}/profile.png)",
                  _columns(stages, profile["stages"]),
                  f"Ceilings on {profile['cores']} cores, pool {pool} ([how]({DOCS}#the-profiles-ceilings)):",
                  _columns(columns, profile["ceilings"])),
        *_section("Images/s per core, in process", table(["backend", "b1 img/s/core", "b8 img/s/core",
                                                            "published (img/s/core)"], cores)),
        *(_section("Fidelity (vs FP32 PyTorch, 36 real photos)", _columns(fidelity, profile["fidelity"]))
          if profile.get("fidelity") else []),
    ]  # fmt: skip


def _http_section(results: dict[str, Any], rel: str) -> list[str]:
    if not (costs := results.get("http_cost") or []):
        return []

    client = {(r["backend"], r["users"]): r["cpu"]["ms_per_request"]["load_generator"] for r in results["runs"]
              if r["scenario"] == "inference" and r.get("cpu")}  # fmt: skip
    columns: dict[str, Cell] = {
        "backend": "`{backend}`", "users": "{users}", "front CPU ms/req": "{front_cpu_ms}",
        "runner CPU ms/req": "{runner_cpu_ms}", "in-process decode+preprocess+postprocess": "{front_stages_ms}",
        "in-process inference ms/img": "{inference_ms} (b{batch})", "front overhead": "{front_overhead_ms}",
        "runner overhead": "{runner_overhead_ms}", "HTTP cost ms/req": "**{http_ms}**",
        "mean batch seen": lambda h: h.get("mean_batch") or "—",
        "load generator CPU ms/req": lambda h: client.get((h["backend"], h["users"]), "—"),
    }  # fmt: skip
    blocks = [f"[How it is measured]({DOCS}#the-http-path).", _columns(columns, costs)]

    def who(r: dict[str, Any]) -> str:
        return f"{r['scenario']} `{r['backend']}` {r['users']} users"

    every = [*results.get("runs", []), *results.get("placement", [])]
    if missed := [f"{who(r)}: {n} process(es)" for r in every if (n := (r.get("cpu") or {}).get("missed_processes"))]:
        blocks.append(f"The CPU reading before these runs missed a server process: {'; '.join(missed)}.")
    busy = [(r, (r.get("cpu") or {}).get("cores_busy", {})) for r in results.get("runs", [])]
    if noisy := [f"{who(r)}: {b['rest_of_machine']:g} cores busy elsewhere, steal {b['steal']:g}" for r, b in busy
                 if max(b.get("rest_of_machine", 0), b.get("steal", 0)) >= NOISE_CORES]:  # fmt: skip
        blocks.append(f"Other work shared these cores during some runs: {'; '.join(noisy)}.")
    return _section("The HTTP path, measured", *blocks)


def _per_image(part: str) -> Cell:
    return lambda r: round(r["cpu"]["ms_per_request"][part] / r["images"], 2) if r.get("cpu") else "—"


def _batch_section(results: dict[str, Any], rel: str) -> list[str]:
    """Images/s and CPU per image of the batch API beside the single-image run of the same backend and users."""
    step, batch, title = results.get("batch"), _run(results, "batch"), "Batch API (`POST /classify/batch`)"
    if batch is None:
        return _section(title, f"Not measured in this run: {step.get('skipped', 'no batch run')}.") if step else []
    n, single = batch["images_per_request"], _run(results, "inference", backend=batch["backend"], users=batch["users"])
    rows = [r | {"sent": label, "images": per} for label, r, per in
            ((f"batches of {n}", batch, n), ("one per request", single, 1)) if r is not None]  # fmt: skip
    columns: dict[str, Cell] = {
        "requests": "{sent}", "backend": "`{backend}`", "users": "{users}",
        "images/s": lambda r: r.get("images_per_s", round(r["req_per_s"] * (1 - r["error_rate"]), 1)),
        "failed": lambda r: f"{r['failures']} of {r['requests']}" + (
            f" (first: {r['failure_example']})" if r.get("failure_example") else ""),
        "CPU ms per image: front": _per_image("front"), "runner": _per_image("runner"),
        "load generator": _per_image("load_generator"),
    }  # fmt: skip
    return _section(title, _columns(columns, rows))


def _sequential(results: dict[str, Any], rel: str) -> list[str]:
    if not (seq := results.get("sequential", [])):
        return []
    base, costs = next((s["median_ms"] for s in seq if s["backend"] == "pytorch"), None), _costs(results)
    in_process = {s["backend"]: in_process_latency_ms(costs, s["backend"]) if costs else None for s in seq}
    columns: dict[str, Cell] = {
        "backend": "{backend}", "median ms": "{median_ms}", "p95 ms": "{p95_ms}",
        "vs pytorch": lambda s: f"{base / s['median_ms']:.2f}× faster" if base else "—",
        "p50 ÷ in process": lambda s: f"{s['median_ms'] / ms:.2f}×" if (ms := in_process[s["backend"]]) else "—",
        "decode+preprocess ms (server p50)": lambda s: round(s["stages_p50_ms"]["decode"]
                                                             + s["stages_p50_ms"]["preprocess"], 2),
        "inference ms": lambda s: s["stages_p50_ms"]["inference"],
    }  # fmt: skip
    return _section("Sequential latency (one client, one 1.5 MP photo)", f"![stages]({rel}/stages.png)",
                    _columns(columns, seq))  # fmt: skip


def percent_of_ceiling(results: dict[str, Any], run: dict[str, Any]) -> str:
    """An inference run's req/s as a % of its backend's ceiling (at its measured HTTP cost's batch, else its best)."""
    mine = [Ceiling(**c) for c in results.get("profile", {}).get("ceilings", []) if c["backend"] == run["backend"]]
    http = next((h["batch"] for h in results.get("http_cost", []) if h["backend"] == run["backend"]), None)
    ceiling = next((c for c in mine if c.batch == http), None) or best_ceiling(mine, run["backend"])
    if run["scenario"] != "inference" or ceiling is None:
        return "—"
    return f"{100 * run['req_per_s'] / ceiling.req_per_s:.0f}%" + " (est.)" * (ceiling.http_source != "measured")


def _load(results: dict[str, Any], rel: str) -> list[str]:
    columns: dict[str, Cell] = {
        "scenario": "{scenario}", "backend": "{backend}", "users": "{users}", "req/s": "{req_per_s}",
        "p50 ms": "{p50_ms}", "p95 ms": "{p95_ms}", "p99 ms": "{p99_ms}", "errors": "{failures} ({error_rate:.1%})",
        "cache hits": lambda r: f"{r['cache_hit_share']:.0%}" if "cache_hit_share" in r
        else "— (no cache)" if r["scenario"] == "bare" else "0% (bypassed)",
        "% of ceiling incl. measured HTTP": lambda r: percent_of_ceiling(results, r),
        "CPU ms / req: front, runner, client": lambda r: "{front:g}, {runner:g}, {load_generator:g}".format_map(
            r["cpu"]["ms_per_request"]) if r.get("cpu") else "—",
    }  # fmt: skip
    title = "Load (locust, closed loop, 60-image pool incl. ~8 MP phone photos, cache bypassed)"
    plots = f"![throughput]({rel}/throughput.png) ![latency]({rel}/latency.png)"
    return _section(title, plots, _columns(columns, results["runs"]))


def _study(results: dict[str, Any], rel: str) -> list[str]:
    if not (study := results.get("study")):
        return []
    columns: dict[str, Cell] = {
        "backend": "`{backend}`", "front workers": "{front_workers}", "runner workers": "{runner_workers}",
        "batching": lambda s: "on" if s["batching"] else "off", "req/s": "{req_per_s}", "p50 ms": "{p50_ms}",
        "p99 ms": "{p99_ms}", "errors": "{failures}",
    }  # fmt: skip
    return _section("Workers and batching", _columns(columns, study))


def write_markdown(results: dict[str, Any], path: Path, out: Path, plots: Path) -> None:
    """BENCHMARKS.md at ``path``, its plots and results.json in ``plots``: ``results`` with the target rows added."""
    plots.mkdir(parents=True, exist_ok=True)
    results["targets"] = [asdict(t) for t in targets(results)]
    splits = served_splits(results)
    if not results.get("rebuilt"):  # results rebuilt from tables: the plots stay the run's own
        plot_throughput(results["runs"], plots / "throughput.png")
        plot_latency(results["runs"], plots / "latency.png", users=10)
        if results.get("sequential"):
            plot_stages(results["sequential"], plots / "stages.png")
        if (out / "profile.png").exists():
            (plots / "profile.png").write_bytes((out / "profile.png").read_bytes())
        if splits:
            plot_served(splits, plots / "served.png")
    rel, hw = os.path.relpath(plots, path.parent), results["hardware"]
    about = (
        f"{results['date']} · **{hw['cpu']}**, {hw['cores']} cores, {hw['os']}; ISA: {', '.join(hw['isa']) or 'none'}; "
        f"CUDA: {hw['cuda']}; MPS: {hw['mps']}; Neural Engine: {hw['neural_engine']} · `{results['command']}`"
    )
    note = f" · {results['note']}" if results.get("note") else ""
    md = [
        f"# FastInfer benchmarks\n\n{about}{note} · [how to read it]({DOCS})\n",
        *_section("Targets", render_targets(results["targets"])),
        f"![served vs ceiling]({rel}/served.png)\n" if splits else f"![throughput]({rel}/throughput.png)\n",
        *(line for part in (_served_section, _profile_section, _http_section, _batch_section, _sequential, _load,
                            _study) for line in part(results, rel)),
    ]  # fmt: skip
    text = "\n".join(md) + "\n"  # a picture only where its plot exists (results rebuilt from tables draw none)
    path.write_text(re.sub(r"!\[[^]]*\]\(([^)]+)\)", lambda m: m[0] if (path.parent / m[1]).exists() else "", text))
    (plots / "results.json").write_text(json.dumps(results, indent=2) + "\n")
