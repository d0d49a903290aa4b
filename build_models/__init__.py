"""Build every FastInfer artifact of one model family into the BentoML model store, as ``<family>-<backend>[-b<N>]``
(``python -m build_models --help``; docs/backends.md). Arguments are checked before anything is exported; each export
is checked against PyTorch, then stored or refused; one table ends the build: what was stored, refused, skipped, why.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from build_models import exporters, plan
from build_models.accuracy_gate import DEFAULT_MAX_DROP_PP, AccuracyGate, AccuracyRefused
from build_models.context import BuildContext, build_code, family_hash
from build_models.labels import IMAGENET_CLASSES, SHOWN, family_labels
from build_models.plan import BuildRefused  # noqa: F401 (the build's last word, raised by build())
from build_models.text import as_text, texts
from fastinfer.catalog import store, store_check
from fastinfer.catalog.backends import COREML_BATCHES, anywhere, open_engine, openvino_cache_dir, openvino_missing
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common import hardware
from fastinfer.common.errors import one_line
from fastinfer.common.home import bentoml_home
from fastinfer.engines import MAX_INPUT_SIZE, MIN_INPUT_SIZE, EngineUnavailable
from fastinfer.engines.openvino import cache_folder
from fastinfer.measure import fidelity, photos
from fastinfer.measure.fidelity import Fidelity, Gate, compare
from fastinfer.serving.preprocess import prepare

if TYPE_CHECKING:
    from bentoml import Model


VERIFICATION_PHOTOS = 8  # real photos every verified export is compared on against PyTorch
LISTED = 8  # calibration files skipped that are named one by one


class VerificationError(RuntimeError):
    """A model whose copy in the store differs from its export: the store cannot be trusted, so the build stops."""


class NonFiniteLogits(ValueError):
    """Weights whose model computes NaN or infinity on real photos (finite weights that overflow float32)."""


class UnknownArtifact(ValueError):
    """An ``--only`` naming no backend the build knows."""


# The same graph in another runtime: measured max |logit diff| ~3e-5 here.
FP32_TOLERANCE = fidelity.FP32_GATE
# The INT8 fidelity gates (fastinfer.measure.fidelity; 36 photos there) on the 8 verification photos:
# 90% of 8 rounds down to 7, so one photo may flip.
INT8_TOLERANCE = Gate(
    max_abs_error=fidelity.INT8_MAX_ERROR,
    min_top1=math.floor(fidelity.INT8_MIN_TOP1 * VERIFICATION_PHOTOS) / VERIFICATION_PHOTOS,
    min_top5=fidelity.INT8_MIN_TOP5,
    max_error_per_std=fidelity.INT8_MAX_ERROR_PER_STD,
)


@dataclass(frozen=True)
class Artifact:
    """One stored model per entry of ``batches`` (None = one model with a dynamic batch)."""

    name: str
    precision: str
    export: Callable[..., dict[str, Any]]
    tolerance: Gate | None = None  # vs PyTorch on real photos; None: not checked (the reference; CoreML: macOS)
    verify_options: Mapping[str, Any] = field(default_factory=dict)
    requires: Callable[[], str | None] = anywhere  # None when this machine can build it, else why not
    # Beyond the source hash: the INT8 models also depend on the calibration, openvino-int8 on onnx-int8's file.
    still_current: Callable[[BuildContext, Model], bool] = lambda ctx, model: True
    batches: tuple[int | None, ...] = (None,)
    built_from: str | None = None  # the artifact whose export this one converts: refused, this is not built


ONNX_CPU = {"cpu_only": True}  # verify the export itself, not an accelerator's rendition of it

ARTIFACTS: dict[str, Artifact] = {
    a.name: a
    for a in (
        Artifact("pytorch", "fp32", exporters.export_pytorch),
        Artifact("onnx", "fp32", exporters.export_onnx, tolerance=FP32_TOLERANCE, verify_options=ONNX_CPU),
        Artifact(
            "onnx-int8",
            "int8-static",
            exporters.export_onnx_int8_static,
            tolerance=INT8_TOLERANCE,
            verify_options=ONNX_CPU,
            still_current=BuildContext.calibrated_as_asked,
        ),
        Artifact(
            "onnx-int8-dynamic",
            "int8-dynamic",
            exporters.export_onnx_int8_dynamic,
            tolerance=INT8_TOLERANCE,
            verify_options=ONNX_CPU,
        ),
        # The IR is verified at f32: BF16 is a run-time choice, gated by fidelity (tests/unit/test_fidelity.py).
        Artifact(
            "openvino",
            "fp32",
            exporters.export_openvino,
            tolerance=FP32_TOLERANCE,
            verify_options={"precision": "f32", "cache_dir": None},
            requires=openvino_missing,
        ),
        Artifact(
            "openvino-int8",
            "int8-static",
            exporters.export_openvino_int8,
            tolerance=INT8_TOLERANCE,
            verify_options={"cache_dir": None},
            requires=openvino_missing,
            still_current=BuildContext.converts_stored_int8_as_asked,
            built_from="onnx-int8",
        ),
        Artifact("coreml", "fp16", exporters.export_coreml, batches=COREML_BATCHES),
    )
}
ARTIFACT_NAMES: tuple[str, ...] = tuple(ARTIFACTS)


@dataclass(frozen=True)
class BuildResult:
    name: str  # store name, e.g. resnet50-coreml-b4
    tag: str
    built: bool  # False when the stored model was already current


class BadPreprocessing(ValueError):
    """Preprocessing no model could be built for (a zero std, a crop larger than the resize...): one line."""


MIN_STD = 1e-3  # pixels are divided by it: below, one grey level is 4 units apart, a mistake, not a model


def preprocess_spec(
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    resize_size: int | None = None,
    crop_size: int | None = None,
) -> PreprocessSpec:
    """A family's preprocessing, each value not given ImageNet's; BadPreprocessing names the first bad value."""
    default = PreprocessSpec()
    mean = tuple(default.mean if mean is None else mean)
    std = tuple(default.std if std is None else std)
    resize = default.resize_size if resize_size is None else resize_size
    crop = default.crop_size if crop_size is None else crop_size
    shown = {"mean": ",".join(f"{v:g}" for v in mean), "std": ",".join(f"{v:g}" for v in std)}
    for name, values in (("mean", mean), ("std", std)):
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise BadPreprocessing(f"--{name} {shown[name]}: three finite numbers, one per channel R,G,B")
    if not all(0 <= v <= 1 for v in mean):
        raise BadPreprocessing(f"--mean {shown['mean']}: each is a mean of pixels scaled to 0..1, so 0 to 1")
    if not all(v >= MIN_STD for v in std):
        raise BadPreprocessing(
            f"--std {shown['std']}: each must be at least {MIN_STD:g} (the pixels, scaled to 0..1, are divided by it)"
        )
    if not MIN_INPUT_SIZE <= crop <= MAX_INPUT_SIZE:
        raise BadPreprocessing(f"--crop {crop}: the model's image side must be {MIN_INPUT_SIZE} to {MAX_INPUT_SIZE}")
    if not crop <= resize <= MAX_INPUT_SIZE:
        raise BadPreprocessing(
            f"--resize {resize}: the shorter side is resized to it, then cropped to --crop {crop}, so it must be "
            f"{crop} to {MAX_INPUT_SIZE}"
        )
    (r, g, b), (sr, sg, sb) = mean, std
    return PreprocessSpec(resize_size=resize, crop_size=crop, mean=(r, g, b), std=(sr, sg, sb))


class MixedSources(ValueError):
    """A partial build that would leave a family's models built from two sources."""


