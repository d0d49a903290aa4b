"""``fastinfer evaluate``: the accuracy of what is stored for a family, on the user's labelled photos.

In process (each backend's engine opened from this machine's store), or through a running server's
``POST /classify`` (``--url``, uncached): answers are then scored by the label names they return against the
photo's folder, so no local store is needed. The drop is measured against PyTorch on the same photos; the speed
beside it is what ``make bench`` served of this family on this machine, where it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastinfer.catalog import choice, holdings, store
from fastinfer.catalog.backends import SPECS, open_engine
from fastinfer.catalog.store import PreprocessSpec, StoredModelInfo
from fastinfer.common import hardware
from fastinfer.common.client import auth_headers
from fastinfer.measure import accuracy
from fastinfer.measure.accuracy import EvalFolder, EvalSet, Progress, Report, Row, Skipped

REFERENCE_BACKEND = "pytorch"
HTTP_CLIENTS = 4  # enough to keep a small server's batches full, few enough to leave it the cores
HTTP_TIMEOUT_S = 120
# A server's answers about the file itself (a proxy may answer 413/415 without our body): the photo is skipped.
# Any other failure is the server's, and the backend is not measured.
PHOTO_CODES = ("invalid_image", "image_too_large", "payload_too_large", "unsupported_media_type")
PHOTO_STATUSES = (413, 415)


class EvaluateError(RuntimeError):
    """What stops an evaluation as a whole (no such family, no server at the URL): one line."""


def _named(name: str, by_option: bool) -> str:
    """How the user named the family: ``--model NAME`` or ``FASTINFER_MODEL=NAME``."""
    return f"--model {name}" if by_option else f"{store.FAMILY_ENV}={name}"


def family_info(name: str, by_option: bool = False) -> StoredModelInfo:
    """Labels and preprocessing of a family, from one of the stored models a server would serve (PyTorch's first)."""
    import bentoml

    names = holdings.held().get(name, [])
    if not names:
        raise EvaluateError(str(holdings.missing_reason(name, "evaluate", lambda n: _named(n, by_option))))
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


def with_reference(report: Report, reference: str) -> Report:
    """Each measured row's top-1 drop against the PyTorch row's, when PyTorch was measured."""
    ref = next((r for r in report.rows if r.backend == REFERENCE_BACKEND and r.top1 is not None), None)
    for row in report.rows:
        if ref is not None and ref.top1 is not None and row.top1 is not None:
            row.drop_pp = accuracy.top1_drop_pp(ref.top1, row.top1)
    report.reference = reference if ref else f"none: {REFERENCE_BACKEND} was not measured"
    return report


def with_speed(report: Report) -> Report:
    """Each row's req/s served by ``make bench`` on this machine, where it measured this report's family."""
    name = str(report.extra.get("family") or store.DEFAULT_FAMILY)
    rates, why = choice.served_here(choice.served_result(), hardware.probe(), name)
    for row in report.rows:
        row.req_per_s = (rates or {}).get(row.backend)
    report.extra["req_per_s_source"] = why if rates else f"none: {why}"
    return report


def in_process(root: Path, backends: Sequence[str] | None, progress: Progress, name: str, by_option: bool) -> Report:
    """Each backend of family ``name`` opened from the store and run on the photos (or a row saying why not)."""
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
    rows = []
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
        result = accuracy.measure(backend, engine, photos(mine.categories, mine.preprocess), progress,
                                  spec.rows_independent)  # fmt: skip
        rows.append(Row.of(backend, accuracy.run_precision(backend, engine.describe()), result, None))
    skipped = {s.path: s for e in sets.values() for s in e.skipped}
    report = Report(str(root.resolve()), len(images.targets), list(skipped.values()), images.unevaluated,
                    len(images.labels), "", rows, {"family": name, "via": "in process"})  # fmt: skip
    return with_speed(with_reference(report, f"{REFERENCE_BACKEND} (stored FP32 model)"))


def _error(response: Any) -> tuple[str, str]:
    """(code, message) of a FastInfer error answer, or its status and text when it is not one."""
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except Exception:
        return str(response.status_code), " ".join(response.text[:200].split())


def served_family(url: str, body: Any) -> tuple[str | None, list[str] | None, int | None, dict[str, dict[str, Any]]]:
    """From a GET /backends answer: the family's name, its labels in index order and class count (None where
    the server does not say), and each backend's entry by name. EvaluateError when it is not FastInfer's."""
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
    clients: int = HTTP_CLIENTS,
) -> Report:
    """Each backend of a running server, asked about every photo by ``POST /classify``, the folder checked
    against the labels the server lists. Nothing of this machine's model store is read."""
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
        rows, skipped = [], {}
        for backend in names:
            entry = served.get(backend)
            if entry is None or not entry.get("available"):
                why = "this server does not serve it" if entry is None else entry.get("reason") or "unavailable"
                rows.append(Row(backend, status="not measured", note=f"{url}: {why}"))
                continue
            best, targets, failed = _ask_all(client, url, backend, folder, k, clients, progress, skipped)
            if failed is not None or not best:
                rows.append(Row(backend, status="not measured", note=failed or "no photo could be classified"))
                continue
            rows.append(Row.of(backend, _precision(backend, entry), accuracy.ranked_accuracy(best, targets), None))
    images = len(folder.files) - len(skipped)
    source = "the server (GET /backends)" if labels else "the folders' names: the server lists none"
    extra = {"family": name, "via": f"POST {url}/classify", "labels_from": source}
    report = Report(str(root.resolve()), images, folder.skipped + list(skipped.values()), folder.unevaluated,
                    classes or len(folder.labels), "", rows, extra)  # fmt: skip
    return with_speed(with_reference(report, f"{REFERENCE_BACKEND} (served by {url})"))


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
    """Every photo of ``folder`` to ``backend``, ``clients`` at a time: each answer's ranked label indices (-1:
    unknown), its target, and the server's first failure; a photo the server refuses goes into ``skipped``."""
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
    failed = None
    total = len(folder.files)
    with ThreadPoolExecutor(clients) as pool:
        answers = zip(folder.files, folder.targets, pool.map(ask, folder.files), strict=True)
        for done, (path, target, (kind, said)) in enumerate(answers, 1):
            if kind == "ok":
                best.append([index.get(label, -1) for label in said])
                targets.append(target)
            elif kind == "photo":
                skipped[str(path)] = Skipped(str(path), said)
            elif failed is None:  # the server's fault, not the photo's
                failed = said
            if done % accuracy.BATCH == 0 or done == total:
                progress(backend, done, total)
    return best, targets, failed


