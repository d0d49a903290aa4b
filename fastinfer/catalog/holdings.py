"""What the model store holds of a model family, and which of it may be served.

A family is one source (the ``source_hash`` label). A partial build can leave models of two sources under one
family's names, which would answer the same image differently: only the newest model's source is served.
``python -m fastinfer.catalog.holdings NAME`` is ``make serve``'s check that the store holds family NAME.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from fastinfer.catalog import rebuild, store
from fastinfer.common.home import bentoml_home

if TYPE_CHECKING:
    from bentoml import Model

logger = logging.getLogger("fastinfer.family")

_held_by_pins: dict[str, dict[str, list[str]]] = {}  # pins as set → what the store held: a server asks once
_scans: dict[tuple[tuple[str, str], ...], dict[str, Model]] = {}  # the latest pointers → the models they name


def held() -> dict[str, list[str]]:
    """The families the model store holds → their store names ({} when it cannot be listed); once in a server."""
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


def missing_reason(
    name: str | None = None, verb: str = "serve", named: Callable[[str], str] | None = None
) -> str | None:
    """Why family ``name`` (default: this process's) cannot be used at all: the store holds no model of it.
    Says which families it holds and how to build this one (``named``: how the user names a family)."""
    name = name or store.family()
    named = named or (lambda family: f"{store.FAMILY_ENV}={family}")
    found = held()
    if name in found:
        return None
    others = ", ".join(f"{family} ({len(names)} models)" for family, names in found.items() if family != name)
    holds = f"it holds {others}" if others else "it holds no model family at all"
    use_other = f", or {verb} one it holds ({named(next(iter(found)))})" if others else ""
    restart = ", then restart the server" if os.environ.get(store.PINS_ENV) is not None else ""
    return (
        f"the model store holds no model of family {name!r} ({named(name)}); {holds}. "
        f"Build it with {rebuild.build_command(name)}{use_other}{restart}"
    )


def family_names(name: str | None = None) -> list[str]:
    """The store names that may hold family ``name``'s models: those its name starts (:func:`latest` checks
    the label: "shop-x-onnx" may be family "shop-x"'s)."""
    folder = bentoml_home() / "models"
    prefix = f"{name or store.family()}-"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith(prefix))


def _pointer(name: str) -> str:
    """The version a store name's ``:latest`` names, from BentoML's ``latest`` file: cheaper than model.yaml."""
    try:
        return (bentoml_home() / "models" / name / "latest").read_text().strip()
    except OSError:
        return ""


def latest(name: str | None = None) -> dict[str, Model]:
    """Family ``name``'s latest stored models (store name → model), read again only once the store changed."""
    names = family_names(name)
    key = tuple((n, _pointer(n)) for n in names)
    if key not in _scans:
        try:
            family = name or store.family()
            _scans[key] = {n: m for n, m in store.latest(names).items() if store.family_of(m) == family}
        except Exception as exc:  # a model.yaml BentoML cannot read: its backend says so where it is loaded
            logger.warning("the model store cannot be read: %s", exc)
            return {}
    return _scans[key]


def _newest(models: Mapping[str, Model]) -> Model:
    return max(models.values(), key=lambda m: (m.info.creation_time, str(m.tag)))


def _source(model: Model) -> str:
    return model.info.labels.get("source_hash", "")


def rebuild_whole(newest: Model, family: str) -> str:
    info = store.describe(newest)
    return rebuild.build_command(family, info.weights, info.preprocess, whole=True)