def check_one_source(family: str, source_hash: str, names: Sequence[str], if_missing: bool) -> None:
    """MixedSources when a build of some backends only (``names``, or ``if_missing``) would leave stored models
    of another source beside its own; a build of every backend this machine can build replaces them all."""
    buildable = [name for name, artifact in ARTIFACTS.items() if artifact.requires() is None]
    if not if_missing and set(buildable) <= set(names):
        return
    # --if-missing rebuilds whatever is not current: all of a family of another source, which it is not for.
    left = ARTIFACT_NAMES if if_missing else [name for name in ARTIFACT_NAMES if name not in names]
    found = (store.find(name, size, family_name=family) for name in left for size in ARTIFACTS[name].batches)
    others = [str(m.tag) for m in found if m is not None and m.info.labels.get("source_hash") != source_hash]
    if others:
        partial = "--if-missing" if if_missing else f"--only {','.join(names)}"
        shown = ", ".join(others[:SHOWN]) + (f" and {len(others) - SHOWN} more" if len(others) > SHOWN else "")
        raise MixedSources(
            f"family {family}: {shown} {'was' if len(others) == 1 else 'were'} built from other "
            f"weights, labels or preprocessing than this build's, so {partial} would leave the family of two "
            "sources. Build the whole family (drop --only and --if-missing; --force rebuilds even the current "
            "ones) to replace every backend, or give the weights, labels and preprocessing those were built with"
        )


