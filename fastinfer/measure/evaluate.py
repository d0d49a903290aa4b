"""``fastinfer evaluate``: the accuracy of what is stored for a family, on the user's labelled photos.

In process (each backend's engine opened from the store, as ``fastinfer fidelity`` does), or through a
running server's ``POST /classify`` (``--url``): every answer is then computed by the server for this
request (``Cache-Control: no-cache``; ``no-store`` keeps the eval photos out of its cache), and the photos
are decoded and preprocessed by the server itself. The drop is measured against the stored PyTorch model's
figure on the same photos. The speed beside it is what ``make bench`` served on this machine, where it ran.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastinfer.catalog import choice, family, store
from fastinfer.catalog.backends import SPECS, open_engine, unavailable_reason
from fastinfer.catalog.store import PreprocessSpec, StoredModelInfo
from fastinfer.common import hardware
from fastinfer.measure import accuracy
from fastinfer.measure.accuracy import EvalFolder, EvalSet, Progress, Report, Row, Skipped

REFERENCE_BACKEND = "pytorch"
HTTP_CLIENTS = 4
"""Concurrent requests in ``--url`` mode: enough to keep a small server's batches full, few enough that
the client leaves it the cores."""
HTTP_TIMEOUT_S = 120
SKIPPED_CODES = ("invalid_image", "image_too_large", "unsupported_media_type")
"""Answers about the file itself: it is skipped and counted, as in process."""


class EvaluateError(RuntimeError):
    """What stops an evaluation as a whole (no such family, no server at the URL): one line."""


def family_info(name: str) -> StoredModelInfo:
    """Labels and preprocessing of a family, from one of its stored models (PyTorch's where stored: all of
    a family's models carry the same). EvaluateError saying what the store holds when it has none of it."""
    import bentoml

    names = store.families().get(name, [])
    for stored in sorted(names, key=lambda n: n != store.model_name(REFERENCE_BACKEND, family_name=name)):
        try:
            return store.describe(bentoml.models.get(f"{stored}:latest"))
        except Exception:  # unreadable: another of its models says the same
            continue
    raise EvaluateError(family.missing_reason(name) or f"no model of family {name!r} in the store can be read")


def chosen_backends(asked: str | None, known: Sequence[str]) -> list[str] | None:
    """``--backends a,b`` checked against ``known`` (EvaluateError naming the unknown ones); None when not given."""
    if not asked:
        return None
    names = [n.strip() for n in asked.split(",") if n.strip()]
    if unknown := [n for n in names if n not in known]:
        raise EvaluateError(f"--backends: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return names


def with_reference(report: Report) -> Report:
    """Each measured row's top-1 drop against the PyTorch row's, when PyTorch was measured."""
    ref = next((r for r in report.rows if r.backend == REFERENCE_BACKEND and r.top1 is not None), None)
    for row in report.rows:
        if ref is not None and ref.top1 is not None and row.top1 is not None:
            row.drop_pp = round((ref.top1 - row.top1) * 100, 4)
    report.reference = f"{REFERENCE_BACKEND} (stored FP32 model)" if ref else "none: pytorch was not measured"
    return report


def with_speed(report: Report) -> Report:
    """Each row's req/s served at choice.SERVED_USERS clients by ``make bench`` on this machine, where measured."""
    rates, why = choice.served_here(choice.served_result(), hardware.probe())
    for row in report.rows:
        row.req_per_s = (rates or {}).get(row.backend)
    report.extra["req_per_s_source"] = why if rates else f"none: {why}"
    return report


def in_process(root: Path, backends: Sequence[str] | None, progress: Progress) -> Report:
    """Each backend of this process's family (FASTINFER_MODEL) opened from the store and run on the photos.
    A backend that cannot run here or fails to load is a row saying why."""
    name = store.family()
    info = family_info(name)
    sets: dict[tuple[tuple[str, ...], PreprocessSpec], EvalSet] = {}

    def photos(labels: list[str], spec: PreprocessSpec) -> EvalSet:
        key = (tuple(labels), spec)
        if key not in sets:  # once per family, unless one of its models was stored with other labels
            sets[key] = accuracy.load(root, labels, spec, progress)
        return sets[key]

    images = photos(info.categories, info.preprocess)  # the folder checked before any engine loads
    names = backends if backends is not None else [n for n in SPECS if n != "coreml"]  # coreml-batched: its models
    rows = []
    for backend in names:
        if (why := unavailable_reason(backend)) is not None:
            rows.append(Row(backend, status="not measured", note=why))
            continue
        spec = SPECS[backend]
        stored = store.find(spec.artifact, spec.static_batches[0])
        mine = info if stored is None else store.describe(stored)
        try:
            engine = open_engine(backend)
        except Exception as exc:  # a model that cannot load here: a row, not a crash
            rows.append(Row(backend, status="not measured", note=f"could not be loaded: {type(exc).__name__}: {exc}"))
            continue
        result = accuracy.measure(backend, engine, photos(mine.categories, mine.preprocess), progress,
                                  spec.rows_independent)  # fmt: skip
        rows.append(Row.of(backend, accuracy.run_precision(backend, engine.describe()), result, None))
    skipped = {s.path: s for e in sets.values() for s in e.skipped}
    report = Report(str(root.resolve()), len(images.targets), list(skipped.values()), images.unevaluated,
                    len(images.labels), "", rows, {"family": name, "via": "in process"})  # fmt: skip
    return with_speed(with_reference(report))


def auth_headers() -> dict[str, str]:
    """For a server with API keys: FASTINFER_API_KEY as a Bearer token (never a command-line argument)."""
    key = os.environ.get("FASTINFER_API_KEY", "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def _error(response: Any) -> tuple[str, str]:
    """(code, message) of a FastInfer error answer, or its status and text when it is not one."""
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except Exception:
        return str(response.status_code), response.text[:200]


def through_server(
    url: str,
    root: Path,
    backends: Sequence[str] | None,
    progress: Progress,
    family_name: str | None = None,
    clients: int = HTTP_CLIENTS,
) -> Report:
    """Each backend of a running server, asked about every photo by ``POST /classify`` (the server decodes
    and preprocesses it). The folder is checked against the labels of the family the server says it serves
    (``family_name`` when given: the server must serve it), as this machine's store holds them."""
    import httpx

    url = url.rstrip("/")
    headers = {**auth_headers(), "Cache-Control": "no-cache, no-store"}
    with httpx.Client(timeout=HTTP_TIMEOUT_S, headers=headers) as client:
        try:
            listed = client.get(f"{url}/backends")
        except httpx.HTTPError as exc:
            raise EvaluateError(f"no FastInfer server answers at {url}: {type(exc).__name__}: {exc}") from None
        if listed.status_code != 200:
            raise EvaluateError(f"{url}/backends answered {listed.status_code}: {_error(listed)[1]}")
        body = listed.json()
        said = body.get("family", {}).get("name") if isinstance(body.get("family"), dict) else None
        if family_name and said and said != family_name:
            raise EvaluateError(f"{url} serves model family {said!r}, not {family_name!r} (--model)")
        name = family_name or said or store.family()
        try:
            info = family_info(name)
        except EvaluateError as exc:
            raise EvaluateError(f"{exc} (--url checks the photos' folders against the labels in this machine's "
                                "store)") from None  # fmt: skip
        folder = accuracy.scan(root, info.categories)
        k = min(accuracy.TOP_K, len(info.categories))
        served = {b["name"]: b for b in body["backends"]}
        names = backends if backends is not None else [n for n, b in served.items() if b["available"]]
        rows, skipped = [], {}
        for backend in names:
            entry = served.get(backend)
            if entry is None or not entry["available"]:
                why = "this server does not serve it" if entry is None else entry.get("reason") or "unavailable"
                rows.append(Row(backend, status="not measured", note=f"{url}: {why}"))
                continue
            best, targets, failed = _ask_all(client, url, backend, folder, k, clients, progress, skipped)
            if failed is not None or not best:
                rows.append(Row(backend, status="not measured", note=failed or "no photo could be classified"))
                continue
            rows.append(Row.of(backend, _precision(backend, entry), accuracy.ranked_accuracy(best, targets), None))
    stray = [Skipped(str(p), "not inside a class folder") for p in folder.stray]
    images = len(folder.files) - len(skipped)
    report = Report(str(root.resolve()), images, stray + list(skipped.values()), folder.unevaluated,
                    len(info.categories), "", rows, {"family": name, "via": f"POST {url}/classify"})  # fmt: skip
    return with_speed(with_reference(report))


def _ask_all(
    client: Any,
    url: str,
    backend: str,
    folder: EvalFolder,
    k: int,
    clients: int,
    progress: Progress,
    skipped: dict[str, Skipped],
) -> tuple[list[list[int]], list[int], str | None]:
    """Every photo of ``folder`` to ``backend`` through ``POST /classify``, ``clients`` at a time: each answered
    photo's ranked class indices and its target, and the first failure that is the server's (then the backend
    is not measured). A photo the server refuses as such (not an image, too large) goes into ``skipped``."""
    import httpx

    def ask(path: Path) -> tuple[int, Any]:
        """(200, the answer's top_k), (status, (code, message)), or (0, why the request failed)."""
        try:
            answer = client.post(f"{url}/classify", files={"image": (path.name, path.read_bytes())},
                                 data={"backend": backend, "top_k": str(k)})  # fmt: skip
        except (httpx.HTTPError, OSError) as exc:
            return 0, ("request_failed", f"{type(exc).__name__}: {exc}")
        return answer.status_code, answer.json()["top_k"] if answer.status_code == 200 else _error(answer)

    best: list[list[int]] = []
    targets: list[int] = []
    failed = None
    total = len(folder.files)
    with ThreadPoolExecutor(clients) as pool:
        answers = zip(folder.files, folder.targets, pool.map(ask, folder.files), strict=True)
        for done, (path, target, (status, answer)) in enumerate(answers, 1):
            if status == 200:
                best.append([int(p["index"]) for p in answer])
                targets.append(target)
            elif answer[0] in SKIPPED_CODES:
                skipped[str(path)] = Skipped(str(path), answer[1])
            elif failed is None:  # the server's fault, not the photo's
                failed = f"{path.name}: {status or 'no answer'} {answer[0]}: {answer[1]}"
            if done % accuracy.BATCH == 0 or done == total:
                progress(backend, done, total)
    return best, targets, failed


def _precision(backend: str, entry: dict[str, Any]) -> str:
    """What a served backend computes in, from its /backends entry (its runner's describe())."""
    return accuracy.run_precision(backend, entry.get("runs_on") or {})


def evaluate(
    root: Path,
    backends: str | None = None,
    url: str | None = None,
    progress: Progress | None = None,
    family_name: str | None = None,
) -> Report:
    """The accuracy report of a family (default: this process's) on ``root``; ``url``: through that server."""
    progress = progress or accuracy.printer()
    names = chosen_backends(backends, list(SPECS))
    if url:
        return through_server(url, root, names, progress, family_name)
    if not family_name:
        return in_process(root, names, progress)
    before = os.environ.get(store.FAMILY_ENV)
    os.environ[store.FAMILY_ENV] = store.check_family(family_name)  # what the store's lookups and engines read
    try:
        return in_process(root, names, progress)
    finally:
        if before is None:
            os.environ.pop(store.FAMILY_ENV, None)
        else:
            os.environ[store.FAMILY_ENV] = before


def plot(report: Report, path: Path) -> Path:
    """Top-1 against served req/s per backend where ``make bench`` measured them, else top-1 per backend."""
    from fastinfer.measure.plots import plot_accuracy

    plot_accuracy([r.as_dict() for r in report.rows], path, report.extra.get("family", ""), report.images)
    return path.resolve()
