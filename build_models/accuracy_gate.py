"""``--eval-dir``: every backend the build makes or keeps, measured on the user's labelled photos beside PyTorch's,
and the INT8/BF16 models shown to lose more than ``--max-accuracy-drop`` refused (docs/backends.md, "The accuracy
gate"). The build calls :meth:`~AccuracyGate.check` before storing an export, :meth:`~AccuracyGate.report_stored` on
a model kept, :meth:`~AccuracyGate.finish` last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from build_models.text import as_text
from fastinfer.catalog.backends import SPECS, open_engine
from fastinfer.common.errors import one_line
from fastinfer.engines import Engine, EngineUnavailable
from fastinfer.measure import accuracy, evaluate
from fastinfer.measure.accuracy import DEFAULT_MAX_DROP_PP, SETTLE_SEARCHED, Accuracy, EvalSet, Paired, Row

if TYPE_CHECKING:
    from build_models.context import BuildContext

BUILD_TIMING_S = 0.5  # each measured engine's warm-up, then timing: brief, a ranking, not a figure to report
GATED_PRECISIONS = ("int8", "bf16")  # FP32 is held to its verification tolerance; CoreML cannot run here
REFERENCE = "PyTorch FP32 (the build's reference)"


class AccuracyRefused(RuntimeError):
    """An INT8/BF16 model whose top-1 on the eval set falls, with 95% confidence, more than the allowed drop below
    PyTorch's."""


@dataclass(frozen=True)
class Verdict:
    """What the gate makes of a paired drop: refused or not, and the words for the table."""

    refused: bool
    settled: bool  # the 95% interval lies wholly on one side of the limit
    note: str


def judge(pairs: Paired, limit_pp: float) -> Verdict:
    """The gate's rule: refused only when the whole 95% interval of the drop is over ``limit_pp`` and more than one
    photo was lost net (one photo of 60 is 1.67 points: refusing on less refuses noise); stored otherwise, with
    what would settle an interval that holds the limit."""
    interval = f"95% interval {pairs.drop_low_pp:+.2f} to {pairs.drop_high_pp:+.2f} pp"
    limit = f"--max-accuracy-drop {limit_pp:g}"
    if pairs.drop_high_pp <= limit_pp:
        return Verdict(False, True, f"within {limit} ({interval})")
    needed = pairs.photos_to_settle(limit_pp)
    settle = "no number of photos settles a drop equal to the limit" if needed is None else (
        f"more than {SETTLE_SEARCHED} photos would settle it" if needed > SETTLE_SEARCHED else
        f"about {needed} photos would settle it")  # fmt: skip
    if pairs.net_photos <= 1:
        lost, gained = pairs.only_reference_right, pairs.only_backend_right
        why = "a difference of 1 photo is never refused" if pairs.net_photos == 1 else (
            "no photo differs" if not lost + gained else f"{lost} photo(s) lost, {gained} gained")  # fmt: skip
        return Verdict(False, False, f"undecided: {why}; {interval}; {settle}")
    if pairs.drop_low_pp > limit_pp:
        return Verdict(True, True, f"over {limit} with 95% confidence ({interval})")
    return Verdict(False, False, f"undecided: the {interval} holds {limit}; {settle}")


class BadAccuracyDrop(ValueError):
    """A ``--max-accuracy-drop`` that is not a number of percentage points from 0 to 100."""


def max_drop(text: str | None) -> float:
    """``--max-accuracy-drop`` as percentage points (default DEFAULT_MAX_DROP_PP), or BadAccuracyDrop."""
    if text is None:
        return DEFAULT_MAX_DROP_PP
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # written so that NaN fails too
        raise BadAccuracyDrop(f"--max-accuracy-drop {text!r}: percentage points of top-1 from 0 to 100, e.g. 1.5")
    return value


def open_served(backend: str, dirs: Mapping[int | None, str | Path]) -> Engine:
    """The engine as a server runs it, on model files outside the store (so no compiled-model cache)."""
    overrides = {"cache_dir": None} if "cache_dir" in SPECS[backend].options() else {}
    return open_engine(backend, dirs=dirs, **overrides)


@dataclass(frozen=True)
class Measured:
    """One model on the eval photos: the precision it ran at, its accuracy, its pairs with PyTorch's answers."""

    precision: str
    result: Accuracy
    pairs: Paired
    verdict: Verdict

    def row(self, name: str, reference: Accuracy, **kw: Any) -> Row:
        return Row.of(name, self.precision, self.result, reference, paired=self.pairs, **kw)


