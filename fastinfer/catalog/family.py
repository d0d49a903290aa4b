"""The family a server serves, as people are told it (``/backends``, the API page, the dashboard, doctor,
``/metrics``): read from the stored models themselves, nothing about ImageNet assumed.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ConfigDict

from fastinfer.catalog.holdings import missing_reason
from fastinfer.catalog.store import StoredModelInfo
from fastinfer.common.schemas import ModelFamily

MAX_LABEL = 200  # characters in a class name the build accepts: a name, not a paragraph (every answer repeats it)

# What /backends and doctor show of a stored model's ``accuracy`` (its eval folder's path is the builder's).
ACCURACY_KEYS = ("top1", "top5", "reference_top1", "reference_top5", "precision", "images", "skipped")


def classes(info: StoredModelInfo) -> int:
    """A stored model's class count: its metadata's, else its labels' (a model stored without the count)."""
    return info.num_classes or len(info.categories)


def shows_top5(num_classes: int | None) -> bool:
    """Whether top-5 accuracy means anything: with 5 classes or fewer it is 100% whatever the model does."""
    return num_classes is None or num_classes > 5


class FamilyInfo(ModelFamily):
    """The family a server serves, as its stored models say (its fields: /backends' ``family``)."""

    model_config = ConfigDict(frozen=True)

    def weights_line(self) -> str:
        """Where the weights came from, in words: kind, and the build's description of them."""
        if self.weights is None:
            return "unknown"
        return f"{self.weights} ({self.weights_description})" if self.weights_description else self.weights

    def accuracy_line(self) -> str:
        """The accuracy the build measured, per backend, in one line ("" when it measured none)."""
        top5 = shows_top5(self.num_classes)
        return "; ".join(
            f"{backend} top-1 {100 * a['top1']:.1f}%"
            + (f", top-5 {100 * a['top5']:.1f}%" if top5 else "")
            + (f" ({a['precision']})" if a.get("precision") else "")
            for backend, a in self.accuracy.items()
            if isinstance(a.get("top1"), int | float) and (not top5 or isinstance(a.get("top5"), int | float))
        )

    def summary(self) -> str:
        """One line: name, class count, weights, accuracy where measured (or why nothing is served)."""
        if not self.stored:
            return f"model family {self.name}: {self.missing}"
        line = f"model family {self.name}: {self.num_classes} classes, weights {self.weights_line()}"
        measured = self.accuracy_line()
        return line + (f"; accuracy measured at build: {measured}" if measured else "; accuracy not measured")


def summary(name: str, models: Mapping[str, StoredModelInfo]) -> FamilyInfo:
    """Family ``name`` from the models a server serves (backend → its stored model; the table's order)."""
    if not models:
        return FamilyInfo(name=name, stored=False, missing=missing_reason(name))
    first = next(iter(models.values()))
    pre = first.preprocess
    accuracy = {
        backend: {key: info.accuracy[key] for key in ACCURACY_KEYS if key in info.accuracy}
        for backend, info in models.items()
        if isinstance(info.accuracy, dict)
    }
    return FamilyInfo(
        name=name,
        stored=True,
        num_classes=classes(first),
        weights=first.weights,
        weights_description=first.weights_description or None,
        preprocess={"resize_size": pre.resize_size, "crop_size": pre.crop_size, "mean": pre.mean, "std": pre.std},
        accuracy=accuracy,
        labels=list(first.categories),
    )
