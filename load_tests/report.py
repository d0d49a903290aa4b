"""BENCHMARKS.md, its plots and its targets, from one results.json of ``python -m load_tests``: the targets are
rows (:class:`Target`) computed from the results, rendered as BENCHMARKS.md's first table and kept in results.json.
What each figure means and how each verdict is judged is written once, in docs/benchmarks.md."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastinfer.measure.plots import plot_latency, plot_served, plot_stages, plot_throughput
from fastinfer.measure.profile import POOL, POOL_PILLOW, Ceiling, StageCost, best_ceiling, in_process_latency_ms
from fastinfer.measure.profile import served_split as split_of

DOCS = "docs/benchmarks.md"
SINGLE_CLIENT_LIMIT = 1.15  # single-client p50 ÷ in-process decode + preprocess + inference (b1, wall)
CACHE_HIT_VS_BARE = 1.3  # the cache-hit path's req/s ÷ a bare BentoML API's, same body, same run
DEFAULT_VS_ONNX = 3.0  # the default backend's req/s at 10 clients ÷ `onnx`'s, same run
CEILING_SHARE = 90  # % of the engine's ceiling without HTTP, best backend, 10 clients
BEYOND_MS = 3.0  # the server's CPU per request beyond decode and inference, at most
DECODE_SHARE = 0.60  # decode + preprocess of the pool with libjpeg-turbo ÷ with Pillow alone, at most
CACHE_HIT_ABSOLUTE = 400  # the earlier absolute cache-hit target on 2 cores, req/s
NOISE_MS = 1.0  # a cause below −NOISE_MS ms per request: the run is not judged
NOISE_CORES = 0.2  # cores busy elsewhere (or stolen) during a run from which the report says so
VERDICT = ("NOT met", "met")  # by whether the goal was reached
SPEED_UP_TARGETS = (("openvino-int8", "onnx-int8", 1.3), ("openvino", "onnx", 1.6))  # req/s at 10 clients
# Published in-process throughput per core for ResNet-50 (OpenVINO's benchmark data, MLPerf Inference).
ANCHORS = {
    "openvino-int8": "Xeon with AMX ~170–200; AVX-512 VNNI without AMX ~50–60",
    "openvino": "BF16 on Xeon with AMX ~70–110; FP32 ~14–17",
    "onnx-int8": "ORT default CPU EP on a Xeon with AMX ~26", "onnx": "FP32 ~14–17", "pytorch": "FP32 ~14–17",
}  # fmt: skip


@dataclass
class Target:  # one row of BENCHMARKS.md's first table
    name: str
    figure: str  # what was measured
    goal: str
    verdict: str  # "met", "NOT met", "not judged" or "not measured"
    machine: str


def machine(hardware: dict[str, Any]) -> str:
    return f"{hardware.get('cpu', 'this CPU')}, {hardware.get('cores', '?')} cores"


def table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


Cell = str | Callable[[dict[str, Any]], Any]  # a format string for the row's dict, or a function of it
Extra = tuple[Iterable["Target"], list[str]]  # more target rows and lines at the end: the tune-check's


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


def _run(results: dict[str, Any], scenario: str, **match: Any) -> dict[str, Any] | None:
    runs = results.get("runs", [])
    return next((r for r in runs if r["scenario"] == scenario and all(r[k] == v for k, v in match.items())), None)


def _costs(results: dict[str, Any]) -> list[StageCost]:
    return [StageCost(**s) for s in results.get("profile", {}).get("stages", [])]


def best_backend(results: dict[str, Any]) -> str | None:
    """Most req/s at 10 users (else at the most users run; else the fastest sequential backend)."""
    if inference := [r for r in results.get("runs", []) if r["scenario"] == "inference"]:
        most = 10 if any(r["users"] == 10 for r in inference) else max(r["users"] for r in inference)
        return max((r for r in inference if r["users"] == most), key=lambda r: r["req_per_s"])["backend"]
    seq = results.get("sequential") or []
    return min(seq, key=lambda s: s["median_ms"])["backend"] if seq else None


def measured_runs(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per backend, the inference run whose server CPU was read at 10 users (else at the most users run)."""
    runs = [r for r in results.get("runs", []) if r["scenario"] == "inference" and r.get("cpu") and r["requests"]]
    return {b: max((r for r in runs if r["backend"] == b), key=lambda r: (r["users"] == 10, r["users"]))
            for b in dict.fromkeys(r["backend"] for r in runs)}  # fmt: skip


