"""The search of ``fastinfer tune``: the configuration that serves best here, within a time budget, pruned by
measurement rather than swept (its four stages: docs/tuning.md). Every trial is a real server under real load;
every server started is stopped.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fastinfer.catalog import tune_space
from fastinfer.catalog.backends import env_key
from fastinfer.common import hardware
from load_tests.locust_runs import run_locust
from load_tests.service import Server, start_server, stop_server

PRUNE = 0.6  # a backend below this share of the best in-process ceiling (or above 1/PRUNE its latency) is not served
MAX_SERVED_BACKENDS = 3  # at most this many backends reach stage 2
MIN_GAIN = 0.03  # a setting is kept when it serves this much better than the best so far (this VM's noise is larger)
PLACEMENT = "where the engine runs"
PLACEMENT_ROUNDS = 3  # fresh servers per placement, in alternating order: why three, docs/tuning.md


@dataclass(frozen=True)
class Config(tune_space.Point):
    """One way to serve (tune_space.Point), with the name the search gives it."""

    def label(self) -> str:
        parts = [self.backend, "in front" if self.in_front else "runner"]
        if self.max_batch is not None:
            parts.append(f"max batch {self.max_batch}")
        if self.max_latency_ms is not None:
            parts.append(f"max wait {self.max_latency_ms} ms")
        if self.front_workers != 1:
            parts.append(f"{self.front_workers} front workers")
        if self.threads:
            parts.append(f"{self.threads} engine threads")
        if self.decode_threads:
            parts.append(f"{self.decode_threads} decode threads")
        return ", ".join(parts)


@dataclass
class Trial:
    config: Config
    stage: str
    req_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    failures: int = 0
    requests: int = 0
    error: str = ""  # the server did not start, or the run failed: this configuration does not serve here
    position: int = 0  # its place among the runs on its server (the first runs on a fresh one)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config": asdict(self.config), "label": self.config.label()}


@dataclass(frozen=True)
class Goal:
    """What "best" means: most req/s at ``clients`` (under ``p95_ms`` if given) or lowest p50 at 1 client."""

    kind: str = "throughput"
    clients: int = 10
    p95_ms: float | None = None

    def score(self, trial: Trial) -> float:
        """Higher is better; -inf for a trial that failed, erred or broke the p95 limit."""
        if trial.error or trial.failures or trial.requests == 0:
            return -math.inf
        if self.kind == "latency":
            return -trial.p50_ms
        if self.p95_ms is not None and trial.p95_ms > self.p95_ms:
            return -math.inf
        return trial.req_per_s

    def describe(self) -> str:
        if self.kind == "latency":
            return "latency: lowest single-client p50"
        limit = f", p95 <= {self.p95_ms:g} ms" if self.p95_ms is not None else ""
        return f"throughput: most req/s at {self.clients} clients{limit}"


@dataclass
class Search:
    """The state of one tune: the trials so far, the clock and the budget."""

    goal: Goal
    budget_s: float
    seconds: float
    out: Path
    started: float = field(default_factory=time.monotonic)
    trials: list[Trial] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # what the budget left untried
    figures: dict[str, dict[str, float]] = field(default_factory=dict)  # stage 1, per backend
    dropped: dict[str, str] = field(default_factory=dict)  # backend → why stage 1 dropped it
    decisions: list[str] = field(default_factory=list)  # each choice and the measurement behind it
    chosen: Trial | None = None  # the configuration kept: a change counts only past MIN_GAIN
    start: Callable[..., Server] = start_server  # a real `bentoml serve` (tests: a stand-in)
    stop: Callable[[Server], None] = stop_server
    server_start_s: float = 30.0  # an estimate until the first server says

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def affords(self, servers: int, runs: int) -> bool:
        """Whether ``servers`` fresh servers and ``runs`` load runs still fit in the budget."""
        needed = servers * self.server_start_s + runs * (self.seconds + 6)  # locust's own start and stop
        return self.elapsed() + needed <= self.budget_s

    def best(self) -> Trial | None:
        return max((t for t in self.trials if self.goal.score(t) > -math.inf), key=self.goal.score, default=None)

    def progress(self, message: str) -> None:
        done = min(1.0, self.elapsed() / self.budget_s)
        bar = "█" * int(done * 24) + "░" * (24 - int(done * 24))
        clock = f"{_mmss(self.elapsed())}/{_mmss(self.budget_s)}"
        print(f"[tune {clock}] {bar} {len(self.trials)} trials — {message}", file=sys.stderr, flush=True)


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def in_process(backends: list[str], repeats: int = 2) -> dict[str, dict[str, float]]:
    """Per backend: its best ceiling (req/s these cores allow, decode + inference, no HTTP) and the
    single-photo latency in process (decode + preprocess + b1 inference, wall ms)."""
    from fastinfer.catalog.backends import open_engine
    from fastinfer.catalog.store import family_spec
    from fastinfer.measure import profile as prof

    engines = {}
    figures: dict[str, dict[str, float]] = {}
    for name in backends:
        try:
            engines[name] = open_engine(name)
        except Exception as exc:  # an engine that cannot load here is not a candidate; the rest are
            print(f"fastinfer tune: {name} is left out: it could not be loaded ({type(exc).__name__}: "
                  f"{str(exc)[:200]})", file=sys.stderr)  # fmt: skip
            figures[name] = {"ceiling_req_per_s": 0.0, "latency_ms": math.inf}
    if not engines:
        return figures
    result = prof.run(engines, [1, 8], repeats, family_spec())
    costs = [prof.StageCost(**s) for s in result["stages"]]
    ceils = [prof.Ceiling(**c) for c in result["ceilings"]]
    for name in engines:
        best = prof.best_ceiling(ceils, name)
        figures[name] = {
            "ceiling_req_per_s": best.req_per_s if best else 0.0,
            "latency_ms": prof.in_process_latency_ms(costs, name) or math.inf,
        }
    return figures


def worth_serving(figures: dict[str, dict[str, float]], goal: Goal) -> tuple[list[str], dict[str, str]]:
    """The backends worth a served trial, best first, and why each other one was dropped."""
    unloadable = {n: "could not be loaded in process" for n, f in figures.items() if f["latency_ms"] == math.inf}
    figures = {n: f for n, f in figures.items() if n not in unloadable}
    if not figures:
        return [], unloadable
    if goal.kind == "latency":
        rank = sorted(figures, key=lambda n: figures[n]["latency_ms"])
        best = figures[rank[0]]["latency_ms"]
        keep = [n for n in rank if figures[n]["latency_ms"] <= best / PRUNE]
        dropped = {n: f"in-process latency {figures[n]['latency_ms']:.0f} ms > {best / PRUNE:.0f}" for n in rank}
    else:
        rank = sorted(figures, key=lambda n: -figures[n]["ceiling_req_per_s"])
        best = figures[rank[0]]["ceiling_req_per_s"]
        keep = [n for n in rank if figures[n]["ceiling_req_per_s"] >= PRUNE * best]
        dropped = {
            n: f"in-process ceiling {figures[n]['ceiling_req_per_s']:.1f} req/s < {PRUNE:.0%} of {best:.1f}"
            for n in rank
        }
    for n in keep[MAX_SERVED_BACKENDS:]:
        dropped[n] = f"not among the {MAX_SERVED_BACKENDS} best in process"
    keep = keep[:MAX_SERVED_BACKENDS]
    return keep, {**{n: why for n, why in dropped.items() if n not in keep}, **unloadable}


Measure = Callable[[Server, Config, Search], Trial]


def warm(url: str, backend: str, clients: int, images: Path) -> None:
    """A few rounds of pool photos at the run's concurrency, unmeasured: a fresh engine's first calls
    (allocations, a runtime's first compile of a shape) must not count against the backend measured first."""
    import httpx

    from fastinfer.common.client import auth_headers
    from fastinfer.measure import photos

    pool = [data for _, data in photos.benchmark_pool(images)]
    headers = {"Cache-Control": "no-cache", **auth_headers()}

    def post(i: int) -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/classify", files={"image": ("p.jpg", pool[i % len(pool)], "image/jpeg")},
                       data={"backend": backend}, headers=headers, timeout=60)  # fmt: skip

    with ThreadPoolExecutor(max(1, clients)) as workers:
        list(workers.map(post, range(2 * max(clients, 4))))