def artifact_names(only: Sequence[str] | None) -> list[str]:
    """The backends ``--only`` names (None or empty: all), or UnknownArtifact naming those it does not know."""
    names = list(only or ARTIFACT_NAMES)
    unknown = [n for n in names if n not in ARTIFACTS]
    if unknown:
        raise UnknownArtifact(
            f"--only {','.join(map(as_text, unknown))}: no such backend; choose from {', '.join(ARTIFACT_NAMES)}"
        )
    return names


LOGIT_CEILING = 65504.0  # FP16's largest value: the CoreML models compute in FP16; trained classifiers give tens


def check_finite(reference: np.ndarray, weights: str) -> None:
    """NonFiniteLogits when PyTorch's logits on the verification photos hold a NaN, an infinity or a value beyond
    FP16's range: every backend would answer NaN, or be refused for it only after others were stored."""
    bad = ~np.isfinite(reference)
    if bad.any():
        photos_hit = int(bad.any(axis=1).sum())
        raise NonFiniteLogits(
            f"weights {weights}: PyTorch computes NaN or infinite logits on {photos_hit} of {len(reference)} real "
            "photos (values beyond float32's range); no model can be built from them. Nothing stored."
        )
    if (largest := float(np.abs(reference).max())) > LOGIT_CEILING:
        raise NonFiniteLogits(
            f"weights {weights}: PyTorch computes logits up to {largest:.3g} on real photos, beyond FP16's range "
            f"(±{LOGIT_CEILING:g}; a trained classifier's are tens): the weights overflow. Nothing stored."
        )


def verification_batch(spec: PreprocessSpec, own: np.ndarray | None = None) -> np.ndarray:
    """Real photos through the service's preprocessing: ``own`` (the family's eval or calibration photos, spread
    evenly) where given, since a fine-tuned head's INT8 logits stray far more on unlike photos (21.7 vs 2.4)."""
    if own is not None and len(own):
        picks = np.linspace(0, len(own) - 1, min(VERIFICATION_PHOTOS, len(own))).round().astype(int)
        return np.stack([own[i] for i in picks])
    return np.stack(
        [prepare(photos.photo_jpeg(name), spec, 10**9).pixels for name in photos.PHOTOS[:VERIFICATION_PHOTOS]]
    )