def _precision(backend: str, entry: dict[str, Any]) -> str:
    """What a served backend computes in, from its /backends entry (its runner's describe())."""
    runs_on = entry.get("runs_on")
    return accuracy.run_precision(backend, runs_on if isinstance(runs_on, dict) else {})


def evaluate(
    root: Path,
    backends: str | None = None,
    url: str | None = None,
    progress: Progress | None = None,
    family_name: str | None = None,
) -> Report:
    """The accuracy report of a family on ``root`` (through the server at ``url``, if given)."""
    progress = progress or accuracy.printer()
    names = chosen_backends(backends, list(SPECS))
    chosen = store.check_family(family_name) if family_name else None
    if url:
        report = through_server(url, root, names, progress, chosen)
    else:
        report = in_process(root, names, progress, chosen or store.family(), chosen is not None)
    if not any(r.status == "measured" for r in report.rows):
        said = "; ".join(f"{r.backend}: {r.note or r.status}" for r in report.rows)
        raise EvaluateError(" ".join(f"no backend was measured: {said}".split()))  # one line
    return report


def plot(report: Report, path: Path) -> Path:
    """Top-1 against served req/s per backend where ``make bench`` measured them, else top-1 per backend."""
    from fastinfer.measure.plots import plot_accuracy

    shown = accuracy.visible  # names a server gave: their control characters drawn as escapes, not as boxes
    rows = [{k: shown(v) if isinstance(v, str) else v for k, v in r.as_dict().items()} for r in report.rows]
    plot_accuracy(rows, path, shown(str(report.extra.get("family", ""))), report.images,
                  shown(str(report.extra.get("req_per_s_source", ""))))  # fmt: skip
    return path.resolve()