def measure_locust(server: Server, config: Config, search: Search) -> Trial:
    """One locust run of the benchmark pool for ``config.backend``, cache bypassed, after a warm-up."""
    clients = 1 if search.goal.kind == "latency" else search.goal.clients
    warm(server.url, config.backend, clients, search.out / "runs" / "images")
    run = run_locust(server.url, config.backend, clients, search.seconds, "inference", search.out / "runs")
    return Trial(config, "", run["req_per_s"], run["p50_ms"], run["p95_ms"], run["failures"], run["requests"])


def untuned() -> dict[str, str]:
    """Every setting tuning may set, empty (= the table's value or the rule's): what the shell exports
    must not tilt one candidate (start_server passes the shell's environment on)."""
    from fastinfer.catalog.backends import BACKENDS

    per_backend = ("BATCHING", "MAX_BATCH_SIZE", "MAX_LATENCY_MS")
    names = ["FASTINFER_RUNNER_WORKERS", *(f"FASTINFER_{what}_{env_key(b)}" for b in BACKENDS for what in per_backend)]
    return dict.fromkeys(names, "")


def server_env(configs: list[Config]) -> dict[str, str]:
    """The environment of one server serving every config at once: one per backend (batching and placement are
    per backend), all sharing the server-wide settings (front workers, engine threads, decode threads)."""
    wide = {(c.front_workers, c.threads, c.decode_threads) for c in configs}
    if len({c.backend for c in configs}) != len(configs) or len(wide) != 1:
        raise ValueError("one server serves one configuration per backend, with one set of server-wide settings")
    env = {**untuned(), "FASTINFER_TUNED": "off", "FASTINFER_MAX_CONCURRENCY": "256"}
    for config in configs:
        env.update(config.settings())
    env["FASTINFER_IN_FRONT"] = ",".join(c.backend for c in configs if c.in_front) or "none"
    env["FASTINFER_DEFAULT_BACKEND"] = configs[0].backend  # each run names its backend; not the shell's
    env["FASTINFER_BACKENDS"] = ",".join(c.backend for c in configs)  # no idle runner beside those measured
    return env


