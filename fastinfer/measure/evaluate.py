"""``fastinfer evaluate``: what each backend stored for a family costs in accuracy and gives in speed, on the
user's labelled photos: the accuracy-speed frontier.

In process (engines from this machine's store), or through a running server's ``POST /classify`` (``--url``,
uncached, answers scored by their label names). The drop is against PyTorch on the same photos; the speed is
served images/s under closed-loop clients (``--url``) or the engine's own images/s (in process). The table
names the fastest backend whose drop is within the limit.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from fastinfer.catalog import choice, holdings, store
from fastinfer.catalog.backends import SPECS, open_engine
from fastinfer.catalog.store import PreprocessSpec, StoredModelInfo
from fastinfer.common import hardware
from fastinfer.common.client import auth_headers
from fastinfer.engines import Engine
from fastinfer.measure import accuracy
from fastinfer.measure.accuracy import EvalFolder, EvalSet, Progress, Report, Row, Skipped
from fastinfer.measure.plots import plot_frontier, table

REFERENCE_BACKEND = "pytorch"
HTTP_CLIENTS = 4  # the accuracy pass: enough to keep a small server's batches full, few enough to leave it the cores
SPEED_CLIENTS = choice.SERVED_USERS  # the speed: the clients `make bench`'s served req/s (and `auto`) is judged at
SPEED_SECONDS = 5.0  # timed per backend, after the warm-up: short by default (--seconds)
WARMUP_S = 1.0  # load before the timed window: connections opened, the server's batches and the engine warm
SPEED_PHOTOS = 64  # the most photos whose bodies are held in memory for the served speed, spread over the folder
LIMIT_KEY = "max_accuracy_drop_pp"  # where a build with --eval-dir records its limit (each model's accuracy metadata)
UNTIMED = "not measured (--seconds 0)"
HTTP_TIMEOUT_S = 120
# A server's answers about the file itself (a proxy may answer 413/415 without our body): the photo is skipped.
# Any other failure is the server's, and the backend is not measured.
PHOTO_CODES = ("invalid_image", "image_too_large", "payload_too_large", "unsupported_media_type")
PHOTO_STATUSES = (413, 415)


class EvaluateError(RuntimeError):
    """What stops an evaluation as a whole (no such family, no server at the URL): one line."""


def family_info(name: str, by_option: bool = False) -> StoredModelInfo:
    """Labels and preprocessing of a family, from one of the stored models a server would serve (PyTorch's first)."""
    import bentoml

    names = holdings.held().get(name, [])
    if not names:  # said as the user named it: --model NAME or FASTINFER_MODEL=NAME
        named = (lambda n: f"--model {n}") if by_option else (lambda n: f"{store.FAMILY_ENV}={n}")
        raise EvaluateError(str(holdings.missing_reason(name, "evaluate", named)))
    apart = holdings.apart_now(name)  # of another source than the family's newest model: not the family's labels
    served = [n for n in names if n not in apart] or names
    for stored in sorted(served, key=lambda n: n != store.model_name(REFERENCE_BACKEND, family_name=name)):
        try:
            return store.describe(bentoml.models.get(f"{stored}:latest"))
        except Exception:  # unreadable: another of its models says the same
            continue
    raise EvaluateError(f"no model of family {name!r} in the store can be read")


def chosen_backends(asked: str | None, known: Sequence[str]) -> list[str] | None:
    """``--backends a,b`` checked against ``known``; None when not given."""
    if asked is None:
        return None
    names = [n.strip() for n in asked.split(",") if n.strip()]
    if not names:
        raise EvaluateError(f"--backends {asked!r} names no backend; choose from {', '.join(known)}")
    if unknown := [n for n in names if n not in known]:
        raise EvaluateError(f"--backends: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return names


def against_reference(
    report: Report, reference: str, top1: Mapping[str, Mapping[str, tuple[str | None, str]]]
) -> Report:
    """Each measured row's top-1 drop against PyTorch's, when PyTorch was measured, and its top-1 answers (by photo:
    answer and truth) paired with PyTorch's on the photos both answered: the drop's 95% interval and the answers
    changed, as the build's gate reports them."""
    ref = top1.get(REFERENCE_BACKEND)
    ref_row = next((r for r in report.rows if r.backend == REFERENCE_BACKEND and r.top1 is not None), None)
    report.reference = reference if ref_row else f"none: {REFERENCE_BACKEND} was not measured"
    labels = sorted({x for answers in top1.values() for pair in answers.values() for x in pair if x is not None})
    code = {label: i for i, label in enumerate(labels)}  # an answer of no known label: -1
    for row in report.rows:
        if ref_row is not None and ref_row.top1 is not None and row.top1 is not None:
            row.drop_pp = accuracy.top1_drop_pp(ref_row.top1, row.top1)
        mine = top1.get(row.backend)
        if ref is None or mine is None or row.backend == REFERENCE_BACKEND:
            continue
        both = [p for p in ref if p in mine and ref[p][1] == mine[p][1]]
        if both:
            ref_answers, answers, targets = (np.array([code.get(a[p][i], -1) for p in both])
                                             for a, i in ((ref, 0), (mine, 0), (ref, 1)))  # fmt: skip
            row.paired = accuracy.paired(ref_answers, answers, targets)
    return report


def _say(line: str) -> None:
    print(accuracy.visible(line), file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Timing:
    """How the speed is measured: ``seconds`` after ``warmup_s`` (0: no speed), with ``clients`` through a server;
    ``say`` hears progress."""

    seconds: float = SPEED_SECONDS
    clients: int = SPEED_CLIENTS
    warmup_s: float = WARMUP_S
    say: Callable[[str], None] = _say


@dataclass(frozen=True)
class Speed:
    """A backend's images per second as measured here, or why there is none."""

    backend: str
    images_per_s: float | None
    images: int = 0  # answered (or run) in the timed window
    seconds: float = 0.0  # the timed window
    failures: int = 0  # requests that got no answer of the backend's (warm-up included)
    note: str = ""


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of ``hits`` of ``n``: inside 0..1, never a point at 0% or 100%."""
    ci = binomtest(hits, n).proportion_ci(0.95, method="wilson")
    return ci.low, ci.high


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The names no other point matches or beats on both speed and accuracy, slowest first."""
    front = [
        name
        for name, (x, y) in points.items()
        if not any(ox >= x and oy >= y and (ox > x or oy > y) for other, (ox, oy) in points.items() if other != name)
    ]
    return sorted(front, key=lambda n: (points[n][0], -points[n][1]))


def within_limit(drop_pp: float | None, limit_pp: float) -> bool | None:
    """Whether a measured top-1 drop is within the limit (None: no drop, the reference was not measured)."""
    return None if drop_pp is None else drop_pp <= limit_pp + 1e-9


def fastest_within(
    speeds: Mapping[str, float | None], drops: Mapping[str, float | None], limit_pp: float
) -> str | None:
    """The fastest backend whose drop is within ``limit_pp`` (None: none is timed and within)."""
    timed = [(rate, name) for name, rate in speeds.items() if rate and within_limit(drops.get(name), limit_pp)]
    return max(timed)[1] if timed else None


def recorded_limit(
    asked: float | None, recorded: Sequence[Any], none: str = "the family records none (built without --eval-dir)"
) -> tuple[float, str]:
    """The limit and its source: ``--max-drop``, else the smallest the family's builds recorded, else the default."""
    if asked is not None:
        return asked, "--max-drop"
    numbers = sorted({float(v) for v in recorded if isinstance(v, int | float) and not isinstance(v, bool)})
    if numbers:
        return numbers[0], "the family's build (--max-accuracy-drop, recorded with its models)"
    return accuracy.DEFAULT_MAX_DROP_PP, f"the build's default: {none}"


def artifacts_dir(family: str) -> Path:
    """Where evaluate's files go by default: beside the family in the store's home. EvaluateError for a name no
    folder can have."""
    try:
        return accuracy.artifacts_folder(store.check_family(family))
    except store.BadFamilyName as exc:
        raise EvaluateError(f"the family's name cannot name a folder ({exc}): give --out DIR") from None


def engine_speed(backend: str, engine: Engine, pixels: np.ndarray, batch: int, timing: Timing) -> Speed:
    """The engine's own images/s on ``batch`` preprocessed photos a call, after the warm-up; two calls at least."""
    x = pixels[np.arange(batch) % len(pixels)]
    timing.say(f"{backend}: timing the engine, {batch} photo(s) a call, {timing.seconds:g} s after a "
               f"{timing.warmup_s:g} s warm-up")  # fmt: skip
    try:
        warm = time.perf_counter() + timing.warmup_s
        engine.run(x)
        while time.perf_counter() < warm:
            engine.run(x)
        calls, start = 0, time.perf_counter()
        while calls < 2 or time.perf_counter() - start < timing.seconds:
            engine.run(x)
            calls += 1
        elapsed = time.perf_counter() - start
    except Exception as exc:  # an engine that ran the accuracy pass but fails now: a row's note, not a crash
        return Speed(backend, None, note=f"timing failed: {type(exc).__name__}: {exc}")
    speed = Speed(backend, round(calls * batch / elapsed, 1), calls * batch, round(elapsed, 2))
    timing.say(f"{backend}: {speed.images_per_s:g} images/s")
    return speed


def served_speed(client: Any, url: str, backend: str, photos: Sequence[Path], k: int, timing: Timing) -> Speed:
    """``timing.clients`` closed-loop clients posting ``photos`` to ``backend``, cache bypassed as in ``make bench``:
    answers per second within ``timing.seconds`` after the warm-up. A cached answer counts as a failure."""
    import httpx

    bodies = []
    for path in photos:
        request = httpx.Request("POST", f"{url}/classify", files={"image": (path.name, path.read_bytes())},
                                data={"backend": backend, "top_k": str(k)})  # fmt: skip
        bodies.append((request.read(), request.headers["Content-Type"]))
    clients = timing.clients
    answered, failed, first = [0] * clients, [0] * clients, []
    begin = time.perf_counter() + timing.warmup_s
    end = begin + timing.seconds

    def worker(i: int) -> None:
        photo = i * len(bodies) // clients  # each client starts at another photo
        while time.perf_counter() < end:
            content, content_type = bodies[photo % len(bodies)]
            photo += 1
            try:
                answer = client.post(f"{url}/classify", content=content, headers={"Content-Type": content_type})
                why = None if answer.status_code == 200 else "{} {}: {}".format(answer.status_code, *_error(answer))
                if why is None and answer.json().get("cached"):
                    why = "a cached answer, though the cache was bypassed"
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                why = f"no answer: {type(exc).__name__}: {exc}"
            if why is not None:
                failed[i] += 1
                first[:] = first or [why]
            elif begin <= time.perf_counter() <= end:
                answered[i] += 1

    timing.say(f"{backend}: timing {url}, {clients} clients on {len(bodies)} photos, {timing.seconds:g} s after a "
               f"{timing.warmup_s:g} s warm-up")  # fmt: skip
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done, failures = sum(answered), sum(failed)
    note = f"{failures} request(s) failed, the first: {first[0]}" if failures else ""
    speed = Speed(backend, round(done / timing.seconds, 1) if done else None, done, timing.seconds, failures, note)
    timing.say(f"{backend}: " + (f"{speed.images_per_s:g} images/s" if done else "no answer in time") +
               (f" ({note})" if note else ""))  # fmt: skip
    return speed


def _cpu(machine: Any) -> str:
    """A machine's CPU and cores, as ``hardware.probe()`` (a server's, in GET /backends) says them."""
    if not isinstance(machine, dict) or not machine.get("cpu"):
        return "not said"
    cores = machine.get("cores")
    return f"{machine['cpu']}" + (f", {cores} cores" if isinstance(cores, int) else "")


@dataclass
class Evaluation:
    """The accuracy report, the speed measured beside it, and the limit a backend's drop is held to."""

    report: Report
    speeds: dict[str, Speed]
    how: str  # how the speed was measured, in words
    cpu: str  # the CPU that computed the answers (the server's, with --url)
    timing: Timing = field(default_factory=Timing)
    clients: int | None = None  # through a server: how many clients; in process: None
    recorded: list[Any] = field(default_factory=list)  # limits the family's build recorded
    unrecorded: str = "the family records none (built without --eval-dir)"  # why, when there are none
    limit_pp: float = accuracy.DEFAULT_MAX_DROP_PP
    limit_source: str = ""

    @property
    def rows(self) -> list[Row]:
        return self.report.rows

    def points(self) -> list[dict[str, Any]]:
        """Each measured backend's top-1 (with interval), top-5, images/s, and whether it is within the limit, on the
        Pareto front, the fastest within the limit."""
        measured = [r for r in self.rows if r.top1 is not None and r.images]
        rates = {r.backend: self.speeds[r.backend].images_per_s if r.backend in self.speeds else None for r in measured}
        front = set(pareto_front({r.backend: (rate, r.top1) for r in measured if (rate := rates[r.backend])}))
        best = fastest_within(rates, {r.backend: r.drop_pp for r in measured}, self.limit_pp)
        points = []
        for r in measured:
            low, high = wilson(round(r.top1 * r.images), r.images)
            point = {"backend": r.backend, "precision": r.precision or "", "images": r.images, "top1": r.top1,
                     "top1_low": low, "top1_high": high, "drop_pp": r.drop_pp, "images_per_s": rates[r.backend],
                     "within_limit": within_limit(r.drop_pp, self.limit_pp), "on_front": r.backend in front,
                     "fastest_within_limit": r.backend == best}  # fmt: skip
            if r.top5 is not None:
                low, high = wilson(round(r.top5 * r.images), r.images)
                point.update(top5=r.top5, top5_low=low, top5_high=high)
            points.append(point)
        return points

    def top5_shown(self) -> bool:
        """Top-5 says something only with more than 5 classes: with fewer, every answer's top 5 holds its class."""
        return self.report.labels > accuracy.TOP_K

    def fastest(self) -> str | None:
        return next((p["backend"] for p in self.points() if p["fastest_within_limit"]), None)

    def as_dict(self) -> dict[str, Any]:
        """accuracy's report with the speed and the frontier joined: each row's images/s, interval and place."""
        data = self.report.as_dict()
        points = {p["backend"]: p for p in self.points()}
        for row in data["rows"]:
            point = points.get(row["backend"], {})
            speed = self.speeds.get(row["backend"])
            row.update(
                images_per_s=None if speed is None else speed.images_per_s,
                speed=None if speed is None else asdict(speed),
                top1_interval=[point["top1_low"], point["top1_high"]] if point else None,
                within_limit=point.get("within_limit"),
                on_pareto_front=point.get("on_front", False),
            )
        return {
            **data,
            "speed": {
                "how": self.how,
                "cpu": self.cpu,
                "clients": self.clients,
                "seconds": self.timing.seconds,
                "warmup_s": self.timing.warmup_s,
                "measured": bool(self.speeds),
            },
            "limit_pp": self.limit_pp,
            "limit_from": self.limit_source,
            "top1_interval": "95%, Wilson score, each backend's own top-1",
            "pareto_front": [p["backend"] for p in points.values() if p["on_front"]],
            "fastest_within_limit": self.fastest(),
        }

    def table(self) -> str:
        """The accuracy table, then the frontier: images/s, top-1 with its interval, the drop against the limit."""
        ref = next((r for r in self.rows if r.backend == REFERENCE_BACKEND and r.top1 is not None), None)
        limit = f"within {self.limit_pp:g} pp"
        head = ["backend", "precision", "images/s", "top-1 (95% interval)"] + (["top-5"] if self.top5_shown() else [])
        head += [f"drop vs {REFERENCE_BACKEND} (pp)", limit, "Pareto front"]
        rows = []
        for p in self.points():
            speed = self.speeds.get(p["backend"])
            rate = "—" if speed is None else "—" if speed.images_per_s is None else f"{speed.images_per_s:g}"
            rate += f" ({speed.failures} failed)" if speed and speed.failures else ""
            cells = [p["backend"], p["precision"] or "—", rate,
                     f"{p['top1']:.2%} ({p['top1_low']:.1%} to {p['top1_high']:.1%})"]  # fmt: skip
            cells += [f"{p['top5']:.2%}" if "top5" in p else "—"] if self.top5_shown() else []
            within = {None: "—", True: "yes", False: "no"}[p["within_limit"]]
            cells += [
                "—" if p["drop_pp"] is None else f"{p['drop_pp']:+.2f}",
                within + (": the fastest" if p["fastest_within_limit"] else ""),
                "yes" if p["on_front"] else "",
            ]
            rows.append(map(accuracy.visible, cells))
        lines = [self.report.table(), "", table(head, rows)]
        best = self.fastest()
        if best is not None:
            said = (f"fastest within the limit ({self.limit_pp:g} pp below {REFERENCE_BACKEND}'s top-1, from "
                    f"{self.limit_source}): {best}")  # fmt: skip
        elif not self.speeds:
            said = f"speed {UNTIMED}: no fastest"
        elif ref is None:
            said = f"no fastest within the limit: {REFERENCE_BACKEND} was not measured, so no drop is known"
        else:
            said = f"no timed backend is within the limit ({self.limit_pp:g} pp, from {self.limit_source})"
        lines += ["", said, f"speed: {self.how}", f"CPU: {self.cpu}"]
        return "\n".join(lines[:-4] + [accuracy.visible(line) for line in lines[-4:]])


def in_process(
    root: Path,
    backends: Sequence[str] | None,
    progress: Progress,
    name: str,
    by_option: bool,
    timing: Timing | None = None,
) -> Evaluation:
    """Each backend of family ``name`` opened from the store, run on the photos and timed (or a row saying why not)."""
    timing = timing or Timing()
    info = family_info(name, by_option)
    sets: dict[tuple[tuple[str, ...], PreprocessSpec], EvalSet] = {}

    def photos(labels: list[str], spec: PreprocessSpec) -> EvalSet:
        key = (tuple(labels), spec)
        if key not in sets:  # once per family, unless one of its models was stored with other labels
            sets[key] = accuracy.load(root, labels, spec, progress)
        return sets[key]

    images = photos(info.categories, info.preprocess)  # the folder checked before any engine loads
    names = backends if backends is not None else [n for n in SPECS if n != "coreml"]  # coreml-batched: its models
    apart = holdings.apart_now(name)  # the server's same-source rule: what it would not serve, and why
    rows, speeds, recorded, top1 = [], {}, [], {}
    for backend in names:
        spec = SPECS[backend]
        found = {b: store.find(spec.artifact, b, name) for b in spec.static_batches}
        models = {b: m for b, m in found.items() if m is not None}
        missing = [store.model_name(spec.artifact, b, name) for b in found if b not in models]
        refused = [why for b in models if (why := apart.get(store.model_name(spec.artifact, b, name)))]
        lacking = f"{', '.join(missing)} not in the model store; {holdings.build_hint(name)}" if missing else None
        why = spec.platform() or next(iter(refused), None) or lacking  # in the order a server gives them
        if why is not None:
            rows.append(Row(backend, status="not measured", note=why))
            continue
        mine = store.describe(models[spec.static_batches[0]])
        try:
            engine = open_engine(backend, dirs={b: m.path for b, m in models.items()})
        except Exception as exc:  # a model that cannot load here: a row, not a crash
            rows.append(Row(backend, status="not measured", note=f"could not be loaded: {type(exc).__name__}: {exc}"))
            continue
        mine_set = photos(mine.categories, mine.preprocess)
        batch = accuracy.call_size(spec.rows_independent)
        try:
            logits = accuracy.run(backend, engine.run, mine_set.pixels, progress, batch)
        except Exception as exc:  # loaded, then failed on the photos: a row, not a crash
            said = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            rows.append(Row(backend, status="not measured", note=f"failed while running: {said}"))
            continue
        result = accuracy.accuracy(logits, mine_set.targets)
        rows.append(Row.of(backend, accuracy.run_precision(backend, engine.describe()), result))
        answers = [mine_set.labels[a] for a in accuracy.answers(logits)]
        truths = [mine_set.labels[t] for t in mine_set.targets]
        top1[backend] = dict(zip(map(str, mine_set.files), zip(answers, truths, strict=True), strict=True))
        recorded += [mine.accuracy.get(LIMIT_KEY)] if isinstance(mine.accuracy, dict) else []
        if timing.seconds > 0:
            speeds[backend] = engine_speed(backend, engine, mine_set.pixels, batch, timing)
        del engine  # before the next one loads
    skipped = {s.path: s for e in sets.values() for s in e.skipped}
    report = Report(str(root.resolve()), len(images.targets), list(skipped.values()), images.unevaluated,
                    len(images.labels), "", rows, {"family": name, "via": "in process"})  # fmt: skip
    report = against_reference(report, f"{REFERENCE_BACKEND} (stored FP32 model)", top1)
    how = UNTIMED if timing.seconds <= 0 else (
        f"each engine in this process, {accuracy.BATCH} images a call cycled from the {len(images.targets)} "
        f"preprocessed photos (one a call for dynamic INT8, as served), {timing.seconds:g} s each after a "
        f"{timing.warmup_s:g} s warm-up; decoding, preprocessing and HTTP not included")  # fmt: skip
    return Evaluation(report, speeds, how, _cpu(hardware.probe()), timing, None, recorded)


def _error(response: Any) -> tuple[str, str]:
    """(code, message) of a FastInfer error answer, or its status and text when it is not one."""
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except Exception:
        return str(response.status_code), " ".join(response.text[:200].split())


def served_family(url: str, body: Any) -> tuple[str | None, list[str] | None, int | None, dict[str, dict[str, Any]]]:
    """From a GET /backends answer: the family's name, labels, class count (None where not said) and backends.
    EvaluateError when it is not FastInfer's."""
    try:
        entries = {str(b["name"]): b for b in body["backends"] if isinstance(b, dict)}
        said = body.get("family")
    except (KeyError, TypeError, AttributeError):
        raise EvaluateError(f"{url} does not answer as a FastInfer server: GET /backends lists no backends") from None
    said = said if isinstance(said, dict) else {}
    name = said.get("name") if isinstance(said.get("name"), str) else None
    labels = said.get("labels")
    if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
        labels = None
    classes = said.get("num_classes") if isinstance(said.get("num_classes"), int) else None
    return name, labels, classes or (len(labels) if labels else None), entries


def through_server(
    url: str,
    root: Path,
    backends: Sequence[str] | None,
    progress: Progress,
    family_name: str | None = None,
    timing: Timing | None = None,
) -> Evaluation:
    """Each backend of a running server, asked about every photo by ``POST /classify`` and timed under several
    clients; the local model store is not read."""
    import httpx

    timing = timing or Timing()
    url = url.rstrip("/")
    headers = {**auth_headers(), "Cache-Control": "no-cache, no-store"}
    with httpx.Client(timeout=HTTP_TIMEOUT_S, headers=headers) as client:
        try:
            listed = client.get(f"{url}/backends")
        except httpx.HTTPError as exc:
            raise EvaluateError(f"no FastInfer server answers at {url}: {type(exc).__name__}: {exc}") from None
        if listed.status_code != 200:
            raise EvaluateError(f"{url}/backends answered {listed.status_code}: {_error(listed)[1]}")
        try:
            body = listed.json()
        except ValueError:
            raise EvaluateError(f"{url} does not answer as a FastInfer server: GET /backends is not JSON") from None
        said, labels, classes, served = served_family(url, body)
        if family_name and said and said != family_name:
            raise EvaluateError(f"{url} serves model family {said!r}, not {family_name!r} (--model)")
        name = said or family_name or store.DEFAULT_FAMILY
        folder = accuracy.scan(root, labels)  # labels unknown: the class folders' names, scored by name
        k = min(accuracy.TOP_K, classes or accuracy.TOP_K)
        names = backends if backends is not None else [n for n, b in served.items() if b.get("available")]
        rows, skipped, speeds, top1, posted = [], {}, {}, {}, 0
        for backend in names:
            entry = served.get(backend)
            if entry is None or not entry.get("available"):
                why = "this server does not serve it" if entry is None else entry.get("reason") or "unavailable"
                rows.append(Row(backend, status="not measured", note=f"{url}: {why}"))
                continue
            best, targets, failed, asked = _ask_all(client, url, backend, folder, k, progress, skipped)
            if failed is not None or not best:
                rows.append(Row(backend, status="not measured", note=failed or "no photo could be classified"))
                continue
            runs_on = entry.get("runs_on") if isinstance(entry.get("runs_on"), dict) else {}  # its runner's describe()
            precision = accuracy.run_precision(backend, runs_on)
            rows.append(Row.of(backend, precision, accuracy.ranked_accuracy(best, targets)))
            named = [folder.labels[b[0]] if b and b[0] >= 0 else None for b in best]
            top1[backend] = {str(p): (a, folder.labels[t]) for p, a, t in zip(asked, named, targets, strict=True)}
            if timing.seconds > 0:
                usable = [f for f in folder.files if str(f) not in skipped]
                timed = usable[:: max(1, math.ceil(len(usable) / SPEED_PHOTOS))]  # spread over the classes
                speeds[backend], posted = served_speed(client, url, backend, timed, k, timing), len(timed)
    images = len(folder.files) - len(skipped)
    source = "the server (GET /backends)" if labels else "the folders' names: the server lists none"
    extra = {"family": name, "via": f"POST {url}/classify", "labels_from": source}
    report = Report(str(root.resolve()), images, folder.skipped + list(skipped.values()), folder.unevaluated,
                    classes or len(folder.labels), "", rows, extra)  # fmt: skip
    report = against_reference(report, f"{REFERENCE_BACKEND} (served by {url})", top1)
    how = UNTIMED if timing.seconds <= 0 else (
        f"served by {url} (POST /classify), {timing.clients} closed-loop clients on this machine posting "
        f"{posted} of the {images} photos, cache bypassed, {timing.seconds:g} s each after a "
        f"{timing.warmup_s:g} s warm-up")  # fmt: skip
    family = body.get("family") if isinstance(body.get("family"), dict) else {}
    recorded = [family.get(LIMIT_KEY)] + [(e.get("accuracy") or {}).get(LIMIT_KEY) for e in served.values()
                                          if isinstance(e.get("accuracy"), dict)]  # fmt: skip
    cpu = _cpu(body.get("hardware")) + " (the server's, from GET /backends)"
    return Evaluation(report, speeds, how, cpu, timing, timing.clients, recorded, "the server says none")


def _ask_all(
    client: Any,
    url: str,
    backend: str,
    folder: EvalFolder,
    k: int,
    progress: Progress,
    skipped: dict[str, Skipped],
) -> tuple[list[list[int]], list[int], str | None, list[Path]]:
    """Every photo of ``folder`` to ``backend``, HTTP_CLIENTS at a time: each answer's ranked label indices (-1:
    unknown), its target, the first failure and the photos answered; a refused photo goes into ``skipped``."""
    import httpx

    index = {label: i for i, label in enumerate(folder.labels)}

    def ask(path: Path) -> tuple[str, Any]:  # ("ok", labels) | ("photo", why refused) | ("failed", why)
        try:
            answer = client.post(f"{url}/classify", files={"image": (path.name, path.read_bytes())},
                                 data={"backend": backend, "top_k": str(k)})  # fmt: skip
        except (httpx.HTTPError, OSError) as exc:
            return "failed", f"{path.name}: no answer: {type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            code, message = _error(answer)
            if code in PHOTO_CODES or answer.status_code in PHOTO_STATUSES:
                return "photo", f"{answer.status_code} {code}: {message}"
            return "failed", f"{path.name}: {answer.status_code} {code}: {message}"
        try:
            return "ok", [str(p["label"]) for p in answer.json()["top_k"]]
        except (ValueError, KeyError, TypeError) as exc:
            return "failed", f"{path.name}: 200 but not a FastInfer answer ({type(exc).__name__}: {exc})"

    best: list[list[int]] = []
    targets: list[int] = []
    answered: list[Path] = []
    failed = None
    total = len(folder.files)
    with ThreadPoolExecutor(HTTP_CLIENTS) as pool:
        answers = zip(folder.files, folder.targets, pool.map(ask, folder.files), strict=True)
        for done, (path, target, (kind, said)) in enumerate(answers, 1):
            if kind == "ok":
                best.append([index.get(label, -1) for label in said])
                targets.append(target)
                answered.append(path)
            elif kind == "photo":
                skipped[str(path)] = Skipped(str(path), said)
            elif failed is None:  # the server's fault, not the photo's
                failed = said
            if done % accuracy.BATCH == 0 or done == total:
                progress(backend, done, total)
    return best, targets, failed, answered


def evaluate(
    root: Path,
    backends: str | None = None,
    url: str | None = None,
    progress: Progress | None = None,
    family_name: str | None = None,
    timing: Timing | None = None,
    max_drop_pp: float | None = None,
) -> Evaluation:
    """The accuracy and speed of a family's backends on ``root`` (through the server at ``url``, if given), each
    drop held to ``max_drop_pp`` (default: the family's recorded limit, else the build's default)."""
    progress = progress or accuracy.printer()
    names = chosen_backends(backends, list(SPECS))
    chosen = store.check_family(family_name) if family_name else None
    if url:
        result = through_server(url, root, names, progress, chosen, timing)
    else:
        result = in_process(root, names, progress, chosen or store.family(), chosen is not None, timing)
    if not any(r.status == "measured" for r in result.rows):
        said = "; ".join(f"{r.backend}: {r.note or r.status}" for r in result.rows)
        raise EvaluateError(" ".join(f"no backend was measured: {said}".split()))  # one line
    result.limit_pp, result.limit_source = recorded_limit(max_drop_pp, result.recorded, result.unrecorded)
    if not result.top5_shown():  # every answer's top 5 holds its class: 100% says nothing
        for row in result.rows:
            row.top5 = None
        result.report.extra["top5"] = f"not shown: {result.report.labels} classes, no more than {accuracy.TOP_K}"
    return result


def plot(result: Evaluation, path: Path) -> Path:
    """The frontier: top-1 (and top-5, with more classes than 5) with its interval against images/s."""
    shown = accuracy.visible  # names a server gave: their control characters drawn as escapes, not as boxes
    points = [{k: shown(v) if isinstance(v, str) else v for k, v in p.items()} for p in result.points()]
    ref = next((p for p in points if p["backend"] == REFERENCE_BACKEND), None)
    family = shown(str(result.report.extra.get("family", "")))
    title = f"{family}: accuracy against speed on {result.report.images} of your labelled photos"
    speed = f"images / s: {result.how}" if result.speeds else f"speed {UNTIMED}"
    plot_frontier(points, path, title, shown(f"{speed}; CPU: {result.cpu}"),
                  None if ref is None else (ref["top1"] - result.limit_pp / 100, f"{REFERENCE_BACKEND} "
                                            f"- {result.limit_pp:g} pp: the limit"))  # fmt: skip
    return path.resolve()
