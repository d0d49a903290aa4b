"""Top-1 and top-5 accuracy of a model family's backends on the user's own labelled photos.

The photos are an ImageFolder-layout directory, one sub-folder per label, run through the service's own
preprocessing; a file that cannot be decoded or exceeds FASTINFER_MAX_PIXELS is skipped and counted. The
prepared photos are held in memory (150 kB each at a 224 crop): an eval folder is a sample, not a dataset.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure.photos import UnusablePhoto, photo_pixels
from fastinfer.measure.plots import table

BATCH = 16  # images per engine call: OpenVINO gains nothing beyond 8-16 rows
TOP_K = 5
LISTED = 8  # names listed in a one-line error before "and N more"

Progress = Callable[[str, int, int], None]  # (what, done, total), after each batch


class EvalDirError(ValueError):
    """An eval folder that cannot be measured as given: said in one line."""


@dataclass(frozen=True)
class Skipped:
    """A file of the eval folder left out of every measurement, and why."""

    path: str
    why: str


@dataclass(frozen=True)
class EvalFolder:
    """An ImageFolder-layout directory matched against a family's labels (nothing decoded yet)."""

    root: Path
    files: list[Path]  # sorted by class folder, then path
    targets: list[int]  # each file's class, as an index into the labels
    unevaluated: list[str]  # labels with no folder: not measured
    labels: list[str]  # what ``targets`` index: the labels, else the class folders' names
    skipped: list[Skipped]  # left out before decoding: files outside any class folder, links not followed, ...


@dataclass(frozen=True)
class EvalSet:
    """The decodable photos of an eval folder through the service's preprocessing, and what was skipped."""

    root: Path
    pixels: np.ndarray  # uint8 [N, crop, crop, 3]
    targets: np.ndarray  # int64 [N]
    files: list[Path]  # the N files measured
    skipped: list[Skipped]
    unevaluated: list[str]
    labels: list[str]


@dataclass(frozen=True)
class Accuracy:
    images: int
    top1: float  # 0..1
    top5: float  # 0..1 (top-C when the family has C < 5 classes)


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def scan(root: Path, labels: Sequence[str] | None) -> EvalFolder:
    """The files of an ImageFolder-layout directory, each with its class's index in ``labels`` (None: every class
    folder is a label, sorted). EvalDirError when it cannot be measured; hidden entries are ignored."""
    where = f"eval folder {root}"
    if not root.exists():
        raise EvalDirError(f"{where} does not exist")
    if not root.is_dir():
        raise EvalDirError(f"{where} is not a directory (ImageFolder layout: one sub-folder per class)")
    visible = [p for p in sorted(root.iterdir()) if not p.name.startswith(".")]
    folders = [p for p in visible if p.is_dir()]
    labels = [p.name for p in folders] if labels is None else labels
    if not folders:
        raise EvalDirError(f"{where} has no class folders (ImageFolder layout: one sub-folder per class, named as "
                           "its label)")  # fmt: skip
    index = {label: i for i, label in enumerate(labels)}
    unknown = [p.name for p in folders if p.name not in index]
    if unknown:
        raise EvalDirError(
            f"{where}: {len(unknown)} class folder(s) not among the family's {len(labels)} labels: "
            f"{_listed(unknown)} (labels: {_listed(list(labels))})"
        )
    files: list[Path] = []
    targets: list[int] = []
    skipped = [Skipped(str(p), "not inside a class folder") for p in visible if p.is_file()]
    # A symlinked class folder is followed (the user named it); below one, sub-folder links are not.
    skipped += [Skipped(str(p), why) for p in visible if not p.is_dir() and (why := _not_read(p)) is not None]
    for folder in folders:
        found = [p for p in sorted(folder.rglob("*")) if not _hidden(p, folder)]
        mine = [p for p in found if p.is_file()]
        files.extend(mine)
        targets.extend([index[folder.name]] * len(mine))
        skipped += [Skipped(str(p), why) for p in found if (why := _not_read(p)) is not None]
    if not files:
        raise EvalDirError(f"{where}: its {len(folders)} class folder(s) hold no files")
    present = {p.name for p in folders}
    unevaluated = [label for label in labels if label not in present]
    return EvalFolder(root, files, targets, unevaluated, list(labels), skipped)


def _not_read(path: Path) -> str | None:
    """Why an entry of the eval folder is neither read as a photo nor walked into (None: it is one of those)."""
    if path.is_file() or (path.is_dir() and not path.is_symlink()):
        return None
    if path.is_symlink():
        return "a symlink to a folder: not followed" if path.is_dir() else "a dangling symlink: its target is gone"
    return "not a regular file"


def _hidden(path: Path, top: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(top).parts)