def serve(configs: list[Config], stage: str, search: Search, measure: Measure) -> list[Trial]:
    """One fresh server serving every config at once (``server_env``), each measured on it in turn; a
    server that does not start makes every trial an error."""
    env = server_env(configs)
    search.progress(f"starting a server: {'; '.join(c.label() for c in configs)}")
    t0 = time.monotonic()
    trials = []
    try:
        server = search.start(None, search.out / "serve.log", env)
    except (RuntimeError, OSError) as exc:  # TimeoutError is an OSError
        failed = [Trial(c, stage, error=f"the server did not start: {str(exc)[:300]}") for c in configs]
        search.trials += failed
        search.progress(f"{configs[0].label()}: the server did not start")
        return failed
    rest: list[Config] = []
    try:
        search.server_start_s = max(10.0, time.monotonic() - t0)
        for position, config in enumerate(configs):
            try:
                trial = replace(measure(server, config, search), stage=stage, position=position)
            except Exception as exc:  # a hung or failed load run (Ctrl-C is not an Exception): this trial only
                error = f"the run failed: {type(exc).__name__}: {str(exc)[:300]}"
                trial = Trial(config, stage, error=error, position=position)
            trials.append(trial)
            search.trials.append(trial)
            search.progress(f"{config.label()}: {shown(trial)}")
            if trial.error or trial.failures * 10 > trial.requests:  # it may be wedged: the rest get a fresh one
                rest = configs[position + 1 :]
                break
    finally:
        search.stop(server)
    return trials + (serve(rest, stage, search, measure) if rest else [])


def alternatives(config: Config, cores: int, goal: Goal) -> list[tuple[str, list[Config]]]:
    """The settings to try next from ``config``, one dimension at a time, most promising first."""
    dims = tune_space.dimensions(config.backend, cores, goal.kind)  # the table's (or the rule's) value first
    steps: list[tuple[str, list[Config]]] = []
    if config.front_workers == 1:
        steps.append((PLACEMENT, [replace(config, in_front=not config.in_front)]))
    if "max_batch" in dims:
        steps.append(("max batch", [replace(config, max_batch=b) for b in dims["max_batch"][1:]]))
        steps.append(("max wait", [replace(config, max_latency_ms=w) for w in dims["max_latency_ms"][1:]]))
    if not config.in_front:
        steps.append(("front workers", [replace(config, front_workers=w) for w in dims["front_workers"][1:]]))
    steps.append(("engine threads", [replace(config, threads=t) for t in dims["threads"][1:]]))
    steps.append(("decode threads", [replace(config, decode_threads=d) for d in dims["decode_threads"][1:]]))
    return [(name, options) for name, options in steps if options]


