"""``--eval-dir``: every backend the build makes or keeps, measured on the user's labelled photos beside
PyTorch's, and the INT8/BF16 models that lose more than ``--max-accuracy-drop`` refused.

The build calls :meth:`~AccuracyGate.check` on a fresh export before it is stored (a refusal stores nothing, and
the build goes on, then fails naming every one refused), :meth:`~AccuracyGate.report_stored` on a model kept as
up to date (reported only: a stored model is immutable), and :meth:`~AccuracyGate.finish` at the end.
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
from fastinfer.engines import Engine, EngineUnavailable
from fastinfer.measure import accuracy
from fastinfer.measure.accuracy import Accuracy, EvalSet, Row

if TYPE_CHECKING:
    from build_models.context import BuildContext

DEFAULT_MAX_DROP_PP = 1.0
DEFAULT_JSON = Path("artifacts") / "accuracy.json"
GATED_PRECISIONS = ("int8", "bf16")  # FP32 is held to its verification tolerance; CoreML cannot run here
REFERENCE = "PyTorch FP32 (the build's reference)"


class AccuracyRefused(RuntimeError):
    """An INT8/BF16 model whose top-1 on the eval set falls more than the allowed drop below PyTorch's."""


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


def served_backend(artifact: str, batch: int | None) -> str:
    """The backend whose engine runs ``artifact``'s model at ``batch`` (the store name's suffix) as served."""
    return next(s.name for s in SPECS.values() if s.artifact == artifact and batch in s.static_batches)


def open_served(backend: str, dirs: Mapping[int | None, str | Path]) -> Engine:
    """The engine as a server runs it, on model files outside the store (so no compiled-model cache)."""
    overrides = {"cache_dir": None} if "cache_dir" in SPECS[backend].options() else {}
    return open_engine(backend, dirs=dirs, **overrides)