def load(root: Path, labels: Sequence[str], spec: PreprocessSpec, progress: Progress | None = None) -> EvalSet:
    """:func:`scan`, then every file through the service's preprocessing, skipping those it refuses (as the server
    would: FASTINFER_MAX_PIXELS holds here too)."""
    from fastinfer.catalog.config import get_settings

    folder = scan(root, labels)
    try:
        limit = get_settings().max_pixels
    except ValueError as exc:  # a bad setting: the same one would stop a server
        raise EvalDirError(f"the settings do not hold, so the eval photos' pixel limit is unknown: {exc}") from None
    skipped = list(folder.skipped)
    pixels: list[np.ndarray] = []
    targets: list[int] = []
    kept: list[Path] = []
    total = len(folder.files)
    for done, (path, target) in enumerate(zip(folder.files, folder.targets, strict=True), 1):
        try:
            pixels.append(photo_pixels(path, spec, limit))
        except UnusablePhoto as exc:  # a bad file is counted, never a crash
            skipped.append(Skipped(str(path), str(exc)))
        else:
            targets.append(target)
            kept.append(path)
        if progress is not None and (done % BATCH == 0 or done == total):
            progress("preprocessing", done, total)
    if not pixels:
        raise EvalDirError(f"eval folder {root}: none of its {total} file(s) could be decoded as an image "
                           f"(first: {skipped[-1].path}: {skipped[-1].why})")  # fmt: skip
    targets_array = np.asarray(targets, dtype=np.int64)
    return EvalSet(root, np.stack(pixels), targets_array, kept, skipped, folder.unevaluated, list(labels))


def ranked(logits: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Each image's ``k`` best classes, best first, ties towards the lower index as the service ranks them."""
    logits = np.asarray(logits)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, C], not {list(logits.shape)}")
    return np.argsort(-logits, axis=1, kind="stable")[:, : min(k, logits.shape[1])]


def ranked_accuracy(best: Sequence[Sequence[int]] | np.ndarray, targets: Sequence[int] | np.ndarray) -> Accuracy:
    """Top-1 and top-5 accuracy from each image's best classes, best first, against its class index."""
    if len(targets) == 0:
        raise ValueError("no images to measure accuracy on")
    if len(best) != len(targets):
        raise ValueError(f"{len(best)} ranked answers for {len(targets)} targets")
    top1, top5 = ([int(t) in [int(c) for c in b[:k]] for b, t in zip(best, targets, strict=True)] for k in (1, TOP_K))
    return Accuracy(len(targets), float(np.mean(top1)), float(np.mean(top5)))


def accuracy(logits: np.ndarray, targets: Sequence[int] | np.ndarray) -> Accuracy:
    return ranked_accuracy(ranked(logits), targets)


def top1_drop_pp(reference_top1: float, top1: float) -> float:
    """Percentage points ``top1`` falls below ``reference_top1``, rounded so that 1 image in 100 is exactly 1."""
    return round((reference_top1 - top1) * 100, 6)


def answers(logits: np.ndarray) -> np.ndarray:
    """Each image's top-1 class, ties towards the lower index as the service ranks them."""
    return ranked(logits, 1)[:, 0]


# --- a backend against the reference on the same photos ------------------------------------------------

CONFIDENCE = 0.95
DEFAULT_MAX_DROP_PP = 1.0  # top-1 points below PyTorch's: the build's --max-accuracy-drop and evaluate's limit
SETTLE_SEARCHED = 20_000  # photos: the exact search stops here (said as "more than"; a larger interval takes seconds)
INTERVAL_METHOD = (
    "exact (Clopper-Pearson) on the discordant pairs: their share of the photos and the share of them lost, "
    "each at 97.5%, combined (Bonferroni) into at least 95%"
)