def tune(
    goal: Goal,
    budget_s: float,
    seconds: float,
    out: Path,
    backends: list[str],
    measure: Measure = measure_locust,
    figures: dict[str, dict[str, float]] | None = None,
    start: Callable[..., Server] = start_server,
    stop: Callable[[Server], None] = stop_server,
) -> Search:
    """The whole search (module docstring); ``figures`` skips stage 1, ``start``/``stop`` replace the server."""
    search = Search(goal, budget_s, seconds, out, start=start, stop=stop)
    search.progress(f"goal {goal.describe()}; in-process figures of {', '.join(backends)}")
    figures = figures if figures is not None else in_process(backends)
    keep, dropped = worth_serving(figures, goal)
    search.figures, search.dropped = figures, dropped
    if not keep:
        search.progress("no backend loaded in process: nothing to serve")
        return search
    search.progress(f"worth serving: {', '.join(keep)}" + (f"; dropped {', '.join(dropped)}" if dropped else ""))
    cores = hardware.cpu_count()
    served = serve([Config(**asdict(tune_space.plain(name))) for name in keep], "backend", search, measure)
    current = baseline = search.chosen = search.best()
    if current is None:
        return search
    search.decisions.append(
        f"backend {current.config.backend}: served best of "
        + ", ".join(f"{t.config.backend} {shown(t)}" for t in served)
    )
    for name, options in alternatives(baseline.config, cores, goal):
        for option in alternatives_from(current.config, options, baseline.config):
            if name == PLACEMENT:
                current = search.chosen = placement(search, current, option, measure)
                continue
            if not search.affords(1, 1):
                search.skipped.append(f"{name}: {option.label()} (the budget)")
                continue
            (trial,) = serve([option], name, search, measure)
            if goal.score(trial) > goal.score(current) * (1 + math.copysign(MIN_GAIN, goal.score(current))):
                search.decisions.append(f"{name}: {option.label()} {shown(trial)} beat {shown(current)}")
                current = search.chosen = trial
            else:
                search.decisions.append(f"{name}: kept; {option.label()} {shown(trial)} vs {shown(current)}")
    confirm(search, baseline, measure)
    return search