@dataclass
class AccuracyGate:
    images: EvalSet
    reference: Accuracy
    reference_answers: np.ndarray  # PyTorch's top-1 class of each photo: every backend is paired with it
    max_drop_pp: float = DEFAULT_MAX_DROP_PP
    json_path: Path = Path("accuracy.json")
    say: Callable[[str], None] = print
    rows: list[Row] = field(default_factory=list)
    # backend, its model folders → its engine as served (tests give stand-ins to exercise the decisions)
    open: Callable[[str, Mapping[int | None, str | Path]], Engine] = open_served
    # Each measured engine's own images/s, briefly (None: not timed), to name the fastest within the limit;
    # `fastinfer evaluate` times longer, and through a server.
    timing: evaluate.Timing | None = None
    speeds: dict[str, float | None] = field(default_factory=dict)

    @classmethod
    def prepare(
        cls,
        ctx: BuildContext,
        eval_dir: Path,
        max_drop_pp: float = DEFAULT_MAX_DROP_PP,
        json_path: Path | None = None,
        say: Callable[[str], None] = print,
    ) -> AccuracyGate:
        """The eval photos, and PyTorch's accuracy on them; EvalDirError before anything is built."""
        import torch

        ticker = accuracy.printer(say)
        say(f"accuracy: reading {eval_dir} (labels of the family: {len(ctx.categories)})")
        images = accuracy.load(eval_dir, ctx.categories, ctx.spec, ticker)

        def model(batch: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                return ctx.model(torch.from_numpy(batch)).numpy()

        logits = accuracy.run("accuracy: PyTorch reference", model, images.pixels, ticker)
        reference = accuracy.accuracy(logits, images.targets)
        json_path = accuracy.artifacts_folder(ctx.family) / "accuracy.json" if json_path is None else json_path
        gate = cls(
            images,
            reference,
            accuracy.answers(logits),
            max_drop_pp,
            json_path,
            say,
            timing=evaluate.Timing(seconds=BUILD_TIMING_S, warmup_s=BUILD_TIMING_S, say=lambda line: None),
        )
        gate.rows.append(Row.of("pytorch (reference)", "fp32", reference, reference, note="the weights as loaded"))
        say(
            f"accuracy: PyTorch on {reference.images} images: top-1 {reference.top1:.2%}, top-5 "
            f"{reference.top5:.2%}" + (f"; {len(images.skipped)} file(s) skipped" if images.skipped else "")
        )
        return gate

    def _measure(self, name: str, artifact: str, batch: int | None, path: str | Path) -> Measured | str:
        """What the model answers on the photos, or why it cannot run here."""
        # The backend whose engine runs this model at ``batch`` (the store name's suffix), as served.
        spec = next(s for s in SPECS.values() if s.artifact == artifact and batch in s.static_batches)
        backend = spec.name
        if (cannot := spec.platform()) is not None:
            return cannot
        try:
            engine = self.open(backend, {batch: path})
        except EngineUnavailable as exc:
            return str(exc)
        precision = accuracy.run_precision(backend, engine.describe())
        rows = accuracy.call_size(spec.rows_independent)
        logits = accuracy.run(f"{name}: accuracy", engine.run, self.images.pixels, accuracy.printer(self.say), rows)
        if self.timing is not None:
            speed = evaluate.engine_speed(name, engine, self.images.pixels, rows, self.timing)
            self.speeds[name] = speed.images_per_s
            if speed.note:
                self.say(f"{name}: {speed.note}")
        del engine  # let go of the files before they move into the store
        result = accuracy.accuracy(logits, self.images.targets)
        pairs = accuracy.paired(self.reference_answers, accuracy.answers(logits), self.images.targets)
        return Measured(precision, result, pairs, judge(pairs, self.max_drop_pp))

    def check(
        self, name: str, artifact: str, batch: int | None, path: str | Path, kept: str = ""
    ) -> dict[str, Any] | None:
        """Measure a fresh export before it is stored: its ``accuracy`` metadata, or None when it cannot run
        here; AccuracyRefused when it runs at a reduced precision and is shown to lose more than the limit."""
        m = self._measure(name, artifact, batch, path)
        if isinstance(m, str):
            return self.not_measured(name, m)
        gated = m.precision in GATED_PRECISIONS
        if gated and m.verdict.refused:
            self.rows.append(m.row(name, self.reference, status="refused", note=f"{m.verdict.note}; not stored"))
            raise AccuracyRefused(
                f"{name}: top-1 {m.result.top1:.2%} at {m.precision} on {m.result.images} images of "
                f"{self.images.root} is {m.pairs.drop_pp:.2f} percentage points below PyTorch's "
                f"{self.reference.top1:.2%}: {m.verdict.note}, {m.pairs.changed} answer(s) changed. "
                f"Nothing stored{kept}."
            )
        self.rows.append(m.row(name, self.reference, note=m.verdict.note if gated else ""))
        self.say(f"{name}: accuracy at {m.precision}: top-1 {m.result.top1:.2%}, top-5 {m.result.top5:.2%} "
                 f"(PyTorch {self.reference.top1:.2%}, {self.reference.top5:.2%}); {m.pairs.changed} answer(s) "
                 f"changed")  # fmt: skip
        if gated and not m.verdict.settled:
            self.say(f"{name}: WARNING: stored, {m.verdict.note}")
        return {
            "eval_dir": as_text(str(self.images.root.resolve())),  # stored with the model: valid text
            "images": m.result.images,
            "skipped": len(self.images.skipped),
            "top1": m.result.top1,
            "top5": m.result.top5,
            "reference_top1": self.reference.top1,
            "reference_top5": self.reference.top5,
            "precision": m.precision,
            "paired": m.pairs.as_dict(),
            "max_accuracy_drop_pp": self.max_drop_pp,
            "gate": m.verdict.note if gated else "not gated: held to its verification tolerance",
        }

    def report_stored(self, name: str, artifact: str, batch: int | None, path: str | Path) -> None:
        """Measure a model kept as up to date, for the table only (one shown over the limit is reported)."""
        try:
            m = self._measure(name, artifact, batch, path)
        except Exception as exc:  # stored already: said in the table, the build goes on
            m = f"fails when run: {one_line(exc)}"
        if isinstance(m, str):
            self.not_measured(name, m)
            return
        if m.precision in GATED_PRECISIONS and m.verdict.refused:
            self.rows.append(m.row(name, self.reference, status="over the limit",
                                   note="stored before this build; --force rebuilds and gates it"))  # fmt: skip
            self.say(
                f"{name}: WARNING: top-1 {m.result.top1:.2%} at {m.precision} is {m.pairs.drop_pp:.2f} percentage "
                f"points below PyTorch's {self.reference.top1:.2%}, {m.verdict.note}; it was stored before this "
                "build (--force rebuilds it, and refuses it if it still loses that much)"
            )
            return
        note = "up to date, not rebuilt: measured, its stored metadata unchanged"
        self.rows.append(m.row(name, self.reference, note=note))

    def not_measured(self, name: str, why: str) -> None:
        self.rows.append(Row(name, status="not measured", note=why))
        self.say(f"{name}: accuracy not measured: {why}")

    def report(self) -> accuracy.Report:
        return accuracy.Report(
            eval_dir=as_text(str(self.images.root.resolve())),
            images=len(self.images.targets),
            skipped=[accuracy.Skipped(as_text(s.path), as_text(s.why)) for s in self.images.skipped],
            unevaluated=self.images.unevaluated,
            labels=len(self.images.labels),
            reference=REFERENCE,
            rows=self.rows,
            extra={
                "max_accuracy_drop_pp": self.max_drop_pp,
                "gated_precisions": list(GATED_PRECISIONS),
                "interval": f"95%, {accuracy.INTERVAL_METHOD}",
            },
        )

    def finish(self) -> None:
        """The table, printed and written as JSON (also after a refusal: the numbers so far)."""
        report = self.report()
        for line in report.summary():
            self.say(f"accuracy: {line}")
        self.say(report.table())
        if self.speeds:
            drops = {row.backend: row.drop_pp for row in self.rows if row.status != "refused"}
            fastest = evaluate.fastest_within(self.speeds, drops, self.max_drop_pp)
            report.extra["images_per_s_in_process"] = self.speeds
            report.extra["fastest_within_limit"] = fastest
            limit = f"within the limit ({self.max_drop_pp:g} pp)"
            said = f"none timed is {limit}"
            if fastest is not None:
                said = f"fastest {limit}: {fastest}, {self.speeds[fastest]:g} images/s"
            self.say(f"accuracy: {said} (each engine's own speed, {BUILD_TIMING_S:g} s in this process on the eval "
                     "photos; `fastinfer evaluate` times longer, and through a server with --url)")  # fmt: skip
        try:
            self.say(f"accuracy: wrote {report.write(self.json_path)}")
        except OSError as exc:  # the table is printed above; a build's outcome does not hang on this file
            self.say(f"accuracy: WARNING: could not write {self.json_path}: {exc}")