def build(
    weights_choice: str = "auto",
    only: list[str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] = print,
    calibration_dir: Path | None = None,
    int8_activations: str | None = None,
    family: str = store.DEFAULT_FAMILY,
    labels_path: Path | None = None,
    preprocess: PreprocessSpec | None = None,
    eval_dir: Path | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_DROP_PP,
    accuracy_json: Path | None = None,
    if_missing: bool = False,
) -> list[BuildResult]:
    """Build (or confirm current) every artifact in ``only`` (default: all) of ``family``: the models stored or
    found up to date.

    Bad arguments and inputs raise before anything is exported. An export that does not load, diverges from
    PyTorch, or fails the accuracy gate is refused and not stored, as is what converts it; the build goes on and
    then raises BuildRefused naming every one refused. ``accuracy_json``: None, beside the family."""
    from build_models.weights import load_weights
    from fastinfer.engines.torch_model import resnet50

    said = progress

    def progress(line: str) -> None:  # a file name's undecodable bytes would crash a strict stdout
        said(as_text(line))

    names = artifact_names(only)
    store.check_family(family)
    given = preprocess or PreprocessSpec()
    spec = preprocess_spec(given.mean, given.std, given.resize_size, given.crop_size)  # one line if it cannot be
    progress(f"weights: resolving {weights_choice!r}")
    weights = load_weights(weights_choice)
    progress(f"weights: {weights.kind} ({weights.description}), source hash {weights.source_hash}")
    labels = family_labels(labels_path, weights.num_classes)
    named = f"labels from {labels_path}" if labels_path else "ImageNet's labels"
    progress(
        f"family {family}: {len(labels)} classes ({named}); resize {spec.resize_size}, crop {spec.crop_size}, "
        f"mean {','.join(map(str, spec.mean))}, std {','.join(map(str, spec.std))}"
    )
    check_one_source(family, family_hash(weights.source_hash, labels, spec), names, if_missing)
    not_imagenet = labels_path is not None or weights.num_classes != IMAGENET_CLASSES
    if not_imagenet and family == store.DEFAULT_FAMILY:
        progress(
            f"WARNING: family {store.DEFAULT_FAMILY} is the default family (ImageNet's, served when "
            "FASTINFER_MODEL is not set): your model replaces its models in the store; pass --name NAME to "
            "build it as a family of its own instead"
        )
    if not_imagenet and calibration_dir is None and {"onnx-int8", "openvino-int8"} & set(names):
        progress(
            f"WARNING: family {family}: static INT8 will be calibrated on the bundled generic photos "
            "(scikit-image samples), not on your own images, so its accuracy on your classes may suffer; "
            "pass --calibration-dir DIR with a few hundred of your images (your training folder will do)"
        )
    model = resnet50(weights.state_dict, spec.mean, spec.std)
    ctx = BuildContext(weights, spec, model, calibration_dir, int8_activations, force, family, labels)
    todo = plan.jobs(
        names,
        {a.name: a.batches for a in ARTIFACTS.values()},
        {a.name: a.built_from for a in ARTIFACTS.values()},
        partial(store.model_name, family_name=family),
    )
    builder = Builder(ctx, todo, progress, not_imagenet)
    try:
        builder.check_inputs(eval_dir, max_accuracy_drop, accuracy_json)
        for i, job in enumerate(builder.jobs, 1):
            builder.outcomes.append(builder.step(job, f"[{i}/{len(builder.jobs)}] {job.name}"))
    finally:
        builder.finish()
    if (refused := plan.refusal(builder.outcomes)) is not None:
        raise refused
    return builder.results


class _Refused(Exception):
    """An export not stored: why (one line)."""


class _Skipped(Exception):
    """An export this machine cannot check (its runtime cannot run here): why."""


@contextlib.contextmanager
def refusing(what: str, kept: str, *passed: type[Exception]) -> Iterator[None]:
    """An exception in the block (but ``passed`` ones) as _Refused: the export ``what``, in one line."""
    try:
        yield
    except passed:
        raise
    except Exception as exc:  # the other backends are still built
        raise _Refused(f"the export {what}: {one_line(exc)}. Nothing stored{kept}.") from exc


