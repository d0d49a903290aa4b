"""Store health: every stored model's files against the size and sha256 recorded when it was built.

A truncated or altered file looks current by its labels: ``build_models`` records every file it stores
(:func:`record`), calls a model up to date only once they match (:func:`check`), and a runner refuses one that
does not. Checking the whole store takes ~0.35 s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastinfer.common.files import file_sha256

if TYPE_CHECKING:
    from bentoml import Model

    from fastinfer.catalog.store import PreprocessSpec

FILES_KEY = "files"  # metadata: {relative POSIX path: {"bytes": size, "sha256": hex}}
NOT_RECORDED = "no sha256 recorded for its files (stored by an older build)"
BENTOML_FILES = frozenset({"model.yaml", "custom_objects.pkl"})  # BentoML's own, not the build's output


class CorruptModel(RuntimeError):
    """A stored model whose files differ from what was built; the message says which and how to rebuild."""


@dataclass(frozen=True)
class Health:
    """One stored model's files against their record."""

    tag: str
    artifact: str  # its build step (label ``backend``): what ``--only`` takes
    weights: str  # its ``weights`` label
    recorded: bool  # False: built before records were kept, so it cannot be verified
    problems: tuple[str, ...] = ()  # one per file that is missing or differs
    family: str = ""  # its ``family`` label ("" = the default family's: a model stored before families)
    preprocess: PreprocessSpec | None = None  # what it was built with (None: not known)

    @property
    def intact(self) -> bool:
        return self.recorded and not self.problems

    @property
    def corrupt(self) -> bool:
        return bool(self.problems)

    def why(self) -> str:
        """ "" when intact, else what is wrong, in one line."""
        return "; ".join(self.problems) if self.recorded else NOT_RECORDED

    def as_dict(self) -> dict[str, Any]:
        state = "intact" if self.intact else "corrupt" if self.corrupt else "unverified"
        return {"tag": self.tag, "state": state, "why": self.why()}


def record(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under a model's directory, by its path relative to it."""
    return {
        path.relative_to(directory).as_posix(): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).as_posix() not in BENTOML_FILES
    }


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def compare(directory: Path, recorded: dict[str, Any]) -> list[str]:
    """What differs between a directory's recorded files and their record ([] when all match)."""
    problems: list[str] = []
    for name, expected in recorded.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != expected.get("bytes"):  # a cut-short copy is told without reading it
            problems.append(f"{name} is {_megabytes(size)}, built as {_megabytes(int(expected.get('bytes', 0)))}")
        elif file_sha256(path) != expected.get("sha256"):
            problems.append(f"{name} differs from what was built (sha256)")
    return problems


def check(model: Model) -> Health:
    """A stored model's files against the record its build kept in its metadata."""
    from fastinfer.catalog.store import describe

    labels = model.info.labels
    recorded = model.info.metadata.get(FILES_KEY)
    usable = isinstance(recorded, dict) and bool(recorded)
    return Health(
        tag=str(model.tag),
        artifact=labels.get("backend") or artifact_of(str(model.tag.name)),
        weights=labels.get("weights", ""),
        recorded=usable,
        problems=tuple(compare(Path(model.path), recorded)) if usable else (),
        family=labels.get("family", ""),
        preprocess=describe(model).preprocess,
    )


def artifact_of(name: str) -> str:
    """The build step of a store name ``<family>-<artifact>[-b<N>]`` without a ``backend`` label."""
    from fastinfer.catalog.backends import SPECS

    for artifact in sorted({spec.artifact for spec in SPECS.values()}, key=len, reverse=True):
        if re.search(rf"-{re.escape(artifact)}(-b[0-9]+)?$", name):
            return artifact
    return name.partition("-")[2] or name


def rebuild_command(unhealthy: Iterable[Health]) -> str:
    """The command that rebuilds these models from their source: only them (``--only``) where the command names
    the source exactly, else the whole family (a partial build from another file would mix two sources)."""
    from fastinfer.catalog import rebuild

    by_source: dict[str, list[str]] = {}
    for health in unhealthy:
        source = rebuild.source_args(health.family, health.weights or None, health.preprocess)
        artifacts = by_source.setdefault(source, [])
        if health.artifact not in artifacts:
            artifacts.append(health.artifact)
    return " && ".join(
        f"python -m build_models {source} ({rebuild.WHOLE_FAMILY})"
        if rebuild.needs_files(source)
        else f"python -m build_models --only {','.join(artifacts)} {source}".rstrip()
        for source, artifacts in by_source.items()
    )


def stored_health() -> dict[str, Health]:
    """Every stored model the backend table names, checked, by store name (CoreML's too, off macOS)."""
    from fastinfer.catalog import store
    from fastinfer.catalog.backends import SPECS

    wanted = dict.fromkeys((spec.artifact, batch) for spec in SPECS.values() for batch in spec.static_batches)
    return {
        store.model_name(artifact, batch): check(model)
        for artifact, batch in wanted
        if (model := store.find(artifact, batch)) is not None
    }


def require_intact(models: Iterable[Model]) -> None:
    """Raise :class:`CorruptModel` for the first model whose files differ from their record (none: passes)."""
    for model in models:
        health = check(model)
        if health.corrupt:
            raise CorruptModel(f"{health.tag} is corrupt: {health.why()}; rebuild it: {rebuild_command([health])}")


def unhealthy_reason(backend: str, health: dict[str, Health]) -> str | None:
    """Why a backend must not be served from what is stored (a model of it corrupt), or None."""
    from fastinfer.catalog.backends import SPECS

    bad = [h for name in SPECS[backend].model_names() if (h := health.get(name)) is not None and h.corrupt]
    if not bad:
        return None
    return "; ".join(f"{h.tag} is corrupt: {h.why()}" for h in bad) + f"; rebuild: {rebuild_command(bad)}"


def summary(health: dict[str, Health], seconds: float) -> list[str]:
    """``fastinfer doctor``'s lines about the store: a count, or each model at fault and how to rebuild it."""
    unhealthy = [h for h in health.values() if not h.intact]
    if not unhealthy:
        return [f"{len(health)} stored, every file matches its recorded sha256 (checked in {seconds:.1f}s)"]
    lines = [f"{h.tag}: {'CORRUPT' if h.corrupt else 'unverified'}: {h.why()}" for h in unhealthy]
    return [*lines, f"rebuild them: {rebuild_command(unhealthy)}"]