def served_splits(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each backend's measured run, then the placement runs, as profile.ServedSplit."""
    costs, cores = _costs(results), results.get("profile", {}).get("cores", 0)
    if not costs or not cores:
        return []
    runs = [(r, "runner process") for r in measured_runs(results).values()]
    # A placement run is a step's round even where an older results.json did not number it.
    steps = [r for r in results.get("placement", []) if r.get("cpu")]
    runs += [({**r, "round": r.get("round") or 1}, r["placement"]) for r in steps]
    return [asdict(s) for r, where in runs if (s := split_of(costs, cores, r, where)) is not None]


def representative(splits: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per placement, the run of median req/s among its rounds (the lower middle one of an even count)."""
    by = {w: sorted((s for s in splits if s["placement"] == w), key=lambda s: s["req_per_s"]) for w in
          dict.fromkeys(s["placement"] for s in splits)}  # fmt: skip
    return {where: rows[(len(rows) - 1) // 2] for where, rows in by.items()}


def single_client(results: dict[str, Any], backend: str) -> tuple[dict[str, tuple[float, int]], dict[str, list[str]]]:
    """Per placement of ``backend``'s engine: (single-client p50, runs), and why its one client failed in a round."""
    p50s: dict[str, list[float]] = {}
    failed: dict[str, list[str]] = {}
    for row in (r for r in results.get("placement", []) if r.get("backend") == backend):
        alone, where = row.get("sequential"), row.get("placement", "?")
        ms = alone.get("median_ms") if isinstance(alone, dict) else None
        if isinstance(ms, int | float) and not isinstance(ms, bool) and math.isfinite(ms) and ms > 0:
            p50s.setdefault(where, []).append(float(ms))
        elif alone is not None:
            why = alone.get("error") if isinstance(alone, dict) else None
            failed.setdefault(where, []).append(str(why or f"p50 {ms!r}")[:200])
    placed = {where: (statistics.median_high(ms), len(ms)) for where, ms in p50s.items()}
    main = next((row["median_ms"] for row in results.get("sequential", []) if row["backend"] == backend), None)
    if "runner process" not in placed and main is not None:
        placed = {"runner process": (main, 0), **placed}
    return placed, failed


def sound(split: dict[str, Any]) -> bool:
    """Whether a run can carry a verdict: every server process read, nothing more than NOISE_MS below its base."""
    noise = split["beyond_ms"] < -NOISE_MS or any(v < -NOISE_MS for v in split["causes"].values())
    return not split.get("missed_processes") and not noise


def _share(share: float) -> str:
    """A share of the ceiling; to a tenth of a percent near the target, so that 89.6% never reads 90%."""
    return f"{share:.1%}" if abs(100 * share - CEILING_SHARE) <= 0.5 else f"{share:.0%}"


def _runs(n: int) -> str:
    return "sequential step" if not n else "one run" if n == 1 else f"median of {n} runs"


def cache_targets(results: dict[str, Any], where: str) -> list[Target]:
    """The cache-hit path against a bare BentoML API (same body, users and duration), and alone."""
    if not (repeat := _run(results, "repeat")):
        return []
    bare, rps, name = _run(results, "bare"), repeat["req_per_s"], "Cache-hit path vs a bare BentoML API"
    detail = f"{repeat.get('cache_hit_share', 0):.0%} hits, {repeat['failures']} errors"
    detail += f", {repeat['cache_errors']} cache errors" if repeat.get("cache_errors") else ""
    if (runner := (repeat.get("cpu") or {}).get("ms_per_request", {}).get("runner", 0)) >= 1.0:  # a miss decodes
        detail += f", the runner used {runner:g} CPU ms per request: not every request was a hit"
    ok = rps >= CACHE_HIT_ABSOLUTE
    absolute = Target("Cache-hit path, absolute", f"{rps} req/s", f">= {CACHE_HIT_ABSOLUTE} req/s", VERDICT[ok], where)
    goal = f">= {CACHE_HIT_VS_BARE:g}×, all hits, zero errors"
    if not (bare and bare["req_per_s"]):
        return [Target(name, f"no bare baseline; {rps} req/s, {detail}", goal, "not measured", where), absolute]
    ratio = rps / bare["req_per_s"]
    # Only real cache hits count: every request answered, by the cache, and the baseline error-free too.
    met = ratio >= CACHE_HIT_VS_BARE and repeat["failures"] == bare["failures"] == 0
    met = met and repeat.get("cache_hit_share", 0) >= 0.99
    figure = f"{ratio:.2f}× ({rps} vs {bare['req_per_s']} req/s), {detail}"
    return [Target(name, figure, goal, VERDICT[met], where), absolute]


def single_client_target(results: dict[str, Any], where: str) -> list[Target]:
    best, costs = best_backend(results), _costs(results)
    if best not in {s["backend"] for s in results.get("sequential", [])} or not costs:
        return []
    name, goal = f"Single-client p50, best backend (`{best}`)", f"<= {SINGLE_CLIENT_LIMIT:g}× in process"
    if (mine := in_process_latency_ms(costs, best)) is None:
        return [Target(name, "no in-process figure for the photo", goal, "not measured", where)]
    limit = SINGLE_CLIENT_LIMIT * mine
    placed, failed = single_client(results, best)
    figure = "; ".join(f"{w}: {ms:g} ms = {ms / mine:.2f}× ({_runs(n)})" for w, (ms, n) in placed.items())
    figure += "".join(f"; {w}: one client failed in {len(why)} round(s): {'; '.join(why)}" for w, why in failed.items())
    met = any(ms <= limit and w not in failed for w, (ms, _) in placed.items())
    return [Target(name, f"{figure}; in process {mine:.1f} ms", f"{goal} ({limit:.1f} ms)", VERDICT[met], where)]


def engine_targets(results: dict[str, Any], where: str) -> list[Target]:
    """The best backend at 10 clients: each placement by the placement step's median run (else the main run)."""
    best = best_backend(results)
    if not (mine := [s for s in served_splits(results) if s["backend"] == best and s["users"] == 10]):
        return []
    stepped = [s for s in mine if s["run_round"]]
    chosen = {**{s["placement"]: s for s in mine if not s["run_round"]}, **representative(stepped)}
    runs = {w: sum(s["placement"] == w for s in stepped) or 1 for w in chosen}
    steps = [r for r in results.get("placement", []) if r["backend"] == best and r["users"] == 10]
    errors = sum(r.get("failures", 0) for r in [_run(results, "inference", backend=best, users=10) or {}, *steps])
    judged = {w: s for w, s in chosen.items() if sound(s)}

    def verdict(ok: Callable[[dict[str, Any]], bool]) -> str:
        return "not judged" if not judged else VERDICT[any(map(ok, judged.values())) and errors == 0]

    def each(text: Callable[[dict[str, Any]], str]) -> str:
        return "; ".join(f"{w} ({_runs(runs[w])}): {text(s)}" + ("" if w in judged else ", not judged: " + (
            f"the CPU reading missed {s['missed_processes']} server process(es)" if s.get("missed_processes")
            else "figures below their base")) for w, s in chosen.items())  # fmt: skip

    share = each(lambda s: f"{s['req_per_s']} req/s = {_share(s['share'])} of {s['ceiling_req_per_s']}")
    return [
        Target(f"Served / ceiling without HTTP, best backend (`{best}`), 10 clients", f"{share}; {errors} errors",
               f">= {CEILING_SHARE}%, zero errors", verdict(lambda s: s["share"] >= CEILING_SHARE / 100), where),
        Target(f"Server CPU beyond decode + inference, best backend (`{best}`), 10 clients",
               each(lambda s: f"{s['beyond_ms']:g} ms"), f"<= {BEYOND_MS:g} ms per request, zero errors",
               verdict(lambda s: s["beyond_ms"] <= BEYOND_MS), where),
    ]  # fmt: skip


def decode_target(results: dict[str, Any], where: str) -> list[Target]:
    costs = {(c.stage, c.detail): c.cpu_ms for c in _costs(results)}
    fast, pillow = costs.get(("decode", POOL)), costs.get(("decode", POOL_PILLOW))
    if fast is None or pillow is None or (prep := costs.get(("preprocess", POOL))) is None:
        return []
    share = (fast + prep) / (pillow + prep)
    figure = f"{fast + prep:.2f} vs {pillow + prep:.2f} CPU ms per photo = {share:.0%}"
    goal, ok = f"<= {DECODE_SHARE:.0%}", share <= DECODE_SHARE
    return [Target("Decode + preprocess of the pool vs Pillow alone", figure, goal, VERDICT[ok], where)]


def default_target(results: dict[str, Any], where: str) -> list[Target]:
    """The default backend (what a request that names none gets) against `onnx`, the default before `auto`."""
    chosen = results.get("default") or {}
    default, was = chosen.get("backend"), _run(results, "inference", backend="onnx", users=10)
    mine = _run(results, "inference", backend=default, users=10) if default else None
    if not (mine and was and was["req_per_s"] > 0):
        return []
    ratio = mine["req_per_s"] / was["req_per_s"]
    figure = (
        f"`{default}` (FASTINFER_DEFAULT_BACKEND={chosen.get('requested')}, {chosen.get('source')}: "
        f"{chosen.get('why')}): {mine['req_per_s']} vs {was['req_per_s']} req/s = {ratio:.2f}×"
    )
    goal, ok = f">= {DEFAULT_VS_ONNX:g}×", ratio >= DEFAULT_VS_ONNX
    return [Target("Default backend vs `onnx`, 10 clients", figure, goal, VERDICT[ok], where)]


def speed_up_targets(results: dict[str, Any], where: str) -> list[Target]:
    rps = {(r["backend"], r["users"]): r["req_per_s"] for r in results["runs"] if r["scenario"] == "inference"}
    ceilings = [Ceiling(**c) for c in results.get("profile", {}).get("ceilings", [])]
    fidelity = {f["backend"]: f for f in results.get("profile", {}).get("fidelity", [])}
    rows = []
    for backend, baseline, factor in SPEED_UP_TARGETS:
        new = _run(results, "inference", backend=backend, users=10)
        if not new or (baseline, 10) not in rps:
            continue
        ratio = new["req_per_s"] / rps[(baseline, 10)]
        figure = f"{ratio:.2f}× ({new['req_per_s']} vs {rps[(baseline, 10)]} req/s, {new['failures']} errors)"
        others = [f"{rps[(b, u)] / rps[(baseline, u)]:.2f}× at {u}" for b, u in sorted(rps)
                  if b == backend and u != 10 and (baseline, u) in rps]  # fmt: skip
        figure += f"; {', '.join(others)} users" if others else ""
        if (mine := best_ceiling(ceilings, backend)) and (theirs := best_ceiling(ceilings, baseline)):
            figure += f"; ceilings allow {mine.req_per_s / theirs.req_per_s:.2f}×"
        if backend == "openvino" and (f := fidelity.get(backend)):
            precision = f.get("precision", "?")
            gates = f", BF16 gates {'passed' if f.get('gate_passed') else 'FAILED'}" if precision == "bf16" else ""
            figure += f"; ran at {precision}{gates} (top-1 {f['top1_agreement']:.1%}, top-5 {f['top5_overlap']:.1%})"
        ok = ratio >= factor and new["failures"] == 0
        rows.append(Target(f"`{backend}` vs `{baseline}`, 10 clients", figure, f">= {factor:g}×, zero errors",
                           VERDICT[ok], where))  # fmt: skip
    return rows


def targets(results: dict[str, Any]) -> list[Target]:
    """The bench's targets, in BENCHMARKS.md's order (the tuning check's follow, from its own run: check.targets)."""
    where = machine(results.get("hardware", {}))
    judges = (cache_targets, single_client_target, engine_targets, decode_target, default_target, speed_up_targets)
    return [t for judge in judges for t in judge(results, where)]


def _served_section(results: dict[str, Any], rel: str) -> list[str]:
    if not (splits := served_splits(results)):
        return []
    causes = next((list(s["causes"]) for s in splits if s["causes"]), [])
    columns: dict[str, Cell] = {
        "backend": "`{backend}`", "engine in": lambda s: s["placement"] + (
            f" (placement step, round {s['run_round']})" if s["run_round"] else ""),
        "users": "{users}", "served req/s": "{req_per_s}",
        "ceiling req/s (decode + inference CPU ms)": lambda s: "{ceiling_req_per_s} ({decode_ms:g} + {inference_ms:g} "
        "ms at b{batch:g}".format_map(s) + "".join(f", {p} from the run" for p in s["base_from_run"]) + ")",
        "served / ceiling": lambda s: f"**{_share(s['share'])}**", "server CPU ms/req": "{server_ms}",
        "beyond decode + inference": "**{beyond_ms:g}**",
        **{c: lambda s, c=c: f"{s['causes'][c]:g}" if c in s["causes"] else "—" for c in causes},
    }  # fmt: skip
    how = f'[What the ceiling and "beyond" are]({DOCS}#the-ceiling-without-http), [drift]({DOCS}#drift), '
    return _section("Served vs the engine's ceiling", how + f"[the placement step]({DOCS}#the-placement-step).",
                    _columns(columns, splits))  # fmt: skip


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


def _batch_section(results: dict[str, Any], rel: str) -> list[str]:
    """Images/s of the batch API against the single-image run of the same backend and users."""
    step, batch, title = results.get("batch"), _run(results, "batch"), "Batch API (`POST /classify/batch`)"
    if batch is None:
        return _section(title, f"Not measured in this run: {step.get('skipped', 'no batch run')}.") if step else []
    single, n = _run(results, "inference", backend=batch["backend"], users=batch["users"]), batch["images_per_request"]
    ips = round(single["req_per_s"] * (1 - single["error_rate"]), 1) if single else None
    ratio = f" = **{batch['images_per_s'] / ips:.2f}×**" if ips else ""
    first = f" (first: {batch.get('failure_example')})" if batch["failures"] else ""
    line = (
        f"`{batch['backend']}`, {batch['users']} users, {n} photos per request, cache bypassed: "
        f"**{batch['images_per_s']} images/s** vs {ips} images/s one per request{ratio}; "
        f"{batch['failures']} of {batch['requests']} batch requests failed{first}."
    )
    if not (batch.get("cpu") and single and single.get("cpu")):
        return _section(title, line)
    b, s = batch["cpu"]["ms_per_request"], single["cpu"]["ms_per_request"]
    rows = [[label, *(round(cpu[k] / per, 2) for k in ("front", "runner", "load_generator"))]
            for label, cpu, per in ((f"batches of {n}", b, n), ("one per request", s, 1))]  # fmt: skip
    return _section(title, line, table(["CPU ms per image", "front", "runner", "load generator"], rows))


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


def _study_findings(study: list[dict[str, Any]]) -> list[str]:
    """What the workers × batching study says, from its rows."""
    rps = {(s["front_workers"], s["runner_workers"], s["batching"]): s["req_per_s"] for s in study}
    gains = {(f, r): 100 * (v / rps[(f, r, False)] - 1) for (f, r, on), v in sorted(rps.items())
             if on and (f, r, False) in rps}  # fmt: skip
    backfires = any(g < 0 for (f, r), g in gains.items() if f * r > 1)
    said = [
        f"`{study[0]['backend']}`, 10 users. Batching on vs off, same workers: "
        + "; ".join(f"{f} front × {r} runner: {g:+.0f}%" for (f, r), g in gains.items())
        + f". With several workers it {'backfires' if backfires else 'does not backfire'} (the original FastInfer "
        "project (its FastAPI release) reported that its own batching did)."
    ]
    if base := next((s for s in study if s["front_workers"] == s["runner_workers"] == 1 and s["batching"]), None):
        best = max(study, key=lambda s: s["req_per_s"])
        said.append(
            f"Best: {best['front_workers']} front × {best['runner_workers']} runner, batching "
            f"{'on' if best['batching'] else 'off'}: {best['req_per_s']} req/s, "
            f"{100 * (best['req_per_s'] / base['req_per_s'] - 1):+.0f}% over 1 × 1 on; p99 {best['p99_ms']:g} vs "
            f"{base['p99_ms']:g} ms."
        )
    return said


def _study(results: dict[str, Any], rel: str) -> list[str]:
    if not (study := results.get("study")):
        return []
    columns: dict[str, Cell] = {
        "front workers": "{front_workers}", "runner workers": "{runner_workers}",
        "batching": lambda s: "on" if s["batching"] else "off", "req/s": "{req_per_s}", "p50 ms": "{p50_ms}",
        "p99 ms": "{p99_ms}", "errors": "{failures}",
    }  # fmt: skip
    return _section("Workers and batching", "\n".join(_study_findings(study)), _columns(columns, study))


def write_markdown(
    results: dict[str, Any], path: Path, out: Path, plots: Path | None = None, more: Extra = ((), [])
) -> None:
    """BENCHMARKS.md at ``path``, its plots and results.json in ``plots``: ``results`` with the target rows added,
    and ``more`` (rows, lines) after its own: the tune-check's (load_tests/tuning/check.py write_benchmarks)."""
    plots = plots or path.parent / "docs" / "bench"
    plots.mkdir(parents=True, exist_ok=True)
    results["targets"] = [asdict(t) for t in [*targets(results), *more[0]]]
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
        *more[1],
    ]  # fmt: skip
    text = "\n".join(md) + "\n"  # a picture only where its plot exists (results rebuilt from tables draw none)
    path.write_text(re.sub(r"!\[[^]]*\]\(([^)]+)\)", lambda m: m[0] if (path.parent / m[1]).exists() else "", text))
    (plots / "results.json").write_text(json.dumps(results, indent=2) + "\n")