@dataclass
class Builder:
    """One build of a family: its inputs, its plan, and what became of each model."""

    ctx: BuildContext
    jobs: list[plan.Job]
    progress: Callable[[str], None]
    not_imagenet: bool
    gate: AccuracyGate | None = None
    batch: np.ndarray | None = None  # the verification photos
    reference: np.ndarray | None = None  # PyTorch's logits on them
    outcomes: list[plan.Outcome] = field(default_factory=list)
    results: list[BuildResult] = field(default_factory=list)

    def check_inputs(self, eval_dir: Path | None, max_drop_pp: float, json_path: Path | None) -> None:
        """The eval and calibration photos read, and PyTorch's logits on the verification photos found finite,
        before the first export: a bad folder or bad weights stop the build with nothing stored."""
        import torch

        ctx, progress = self.ctx, self.progress
        if eval_dir is not None:  # the folder is checked against the labels before anything is exported
            self.gate = AccuracyGate.prepare(ctx, eval_dir, max_drop_pp, json_path, progress)
        if ctx.calibration_dir is not None:  # read before anything is exported: a folder of no images stops it here
            calibration = ctx.calibration
            progress(f"calibration: {len(calibration.images)} images in {ctx.calibration_source}")
            for path, why in calibration.skipped[:LISTED]:
                progress(f"WARNING: calibration: skipped {path}: {why}")
            if len(calibration.skipped) > LISTED:
                progress(f"WARNING: calibration: ... and {len(calibration.skipped) - LISTED} more file(s) skipped")
        # ImageNet's tolerances were set on the bundled photos; a family of yours: its own.
        own = None
        if self.not_imagenet and (self.gate is not None or ctx.calibration_dir is not None):
            own = self.gate.images.pixels if self.gate is not None else np.stack(ctx.calibration.images)
        self.batch = verification_batch(ctx.spec, own)
        with torch.inference_mode():
            self.reference = ctx.model(torch.from_numpy(self.batch)).numpy()
        check_finite(self.reference, ctx.weights.description)  # before the first export: nothing is stored

    def step(self, job: plan.Job, step: str) -> plan.Outcome:
        """One model: skipped, found up to date, or made, checked, then stored or refused."""
        artifact = ARTIFACTS[job.artifact]
        for tag, why in store.unreadable(job.name).items():  # nothing can load it; BentoML stores nothing beside it
            import bentoml

            bentoml.models.delete(tag)
            self.progress(f"{step}: removed {tag}, unreadable: {why}")
        existing = store.find(job.artifact, job.batch, family_name=self.ctx.family)
        kept = f"; {existing.tag} stays" if existing is not None else ""
        if (cannot := artifact.requires()) is not None or (cannot := plan.blocked(job, self.outcomes)) is not None:
            return self.skipped(job, step, cannot + kept)
        if self.up_to_date(job, step, existing):
            return plan.Outcome(job.name, job.artifact, plan.UP_TO_DATE, str(existing.tag))
        self.progress(f"{step}: exporting ...")
        t0 = time.perf_counter()
        export = artifact.export if job.batch is None else partial(artifact.export, batch=job.batch)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                with refusing("failed", kept):
                    extra = export(self.ctx, Path(tmp))
                if "calibration_images" in extra:
                    images, source = extra["calibration_images"], extra["calibration_source"]
                    self.progress(f"{step}: INT8 calibration: {images} images ({source})")
                check = self.verify(job, step, tmp, kept)
                measured = None
                if self.gate is not None:  # it ran on the verification photos: it may fail on these
                    with refusing("does not run on the eval photos", kept, AccuracyRefused):
                        measured = self.gate.check(job.name, job.artifact, job.batch, tmp, kept)
            except _Skipped as exc:
                return self.skipped(job, step, str(exc))
            except (_Refused, AccuracyRefused) as exc:
                why = str(exc).removeprefix(f"{job.name}: ")
                self.progress(f"{step}: REFUSED: {why}")
                if self.gate is not None and isinstance(exc, _Refused):  # the accuracy table lists every model
                    self.gate.not_measured(job.name, f"refused before measuring: {why}")
                return plan.Outcome(job.name, job.artifact, plan.REFUSED, why)
            tag = self.store(job, step, tmp, extra, check, measured, kept)
        seconds = time.perf_counter() - t0
        self.progress(f"{step}: stored {tag} in {seconds:.1f}s")
        self.results.append(BuildResult(job.name, tag, True))
        warned = measured is not None and measured["gate"].startswith("undecided")  # the photos cannot decide
        why = f"{tag} in {seconds:.1f}s" + (f"; WARNING: {measured['gate']}" if warned else "")
        return plan.Outcome(job.name, job.artifact, plan.STORED, why)

    def skipped(self, job: plan.Job, step: str, why: str) -> plan.Outcome:
        self.progress(f"{step}: skipped: {why}")
        if self.gate is not None:
            self.gate.not_measured(job.name, f"not built here: {why}")
        return plan.Outcome(job.name, job.artifact, plan.SKIPPED, why)

    def up_to_date(self, job: plan.Job, step: str, existing: Model | None) -> bool:
        """Whether the stored model stands (current, calibrated and converted as asked, its files intact)."""
        ctx = self.ctx
        current = store.is_current(existing, ctx.source_hash, build_code())
        if ctx.force or not current or not ARTIFACTS[job.artifact].still_current(ctx, existing):
            return False
        health = ctx.health(existing)  # labels alone would call a truncated copy current
        if not health.intact:
            self.progress(f"{step}: {existing.tag} {unhealthy(health)}; rebuilding")
            return False
        self.progress(f"{step}: up to date ({existing.tag}; its files match their sha256), skipped")
        prune(job.name, str(existing.tag), step, self.progress)  # what a server kept while it ran
        self.results.append(BuildResult(job.name, str(existing.tag), False))
        if self.gate is not None:  # measured and reported; a stored model's metadata cannot change
            self.gate.report_stored(job.name, job.artifact, job.batch, existing.path)
        return True

    def verify(self, job: plan.Job, step: str, tmp: str, kept: str) -> Fidelity | None:
        """The export against PyTorch on the verification photos; _Refused when it does not load or diverges
        beyond its tolerance, _Skipped when its runtime cannot run on this machine."""
        artifact = ARTIFACTS[job.artifact]
        if artifact.tolerance is None:
            if artifact.name == "coreml" and not hardware.is_macos():
                self.progress(f"{step}: converted; CoreML prediction needs macOS, so it is verified there (fidelity)")
            return None
        try:
            engine = open_engine(artifact.name, dirs={None: tmp}, **artifact.verify_options)
        except EngineUnavailable as exc:  # its runtime cannot run on this machine: not a bad export
            raise _Skipped(str(exc)) from exc
        except Exception as exc:
            raise _Refused(f"the export does not load: {exc}. Nothing stored{kept}.") from exc
        with refusing("does not run", kept):  # loads, then fails on real photos: as bad as not loading
            check = compare(job.name, self.reference, engine.run(self.batch))
        del engine  # let go of the files before they move into the store
        found = (
            f"on {check.images} real photos: max |logit diff| {check.max_abs_error:.2e}, "
            f"top-1 agreement {check.top1_agreement:.0%}, top-5 overlap {check.top5_overlap:.0%}"
        )
        if problems := artifact.tolerance.violations(check):
            raise _Refused(
                f"the export diverges from PyTorch beyond its tolerance: {'; '.join(problems)} ({found}). "
                f"Nothing stored{kept}."
            )
        self.progress(f"{step}: verified vs PyTorch {found}")
        return check

    def store(
        self,
        job: plan.Job,
        step: str,
        tmp: str,
        extra: dict[str, Any],
        check: Fidelity | None,
        measured: dict[str, Any] | None,
        kept: str,
    ) -> str:
        """The checked export moved into the store with its labels and metadata, read back; its tag."""
        import bentoml

        ctx, spec, artifact = self.ctx, self.ctx.spec, ARTIFACTS[job.artifact]
        labels = {
            "family": ctx.family,
            "backend": artifact.name,
            "precision": artifact.precision,
            "batch": "dynamic" if job.batch is None else str(job.batch),
            "weights": ctx.weights.kind,
            "source_hash": ctx.source_hash,  # weights, labels and preprocessing: any change rebuilds
            "build_format": store.BUILD_FORMAT,
            "built_by": build_code(),  # this build code and runtimes: another version rebuilds
        }
        fidelity_found = {} if check is None else {
            "max_abs_diff_vs_pytorch": check.max_abs_error,
            "top1_agreement_vs_pytorch": check.top1_agreement,
            "top5_overlap_vs_pytorch": check.top5_overlap,
        }  # fmt: skip
        metadata = {
            "input": store.input_spec(spec.crop_size),
            "output": store.output_spec(len(ctx.categories)),
            "preprocess": {
                "resize_size": spec.resize_size,
                "crop_size": spec.crop_size,
                "interpolation": "bilinear",
                "antialias": True,
                "mean": list(spec.mean),
                "std": list(spec.std),
                "normalisation": "inside the model graph",
            },
            "weights_description": ctx.weights.description,
            "categories": ctx.categories,
            "num_classes": len(ctx.categories),
            **({} if measured is None else {"accuracy": measured}),
            **fidelity_found,
            **extra,
            store_check.FILES_KEY: store_check.record(Path(tmp)),  # what "up to date" is checked against
        }
        labels, metadata = texts(labels), texts(metadata)  # all valid text, or no page can list it
        with bentoml.models.create(job.name, labels=labels, metadata=metadata) as stored:
            for f in Path(tmp).iterdir():  # not Path.rename: BentoML may stage across filesystems
                shutil.move(f, Path(stored.path) / f.name)
        # The copy in the store, read back: a disk that fills up mid-copy leaves it short.
        copied = store_check.check(bentoml.models.get(stored.tag))
        if not copied.intact:  # not the export's fault: the next would fail alike, so the build stops
            bentoml.models.delete(stored.tag)
            raise VerificationError(
                f"{job.name}: the copy in the store differs from the export ({copied.why()}); is the disk "
                f"full? Nothing stored{kept}."
            )
        prune(job.name, str(stored.tag), step, self.progress)
        return str(stored.tag)

    def finish(self) -> None:
        """The accuracy table (with ``--eval-dir``), then the build's: also after a failure, the models so far."""
        try:
            if self.gate is not None:
                self.gate.finish()
            if self.outcomes:  # none: an input was refused before the first export, in one line
                for line in plan.table(self.outcomes):
                    self.progress(line)
        finally:
            self.ctx.close()