def placement(search: Search, current: Trial, option: Config, measure: Measure) -> Trial:
    """``current``'s configuration and ``option`` (its engine moved) each served PLACEMENT_ROUNDS times on fresh
    servers, alternating. A placement that failed the goal in a round (an error, its p95 over the limit) loses to
    one that did not; between two that served every round, ``option`` is kept only when its mean beats by MIN_GAIN
    and by more than the rounds' noise (twice the standard error of the gap). Returns the median round of
    ``option`` where it is kept, else ``current`` as it was."""
    rounds = 2 * PLACEMENT_ROUNDS
    if not search.affords(rounds, rounds):
        search.skipped.append(f"{PLACEMENT}: {option.label()}, {PLACEMENT_ROUNDS} rounds each (the budget)")
        return current
    runs: dict[Config, list[Trial]] = {current.config: [], option: []}
    for r in range(PLACEMENT_ROUNDS):
        for config in (current.config, option)[:: 1 if r % 2 == 0 else -1]:
            (trial,) = serve([config], PLACEMENT, search, measure)
            runs[config].append(trial)
        if any(search.goal.score(t) == -math.inf for t in runs[option]):
            break  # it does not serve here: no more rounds of it
    failed = [c.label() for c in runs if any(search.goal.score(t) == -math.inf for t in runs[c])]
    if failed:
        gap = f"{' and '.join(failed)} failed the goal in a round (an error, or its p95 over the limit)"
        kept = option if failed == [current.config.label()] else current.config
    else:
        gain, noise = relative_gap(*([search.goal.score(t) for t in runs[c]] for c in (current.config, option)))
        short = f", under the {MIN_GAIN:.0%} a change must gain" if noise < gain <= MIN_GAIN else ""
        told = "beyond" if abs(gain) > noise else "within"
        side = "better" if gain > 0 else "worse" if gain < 0 else "apart"
        gap = f"{abs(gain):.1%} {side}, {told} the rounds' noise (±{noise:.1%}){short}"
        kept = option if gain > max(MIN_GAIN, noise) else current.config
    said = (
        f"{option.label()} {round_figures(runs[option], search.goal)} vs {current.config.label()} "
        f"{round_figures(runs[current.config], search.goal)}: {gap}"
    )
    search.decisions.append(f"{PLACEMENT}: {said}" if kept == option else f"{PLACEMENT}: kept; {said}")
    if kept != option:
        return current
    return sorted(runs[option], key=search.goal.score)[(len(runs[option]) - 1) // 2]  # the lower median


def relative_gap(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """How much better ``theirs`` scores than ``ours`` on the mean, as a share of ours' size, and the noise of that
    share: twice its standard error from the rounds' spread. Every score finite; a mean of zero: shares of 1."""
    mean_ours, mean_theirs = statistics.fmean(ours), statistics.fmean(theirs)
    spread = sum(statistics.variance(s) / len(s) if len(s) > 1 else 0.0 for s in (ours, theirs))
    scale = abs(mean_ours) or 1.0
    return (mean_theirs - mean_ours) / scale, 2 * math.sqrt(spread) / scale


def round_figures(trials: list[Trial], goal: Goal) -> str:
    """Each round's figures the goal ranks by: "(120.1, 123.0 req/s)", "(p50 45, 47 ms)"; with a p95 limit, each
    round's p95 too; a round that failed, as it failed."""
    if any(t.error or t.failures for t in trials):
        return "(" + "; ".join(shown(t)[1:-1] for t in trials) + ")"
    p95 = f"; p95 {', '.join(f'{t.p95_ms:g}' for t in trials)} ms" if goal.p95_ms is not None else ""
    if goal.kind == "latency":
        return f"(p50 {', '.join(f'{t.p50_ms:g}' for t in trials)} ms{p95})"
    return f"({', '.join(f'{t.req_per_s:.1f}' for t in trials)} req/s{p95})"


def confirm(search: Search, baseline: Trial, measure: Measure) -> None:
    """Serve the chosen configuration and the table's settings once more each; the choice stays only if it still
    wins on the mean of both rounds: a tuned file must not rest on one lucky run."""
    chosen = search.chosen
    if chosen is None or chosen.config == baseline.config:
        return
    if chosen.stage == PLACEMENT and replace(chosen.config, in_front=baseline.config.in_front) == baseline.config:
        search.decisions.append(f"confirmation: not run: the placement alone changed, {PLACEMENT_ROUNDS} rounds each")
        return
    if not search.affords(2, 2):
        search.decisions.append("confirmation: not run (the budget); the chosen configuration rests on one run each")
        return
    (again,) = serve([baseline.config], "confirmation", search, measure)
    (mine,) = serve([chosen.config], "confirmation", search, measure)
    goal = search.goal
    theirs = (goal.score(baseline) + goal.score(again)) / 2
    ours = (goal.score(chosen) + goal.score(mine)) / 2
    if ours > theirs * (1 + math.copysign(MIN_GAIN, theirs)):
        search.decisions.append(f"confirmation: {chosen.config.label()} {shown(mine)} again beat {shown(again)}")
        return
    search.decisions.append(
        f"confirmation: {chosen.config.label()} {shown(mine)} did not beat {baseline.config.label()} {shown(again)} "
        "again (means of two rounds): the table's settings stay"
    )
    search.chosen = max((baseline, again), key=goal.score)


def shown(trial: Trial) -> str:
    if trial.error:
        return f"({trial.error[:80]})"
    errors = f", {trial.failures} errors" if trial.failures else ""
    return f"({trial.req_per_s:.1f} req/s, p50 {trial.p50_ms:g} ms, p95 {trial.p95_ms:g} ms{errors})"


def alternatives_from(current: Config, options: list[Config], base: Config) -> list[Config]:
    """Each option, a change of one dimension from ``base``, as that change from ``current``: what earlier
    dimensions chose is kept."""
    out = []
    for option in options:
        changed = {f.name: getattr(option, f.name) for f in fields(Config) if f.name != "backend"}
        merged = replace(current, **{k: v for k, v in changed.items() if v != getattr(base, k)})
        if merged.in_front and merged.front_workers != 1:
            continue  # an engine in the front needs the one front worker
        if merged != current:
            out.append(merged)
    return out