@dataclass
class AccuracyGate:
    images: EvalSet
    reference: Accuracy
    max_drop_pp: float = DEFAULT_MAX_DROP_PP
    json_path: Path = DEFAULT_JSON
    say: Callable[[str], None] = print
    rows: list[Row] = field(default_factory=list)
    # backend, its model folders → its engine as served (tests give stand-ins to exercise the decisions)
    open: Callable[[str, Mapping[int | None, str | Path]], Engine] = open_served

    @classmethod
    def prepare(
        cls,
        ctx: BuildContext,
        eval_dir: Path,
        max_drop_pp: float = DEFAULT_MAX_DROP_PP,
        json_path: Path = DEFAULT_JSON,
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
        gate = cls(images, reference, max_drop_pp, json_path, say)
        gate.rows.append(Row.of("pytorch (reference)", "fp32", reference, reference, note="the weights as loaded"))
        say(
            f"accuracy: PyTorch on {reference.images} images: top-1 {reference.top1:.2%}, top-5 "
            f"{reference.top5:.2%}" + (f"; {len(images.skipped)} file(s) skipped" if images.skipped else "")
        )
        return gate

    def _measure(self, name: str, artifact: str, batch: int | None, path: str | Path) -> tuple[str, Accuracy] | str:
        """(precision it runs at, its accuracy), or why it cannot run here."""
        backend = served_backend(artifact, batch)
        spec = SPECS[backend]
        if (cannot := spec.platform()) is not None:
            return cannot
        try:
            engine = self.open(backend, {batch: path})
        except EngineUnavailable as exc:
            return str(exc)
        precision = accuracy.run_precision(backend, engine.describe())
        result = accuracy.measure(
            f"{name}: accuracy", engine, self.images, accuracy.printer(self.say), spec.rows_independent
        )
        del engine  # let go of the files before they move into the store
        return precision, result

    def _over(self, result: Accuracy) -> float | None:
        drop = accuracy.top1_drop_pp(self.reference.top1, result.top1)
        return drop if drop > self.max_drop_pp else None

    def check(
        self, name: str, artifact: str, batch: int | None, path: str | Path, kept: str = ""
    ) -> dict[str, Any] | None:
        """Measure a fresh export before it is stored: its ``accuracy`` metadata, or None when it cannot run
        here; AccuracyRefused when it runs at a reduced precision and loses more than the limit."""
        measured = self._measure(name, artifact, batch, path)
        if isinstance(measured, str):
            return self.not_measured(name, measured)
        precision, result = measured
        over = self._over(result) if precision in GATED_PRECISIONS else None
        if over is not None:
            self.rows.append(Row.of(name, precision, result, self.reference, status="refused",
                                    note=f"over --max-accuracy-drop {self.max_drop_pp:g}; not stored"))  # fmt: skip
            raise AccuracyRefused(
                f"{name}: top-1 {result.top1:.2%} at {precision} on {result.images} images of {self.images.root} "
                f"is {over:.2f} percentage points below PyTorch's {self.reference.top1:.2%} (--max-accuracy-drop "
                f"{self.max_drop_pp:g}). Nothing stored{kept}."
            )
        gated = f"within --max-accuracy-drop {self.max_drop_pp:g}" if precision in GATED_PRECISIONS else ""
        self.rows.append(Row.of(name, precision, result, self.reference, note=gated))
        self.say(f"{name}: accuracy at {precision}: top-1 {result.top1:.2%}, top-5 {result.top5:.2%} "
                 f"(PyTorch {self.reference.top1:.2%}, {self.reference.top5:.2%})")  # fmt: skip
        return {
            "eval_dir": as_text(str(self.images.root.resolve())),  # stored with the model: valid text
            "images": result.images,
            "skipped": len(self.images.skipped),
            "top1": result.top1,
            "top5": result.top5,
            "reference_top1": self.reference.top1,
            "reference_top5": self.reference.top5,
            "precision": precision,
        }

    def report_stored(self, name: str, artifact: str, batch: int | None, path: str | Path) -> None:
        """Measure a model kept as up to date, for the table only (one over the limit is reported)."""
        measured = self._measure(name, artifact, batch, path)
        if isinstance(measured, str):
            self.not_measured(name, measured)
            return
        precision, result = measured
        if precision in GATED_PRECISIONS and (over := self._over(result)) is not None:
            self.rows.append(Row.of(name, precision, result, self.reference, status="over the limit",
                                    note="stored before this build; --force rebuilds and gates it"))  # fmt: skip
            self.say(
                f"{name}: WARNING: top-1 {result.top1:.2%} at {precision} is {over:.2f} percentage points below "
                f"PyTorch's {self.reference.top1:.2%}, over --max-accuracy-drop {self.max_drop_pp:g}; it was stored "
                "before this build (--force rebuilds it, and refuses it if it still loses that much)"
            )
            return
        note = "up to date, not rebuilt: measured, its stored metadata unchanged"
        self.rows.append(Row.of(name, precision, result, self.reference, note=note))

    def refused(self) -> list[str]:
        return [row.backend for row in self.rows if row.status == "refused"]

    def refusal(self) -> AccuracyRefused | None:
        """The build's last word when it refused any model: one line naming them all."""
        if not (names := self.refused()):
            return None
        return AccuracyRefused(
            f"{len(names)} model(s) refused, losing more top-1 than --max-accuracy-drop {self.max_drop_pp:g} on "
            f"{self.images.root} (nothing stored for them; the others were built): {', '.join(names)}"
        )

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
            extra={"max_accuracy_drop_pp": self.max_drop_pp, "gated_precisions": list(GATED_PRECISIONS)},
        )

    def finish(self) -> None:
        """The table, printed and written as JSON (also after a refusal: the numbers so far)."""
        report = self.report()
        for line in report.summary():
            self.say(f"accuracy: {line}")
        self.say(report.table())
        try:
            self.say(f"accuracy: wrote {report.write(self.json_path)}")
        except OSError as exc:  # the table is printed above; a build's outcome does not hang on this file
            self.say(f"accuracy: WARNING: could not write {self.json_path}: {exc}")