def prune(name: str, current: str, step: str, progress: Callable[[str], None]) -> None:
    """Delete every version of ``name`` but ``current``, with its compiled OpenVINO models, except one a
    running server pinned (store.in_use): its runners may still reload it; a later build removes it."""
    import bentoml

    in_use = store.in_use()
    for tag in store.versions(name):  # unreadable ones too (a deleted model.yaml): they go as well
        if tag == current:
            continue
        if tag in in_use:
            progress(f"{step}: kept {tag}: the server started as process {in_use[tag]} serves it until it stops")
            continue
        version_dir = bentoml_home() / "models" / name / tag.split(":", 1)[1]
        shutil.rmtree(cache_folder(openvino_cache_dir(), str(version_dir)), ignore_errors=True)
        bentoml.models.delete(tag)
        progress(f"{step}: removed {tag}, superseded")


def unhealthy(health: store_check.Health) -> str:
    """What is wrong with a stored model that is not intact, as said after its tag."""
    return f"{'is corrupt' if health.corrupt else 'cannot be verified'}: {health.why()}"


def unusable(family: str = store.DEFAULT_FAMILY) -> dict[str, str]:
    """Store name → why, for each model this machine can build that is missing, corrupt, unverifiable, or made by
    other build code or runtimes (what a plain build would rebuild for that reason too)."""
    found: dict[str, str] = {}
    for artifact in ARTIFACTS.values():
        if artifact.requires() is not None:
            continue
        for size in artifact.batches:
            model = store.find(artifact.name, size, family_name=family)
            health = None if model is None else store_check.check(model)
            if health is None or not health.intact:
                why = "not in the store" if health is None else f"{health.tag} {unhealthy(health)}"
            elif model.info.labels.get("built_by") != build_code():
                why = f"{model.tag} was made by other build code or runtimes"
            else:
                continue
            found[store.model_name(artifact.name, size, family_name=family)] = why
    return found