def clopper_pearson(x: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact two-sided interval of a binomial proportion seen as ``x`` of ``n``: beta quantiles."""
    if not 0 <= x <= n or n <= 0:
        raise ValueError(f"{x} successes of {n} trials")
    tail = (1 - confidence) / 2
    low = 0.0 if x == 0 else float(beta.ppf(tail, x, n - x + 1))
    high = 1.0 if x == n else float(beta.ppf(1 - tail, x + 1, n - x))
    return low, high


@dataclass(frozen=True)
class Paired:
    """A backend's top-1 against the reference's on the same photos: the four kinds of pair, how many answers
    changed, and the 95% interval of the top-1 drop (percentage points; positive: the backend is worse)."""

    images: int
    both_right: int
    both_wrong: int
    only_reference_right: int  # the photos the backend lost
    only_backend_right: int  # the photos it gained
    changed: int  # top-1 answers that differ from the reference's, right or wrong
    drop_low_pp: float
    drop_high_pp: float

    @property
    def drop_pp(self) -> float:
        return top1_drop_pp(self.only_reference_right / self.images, self.only_backend_right / self.images)

    @property
    def net_photos(self) -> int:
        """Photos lost less photos gained: the drop in photos."""
        return self.only_reference_right - self.only_backend_right

    @property
    def agreement(self) -> float:
        """The share of photos whose top-1 answer is the reference's."""
        return 1 - self.changed / self.images

    def photos_to_settle(self, limit_pp: float) -> int | None:
        """The fewest photos that, at the rates seen here, put the drop's exact interval wholly on one side of
        ``limit_pp`` (SETTLE_SEARCHED + 1: more than were searched); None when no number would (the drop is the
        limit)."""
        n, lost, gained = self.images, self.only_reference_right, self.only_backend_right
        drop = self.net_photos / n
        spread = math.sqrt(max((lost + gained) / n - drop**2, 0.0))
        gap = abs(drop - limit_pp / 100)
        if gap < 1e-12:
            return None
        rough = n + 1 if spread == 0 else max(n + 1, math.ceil((1.959964 * spread / gap) ** 2))  # z of 97.5%

        def settles(photos: int) -> bool:
            scaled_lost = round(lost * photos / n)  # rounded apart, the two could exceed the photos
            scaled_gained = min(round(gained * photos / n), photos - scaled_lost)
            low, high = drop_interval(scaled_lost, scaled_gained, photos)
            return low > limit_pp or high <= limit_pp

        low, high = n, rough
        while high <= SETTLE_SEARCHED and not settles(high):
            low, high = high, math.ceil(high * 1.5)
        if high > SETTLE_SEARCHED:
            return SETTLE_SEARCHED + 1
        while high - low > 1:  # the fewest that settle, near enough (rounding makes it not quite monotonic)
            mid = (low + high) // 2
            low, high = (low, mid) if settles(mid) else (mid, high)
        return high

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "drop_pp": self.drop_pp, "agreement": self.agreement, "method": INTERVAL_METHOD}


def drop_interval(lost: int, gained: int, images: int) -> tuple[float, float]:
    """The top-1 drop's interval in points from the photos only the reference got right (``lost``) and only the
    backend got right (``gained``) of ``images``. The drop is q(2p - 1), q the share of photos whose rightness
    differs, p the share of those lost; each gets an exact (Clopper-Pearson) interval at half the error
    (Bonferroni), so a few discordant pairs stay honest: none of 60 still allows a drop of 7 points."""
    half = 1 - (1 - CONFIDENCE) / 2
    discordant = lost + gained
    q_low, q_high = clopper_pearson(discordant, images, half)
    p_low, p_high = clopper_pearson(lost, discordant, half) if discordant else (0.0, 1.0)
    e_low, e_high = 2 * p_low - 1, 2 * p_high - 1  # the drop per discordant photo, -1 to 1
    low = e_low * (q_high if e_low < 0 else q_low)
    high = e_high * (q_high if e_high > 0 else q_low)
    return round(low * 100, 6), round(high * 100, 6)


def paired(reference_answers: np.ndarray, backend_answers: np.ndarray, targets: np.ndarray) -> Paired:
    """The pairs of two top-1 answer lists on the same photos, and the drop's interval (:func:`drop_interval`)."""
    reference_answers, backend_answers, targets = map(np.asarray, (reference_answers, backend_answers, targets))
    if not len(targets) or not len(reference_answers) == len(backend_answers) == len(targets):
        raise ValueError(f"{len(reference_answers)} and {len(backend_answers)} answers for {len(targets)} targets")
    ref, mine = reference_answers == targets, backend_answers == targets
    lost, gained, n = int((ref & ~mine).sum()), int((~ref & mine).sum()), len(targets)
    low, high = drop_interval(lost, gained, n)
    return Paired(
        images=n,
        both_right=int((ref & mine).sum()),
        both_wrong=int((~ref & ~mine).sum()),
        only_reference_right=lost,
        only_backend_right=gained,
        changed=int((reference_answers != backend_answers).sum()),
        drop_low_pp=low,
        drop_high_pp=high,
    )


def run(
    name: str,
    predict: Callable[[np.ndarray], np.ndarray],
    pixels: np.ndarray,
    progress: Progress | None = None,
    batch: int = BATCH,
) -> np.ndarray:
    """``predict`` over ``pixels`` in batches, with progress after each: the logits [N, C]."""
    out = []
    for start in range(0, len(pixels), batch):
        out.append(np.asarray(predict(pixels[start : start + batch])))
        if progress is not None:
            progress(name, min(start + batch, len(pixels)), len(pixels))
    return np.concatenate(out)


def artifacts_folder(family: str) -> Path:
    """Where a family's accuracy.json, evaluate.json and evaluate.png go by default: beside it, in the store's home."""
    from fastinfer.common.home import bentoml_home

    return bentoml_home() / "artifacts" / family


