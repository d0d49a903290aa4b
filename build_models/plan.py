"""The build as a plan: every export of a family in the table's order, each checked, then stored or refused, and
the one table the build ends with (stored, up to date, refused and skipped, each with why)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

STORED, UP_TO_DATE, REFUSED, SKIPPED = "stored", "up to date", "refused", "skipped"


@dataclass(frozen=True)
class Job:
    """One model to build: its store name, its artifact, its batch (None: dynamic), and the artifact whose
    export it converts, if any (openvino-int8 converts onnx-int8's)."""

    name: str
    artifact: str
    batch: int | None = None
    built_from: str | None = None


@dataclass(frozen=True)
class Outcome:
    name: str  # store name
    artifact: str
    status: str  # STORED | UP_TO_DATE | REFUSED | SKIPPED
    why: str = ""


class BuildRefused(RuntimeError):
    """The build's last word when it refused any export (diverging, not loading, or shown to lose accuracy): the
    others were built and stored; ``outcomes`` holds the whole table."""

    def __init__(self, message: str, outcomes: Sequence[Outcome]) -> None:
        super().__init__(message)
        self.outcomes = list(outcomes)


def jobs(
    names: Iterable[str],
    batches: Mapping[str, Sequence[int | None]],
    built_from: Mapping[str, str | None],
    named: Callable[[str, int | None], str],
) -> list[Job]:
    """The plan in ``batches``' order (the table's, whatever the order asked: a conversion after its source);
    ``named(artifact, batch)`` gives the store name."""
    wanted = set(names)
    return [
        Job(named(artifact, batch), artifact, batch, built_from.get(artifact))
        for artifact, sizes in batches.items()
        if artifact in wanted
        for batch in sizes
    ]


def blocked(job: Job, done: Sequence[Outcome]) -> str | None:
    """Why ``job`` cannot be built from what this build made: the export it converts was refused."""
    source = next((o for o in done if o.artifact == job.built_from and o.status == REFUSED), None)
    if source is None:
        return None
    return f"converts {source.name}'s export, refused in this build"


def table(outcomes: Sequence[Outcome]) -> list[str]:
    """The build's last table, one line per model, as Markdown (a ``|`` in a reason escaped)."""
    lines = ["| model | outcome | why |", "|---|---|---|"]
    lines += [f"| {o.name} | {o.status} | {o.why.replace('|', chr(92) + '|') or '—'} |" for o in outcomes]
    counts = {s: sum(o.status == s for o in outcomes) for s in (STORED, UP_TO_DATE, REFUSED, SKIPPED)}
    lines.append("build: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return lines


def refusal(outcomes: Sequence[Outcome]) -> BuildRefused | None:
    """The exception the build ends with when it refused any model: one line naming them all."""
    names = [o.name for o in outcomes if o.status == REFUSED]
    if not names:
        return None
    built = sum(o.status in (STORED, UP_TO_DATE) for o in outcomes)
    return BuildRefused(
        f"{len(names)} model(s) refused, nothing stored for them ({built} other(s) stored or up to date; the table "
        f"above says why): {', '.join(names)}",
        outcomes,
    )