def one_source(
    models: Mapping[str, Model], family: str, restart: bool = False
) -> tuple[dict[str, Model], dict[str, str]]:
    """``models`` (a family's latest, by store name) split into those built from the source of its newest
    model, which are served, and the others → why each is not, and how to rebuild the whole family."""
    if not models:
        return {}, {}
    newest = _newest(models)
    source = _source(newest)
    kept = {name: model for name, model in models.items() if _source(model) == source}
    if len(kept) == len(models):
        return kept, {}
    how = rebuild_whole(newest, family) + (", then restart the server" if restart else "")
    apart = {
        name: f"{model.tag} was built from other weights, labels or preprocessing (source hash "
        f"{_source(model) or 'none'}) than the rest of model family {family!r} (source hash {source}, as its newest "
        f"model {newest.tag}): not served; rebuild {how}"
        for name, model in models.items()
        if name not in kept
    }
    return kept, apart


def mixed_warning(kept: Mapping[str, Model], apart: Mapping[str, str], family: str) -> str:
    """The one line a server logs at start-up about the models of its family it does not serve."""
    newest = _newest(kept)
    return (
        f"model family {family!r} holds models of two sources: serving only those built like its newest model "
        f"{newest.tag} (source hash {_source(newest)}); not serving {', '.join(sorted(apart))}, built from other "
        f"weights, labels or preprocessing; rebuild {rebuild_whole(newest, family)}, then restart the server"
    )


def pin(names: list[str], family: str) -> tuple[dict[str, str], dict[str, str]]:
    """At a server's start-up: the tags it serves, and the stored ones it does not serve → why (logged)."""
    kept, apart = one_source(store.latest(names), family, restart=True)
    if apart:
        logger.warning("%s", mixed_warning(kept, apart, family))
    return {name: str(model.tag) for name, model in kept.items()}, apart


def apart_now(name: str | None = None) -> dict[str, str]:
    """Outside a server: family ``name``'s latest stored models that are not served → why."""
    name = name or store.family()
    return one_source(latest(name), name)[1]


def build_hint(name: str | None = None) -> str:
    """What to run for a model missing from family ``name``: the build of it as its stored models were built."""
    name = name or store.family()
    models = latest(name)
    if not models:
        return f"run {rebuild.build_command(name)}"
    info = store.describe(_newest(models))
    weights = rebuild.family_weights(name, info.weights)
    if not rebuild.source_args(name, weights, info.preprocess):
        return "run `python -m build_models`"  # the default family, as the build makes it by default
    return f"run {rebuild.build_command(name, weights, info.preprocess)}"


def serving(backend: str, batch: int | None = None) -> Model | None:
    """The model served for a store name: the pinned version in a server (PinnedModelGone when deleted), else
    the latest; NotServed for one of another source than its family's newest. None when never built."""
    from bentoml.exceptions import NotFound

    name = store.model_name(backend, batch)
    pinned = store.pins()
    if pinned is None:
        if (why := apart_now().get(name)) is not None:
            raise store.NotServed(why)
        return store.find(backend, batch)
    if name not in pinned:
        if (why := store.unserved().get(name)) is not None:
            raise store.NotServed(why)
        return None  # not stored when this server started: it serves without it until restarted
    pinned_tag = pinned[name]
    try:
        return store.get(pinned_tag)
    except NotFound:
        pass
    except Exception as exc:  # its model.yaml deleted or garbled since
        why = f"{pinned_tag}, the version this server started with, is unreadable now: {exc}"
        raise store.PinnedModelGone(why) from None
    try:
        now_stored = store.find(backend, batch)
    except Exception:  # a store whose latest pointer names a deleted version, say
        now_stored = None
    now = f"; the store now holds {now_stored.tag}" if now_stored is not None else ""
    raise store.PinnedModelGone(
        f"{pinned_tag}, the version this server started with, is no longer in the model store{now}: "
        "restart the server to serve what is stored"
    )


def serving_or_none(backend: str, batch: int | None = None) -> Model | None:
    """:func:`serving`, with None for a pinned version that is gone (its backend says why elsewhere)."""
    try:
        return serving(backend, batch)
    except store.PinnedModelGone:
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m fastinfer.catalog.holdings NAME``: 0 when the store holds family NAME, else 1 and why."""
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
