"""The family a server serves, as people are told it: its name, class count, where its weights came from,
its preprocessing and the accuracy its build measured (``/backends``, the API page, the dashboard, doctor,
``/metrics``), and what to say when the model store holds none of it.

One family per server (``FASTINFER_MODEL``, fastinfer.catalog.store.family). Everything here is read from
the stored models themselves: nothing about ImageNet is assumed, its 1000 classes and 224-pixel crop are
only what the default family's models say of themselves.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastinfer.catalog import store
from fastinfer.catalog.store import StoredModelInfo

logger = logging.getLogger("fastinfer.family")

ACCURACY_KEYS = ("top1", "top5", "reference_top1", "reference_top5", "precision", "images", "skipped")
"""What /backends and doctor show of a stored model's ``accuracy`` (its eval folder's path is the builder's)."""


def classes(info: StoredModelInfo) -> int:
    """A stored model's class count: its metadata's, else its labels' (a model stored without the count)."""
    return info.num_classes or len(info.categories)


def build_command(name: str) -> str:
    """The command that builds family ``name`` into the store."""
    if name == store.DEFAULT_FAMILY:
        return "`fastinfer build` (ImageNet's weights; `--weights PATH --labels PATH` for your own)"
    return f"`fastinfer build --weights PATH --labels PATH --name {name}`"


def build_hint(name: str | None = None) -> str:
    """What a message about a model missing from family ``name`` (default: this process's) says to run."""
    name = name or store.family()
    return "run `python -m build_models`" if name == store.DEFAULT_FAMILY else f"run {build_command(name)}"


@dataclass(frozen=True)
class FamilyInfo:
    """The family a server serves, as its stored models say."""

    name: str
    stored: bool  # False: no model of it was found (``missing`` says what the store holds instead)
    num_classes: int | None = None
    weights: str | None = None  # imagenet | random-init | file
    weights_description: str | None = None
    preprocess: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend → its build's measurement
    missing: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stored": self.stored,
            "num_classes": self.num_classes,
            "weights": self.weights,
            "weights_description": self.weights_description,
            "preprocess": self.preprocess,
            "accuracy": self.accuracy,
            "missing": self.missing,
        }

    def weights_line(self) -> str:
        """Where the weights came from, in words: kind, and the build's description of them."""
        if self.weights is None:
            return "unknown"
        return f"{self.weights} ({self.weights_description})" if self.weights_description else self.weights

    def accuracy_line(self) -> str:
        """The accuracy the build measured, per backend, in one line ("" when it measured none)."""
        return "; ".join(
            f"{backend} top-1 {100 * a['top1']:.1f}%, top-5 {100 * a['top5']:.1f}%"
            + (f" ({a['precision']})" if a.get("precision") else "")
            for backend, a in self.accuracy.items()
            if isinstance(a.get("top1"), int | float) and isinstance(a.get("top5"), int | float)
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
        return FamilyInfo(name, stored=False, missing=missing_reason(name))
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
    )


_held_by_pins: dict[str, dict[str, list[str]]] = {}  # pins as set → what the store held: a server asks once


def held() -> dict[str, list[str]]:
    """The families the model store holds → their store names ({} when it cannot be listed). In a
    server, read once: what it serves was fixed when it started."""
    pins = os.environ.get(store.PINS_ENV)
    if pins is not None and pins in _held_by_pins:
        return _held_by_pins[pins]
    try:
        found = store.families()
    except Exception as exc:  # a model.yaml BentoML cannot read stops its listing: said, not raised
        logger.warning("the model store cannot be listed: %s", exc)
        found = {}
    if pins is not None:
        _held_by_pins[pins] = found
    return found


def missing_reason(name: str | None = None) -> str | None:
    """Why family ``name`` (default: this process's) cannot be served at all: the store holds no model of
    it. Says which families it holds and how to build this one. None when the store holds some of it."""
    name = name or store.family()
    found = held()
    if name in found:
        return None
    others = ", ".join(f"{family} ({len(names)} models)" for family, names in found.items() if family != name)
    holds = f"it holds {others}" if others else "it holds no model family at all"
    serve_other = f", or serve one it holds ({store.FAMILY_ENV}={next(iter(found))})" if others else ""
    restart = ", then restart the server" if os.environ.get(store.PINS_ENV) is not None else ""
    return (
        f"the model store holds no model of family {name!r} ({store.FAMILY_ENV}={name}); {holds}. "
        f"Build it with {build_command(name)}{serve_other}{restart}"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m fastinfer.catalog.family NAME``: 0 when the model store holds family NAME, else 1 after
    one line saying what it holds and how to build NAME (``make serve`` / ``make bento`` check so first)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        name = store.check_family(args[0] if args else store.family())
    except store.BadFamilyName as exc:
        print(f"{store.FAMILY_ENV}: {exc}", file=sys.stderr)
        return 1
    if (why := missing_reason(name)) is not None:
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