def call_size(rows_independent: bool) -> int:
    """Photos per engine call, as served: dynamic INT8 (rows not independent) takes one at a time."""
    return BATCH if rows_independent else 1


def run_precision(backend: str, described: dict[str, Any]) -> str:
    """The precision an engine actually computes in: int8, else what it says, else fp32."""
    if "int8" in backend:
        return "int8"
    if not described.get("precision") and "CoreMLExecutionProvider" in described.get("execution_providers", []):
        return "unknown"  # the CoreML EP may compute in FP16 and does not say (as fastinfer.measure.fidelity)
    said = str(described.get("precision") or "fp32").lower()
    return {"f32": "fp32", "f16": "fp16"}.get(said, said)


@dataclass
class Row:
    """One line of the accuracy table: a backend measured, or why it was not."""

    backend: str
    precision: str | None = None
    images: int = 0
    top1: float | None = None
    top5: float | None = None
    drop_pp: float | None = None  # top-1 percentage points below the reference (negative: above it)
    status: str = "measured"  # measured | not measured | refused | over the limit | ...
    note: str = ""
    paired: Paired | None = None  # against the reference, photo by photo: the drop's interval and the agreement

    @classmethod
    def of(cls, backend: str, precision: str, result: Accuracy, reference: Accuracy | None = None, **kw: Any) -> Row:
        drop = None if reference is None else top1_drop_pp(reference.top1, result.top1)
        return cls(backend, precision, result.images, result.top1, result.top5, drop, **kw)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "paired": None if self.paired is None else self.paired.as_dict()}


@dataclass
class Report:
    """The accuracy table and what it was measured on, as printed and written as JSON."""

    eval_dir: str
    images: int
    skipped: list[Skipped]
    unevaluated: list[str]
    labels: int
    reference: str  # what the drop is measured against
    rows: list[Row] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "eval_dir": self.eval_dir,
            "images": self.images,
            "skipped": len(self.skipped),
            "skipped_files": [asdict(s) for s in self.skipped],
            "labels": self.labels,
            "unevaluated_labels": self.unevaluated,
            "reference": self.reference,
            **self.extra,
            "rows": [r.as_dict() for r in self.rows],
        }

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2))
        return path.resolve()

    def summary(self) -> list[str]:
        """What the table was measured on, in lines: images, skipped files, labels left out."""
        lines = [f"{self.images} images of {self.eval_dir}, drop vs {self.reference}"]
        if self.skipped:
            lines.append(f"{len(self.skipped)} file(s) skipped:")
            lines.extend(f"  {s.path}: {s.why}" for s in self.skipped[:LISTED])
            if len(self.skipped) > LISTED:
                lines.append(f"  ... and {len(self.skipped) - LISTED} more (all in the JSON)")
        if self.unevaluated:
            lines.append(f"{len(self.unevaluated)} of {self.labels} labels have no folder, not evaluated: "
                         f"{_listed(self.unevaluated)}")  # fmt: skip
        return [visible(line) for line in lines]

    def table(self) -> str:
        with_pairs = any(r.paired is not None for r in self.rows)
        head = ["backend", "precision", "images", "top-1", "top-5", "drop vs reference (pp)"]
        head += ["drop's 95% interval (pp)", "same answer (changed)"] if with_pairs else []
        head += ["status"]
        rows = []
        for r in self.rows:
            cells = [
                r.backend,
                r.precision or "—",
                str(r.images) if r.images else "—",
                _pct(r.top1),
                _pct(r.top5),
                "—" if r.drop_pp is None else f"{r.drop_pp:+.2f}",
            ]
            if with_pairs:
                p = r.paired
                cells += ["—", "—"] if p is None else [
                    f"{p.drop_low_pp:+.2f} to {p.drop_high_pp:+.2f}", f"{p.agreement:.1%} ({p.changed})"
                ]  # fmt: skip
            cells += [r.status + (f": {r.note}" if r.note else "")]
            rows.append(map(visible, cells))
        return table(head, rows)


def visible(text: str) -> str:
    """``text`` as a terminal shows it literally: each non-printable character (ESC, CR, newline, bidi override,
    zero-width mark) as its Python escape, so that a server's names cannot move the cursor or clear the screen."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


def printer(write: Callable[[str], None] | None = None, every_s: float = 2.0) -> Progress:
    """A progress callback writing ``"onnx-int8: 64/120 images"`` at most every ``every_s`` s, and the last step."""
    out = write or (lambda line: print(line, file=sys.stderr, flush=True))
    last: dict[str, float] = {}

    def progress(what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - last.get(what, -every_s) >= every_s:
            last[what] = now
            out(visible(f"{what}: {done}/{total} images"))

    return progress
