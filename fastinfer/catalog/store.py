"""The BentoML model store as FastInfer uses it: names, labels, metadata, lookups.

Models are named ``<family>-<backend>[-b<N>]`` and labelled with family, backend, precision, batch, weights and
source hash; their metadata carries the I/O contract, preprocessing and class names, so serving needs only the store.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from fastinfer.common import leases
from fastinfer.common.home import bentoml_home
from fastinfer.engines import DEFAULT_INPUT_SIZE, IMAGENET_MEAN, IMAGENET_STD

logger = logging.getLogger("fastinfer.store")

if TYPE_CHECKING:
    from bentoml import Model

BUILD_FORMAT = "2"  # bumped when an export changes, so that models of an older build are rebuilt


def input_spec(crop_size: int) -> dict[str, Any]:
    return {"name": "images", "dtype": "uint8", "shape": ["N", crop_size, crop_size, 3], "layout": "NHWC RGB"}


def output_spec(num_classes: int) -> dict[str, Any]:
    return {"name": "logits", "dtype": "float32", "shape": ["N", num_classes]}


@dataclass(frozen=True)
class PreprocessSpec:
    """The preprocessing a model's weights expect (torchvision's ImageClassification; default ImageNet's): the
    front resizes and crops, the model's graph normalises by ``mean`` and ``std``."""

    resize_size: int = 232
    crop_size: int = DEFAULT_INPUT_SIZE
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


_PREPROCESS = TypeAdapter(PreprocessSpec)  # as a model's metadata holds it: numbers as YAML wrote them

FAMILY_ENV = "FASTINFER_MODEL"  # the family a server serves and the tools measure
DEFAULT_FAMILY = "resnet50"
# A BentoML model name is at most 63 characters; the longest suffix a backend adds is 18 (-onnx-int8-dynamic).
_FAMILY_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_.-]{0,38}[a-z0-9])?")


class BadFamilyName(ValueError):
    """A family name that BentoML's store cannot hold as the start of a model name."""


def check_family(name: str) -> str:
    """``name`` when it can name a family, else BadFamilyName saying what a name may be."""
    if not _FAMILY_NAME.fullmatch(name):
        raise BadFamilyName(
            f"{name[:60]!r} cannot name a model family: 1 to 40 characters of a-z, 0-9, '-', '_' and '.', "
            "starting and ending with a letter or digit (it starts the names of its models in the BentoML store)"
        )
    return name


def family() -> str:
    """The family this process serves: FASTINFER_MODEL, default ``resnet50``."""
    return check_family(os.environ.get(FAMILY_ENV, "").strip() or DEFAULT_FAMILY)


def model_name(backend: str, batch: int | None = None, family_name: str | None = None) -> str:
    """The store name of ``backend``'s model (at a static ``batch``) in a family (default: this process's)."""
    return f"{family_name or family()}-{backend}" + (f"-b{batch}" if batch else "")


@dataclass(frozen=True)
class StoredModelInfo:
    """What the service needs to know about one stored model."""

    tag: str
    path: str
    backend: str
    weights: str
    source_hash: str
    preprocess: PreprocessSpec
    categories: list[str]
    family: str = DEFAULT_FAMILY
    num_classes: int = 0  # len(categories) when the store does not say
    weights_description: str = ""
    accuracy: dict[str, Any] | None = None  # measured by the build with --eval-dir, else None


_PARSED: OrderedDict[tuple[str, int, int, int, int], Model] = OrderedDict()
_PARSED_KEPT = 256  # records (~75 KB each): every version a long-lived server or a test run reads


def _bentoml() -> Any:
    """The bentoml module, its model records read with libyaml's loader (fastinfer/compat/bentoml.py)."""
    import bentoml

    from fastinfer.compat.bentoml import read_records_with_libyaml

    read_records_with_libyaml()
    return bentoml


def get(tag: str) -> Model:
    """``bentoml.models.get(tag)`` (raising as it does), parsed once per process while the version's model.yaml is
    unchanged: BentoML would parse its 15 KB of YAML on each of service.py's 37 calls."""
    from fastinfer.compat.bentoml import model_store_dir

    bentoml = _bentoml()
    asked = bentoml.Tag.from_taglike(tag)  # a tag BentoML refuses is refused here, never answered from the cache
    folder = model_store_dir() / asked.name
    try:
        version = asked.version if asked.version not in (None, "latest") else (folder / "latest").read_text().strip()
        exact = bentoml.Tag(asked.name, version)  # a `latest` naming no version BentoML allows: it says why below
        stat = (folder / version / "model.yaml").stat()
    except (OSError, ValueError):
        return bentoml.models.get(tag)  # BentoML says what is missing
    # ctime too: a same-size rewrite in place that keeps the mtime (cp -p, rsync --inplace) still changes it
    key = (str(folder / version), stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino)
    if (model := _PARSED.get(key)) is None:
        model = _PARSED[key] = bentoml.models.get(exact)
        if len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    return model


def find(backend: str, batch: int | None = None, family_name: str | None = None) -> Model | None:
    """The latest stored model for a backend of a family (default: this process's), or None."""
    from bentoml.exceptions import NotFound

    name = model_name(backend, batch, family_name)
    try:
        return get(f"{name}:latest")
    except NotFound:
        return None
    except Exception as exc:  # its model.yaml deleted or garbled (BentoMLException, KeyError, a YAML error)
        logger.warning("%s:latest is unreadable (%s); `python -m build_models` rebuilds it", name, exc)
        return None


def families() -> dict[str, list[str]]:
    """The families the store holds → their store names."""
    bentoml = _bentoml()
    found: dict[str, list[str]] = {}
    for model in bentoml.models.list():
        owner = family_of(model)
        if owner is not None and model.tag.name not in found.setdefault(owner, []):
            found[owner].append(model.tag.name)
    return {owner: sorted(names) for owner, names in sorted(found.items())}


def family_of(model: Model) -> str | None:
    """The family a stored model belongs to: its ``family`` label (one stored before families: ``resnet50``'s)."""
    default = DEFAULT_FAMILY if model.tag.name.startswith(f"{DEFAULT_FAMILY}-") else None
    return model.info.labels.get("family") or default


def unreadable(name: str) -> dict[str, str]:
    """Stored versions of ``name`` whose model.yaml is deleted or garbled → why (BentoML stores nothing beside them)."""
    from bentoml.exceptions import NotFound

    bentoml = _bentoml()
    found = {}
    for tag in versions(name):
        try:
            bentoml.models.get(tag)
        except NotFound:
            continue
        except Exception as exc:  # BentoMLException, KeyError, a YAML error: whatever a bad model.yaml raises
            found[tag] = f"{type(exc).__name__}: {exc}"
    return found


def versions(name: str) -> list[str]:
    """Every stored version of a store name, readable or not (BentoML's listing stops at a broken one)."""
    folder = bentoml_home() / "models" / name
    if not folder.is_dir():
        return []
    return sorted(f"{name}:{p.name}" for p in folder.iterdir() if p.is_dir())


# Set by the server at start-up, inherited by every worker: store name → the tag resolved then, so that every
# process of one server serves those versions, never whatever ``:latest`` is when it (re)starts.
PINS_ENV = "FASTINFER_PINNED_MODELS"
_NAMED = TypeAdapter(dict[str, str])  # store name → a tag (pins) or why (unserved), as JSON


def pins() -> dict[str, str] | None:
    """This server's pinned tags; None outside a server (then ``:latest`` is what serves)."""
    raw = os.environ.get(PINS_ENV)
    if raw is None:
        return None
    try:
        return _NAMED.validate_json(raw)
    except ValueError:
        raise ValueError(f"{PINS_ENV} is set by `bentoml serve` for its own workers (a JSON object of model tags); "
                         f"it holds {raw[:60]!r} here: unset it") from None  # fmt: skip


def latest(names: list[str]) -> dict[str, Model]:
    """Each stored name's ``:latest`` model now (a name never built is left out)."""
    from bentoml.exceptions import NotFound

    resolved = {}
    for name in names:
        try:
            resolved[name] = get(f"{name}:latest")
        except NotFound:
            continue  # not built: the backend answers 503 saying so
    return resolved


UNSERVED_ENV = "FASTINFER_UNSERVED_MODELS"  # beside PINS_ENV: store name → why it is stored but not served


def unserved() -> dict[str, str]:
    """This server's stored models that it does not serve → why ({} outside a server, or when none)."""
    try:
        return _NAMED.validate_json(os.environ.get(UNSERVED_ENV) or "{}")
    except ValueError:
        return {}


class PinnedModelGone(LookupError):
    """The version this server pinned at start-up is gone from the store, or not served (:class:`NotServed`)."""


class NotServed(PinnedModelGone):
    """A stored model built from another source than its family's newest (fastinfer.catalog.holdings)."""


# One ``.fastinfer-pinned-<supervisor pid>-<random>.json`` per running server in the models folder, listing the
# tags it pinned so a rebuild keeps them: a lease (fastinfer.common.leases) held while any process of it lives.
PIN_PREFIX = ".fastinfer-pinned-"
PIN_FILE_ENV = "FASTINFER_PIN_FILE"  # the pin file a server's workers hold (:func:`hold_pins`)


def models_folder() -> Path:
    """The model store's folder, symlinks resolved: every home sharing one store names the same folder."""
    return (bentoml_home() / "models").resolve()


def record_pins(pinned: dict[str, str]) -> Path:
    """Record, for builds to see, the versions this server serves, as a lease its workers join."""
    path = models_folder() / f"{PIN_PREFIX}{os.getpid()}-{secrets.token_hex(6)}.json"
    leases.create(path, json.dumps(sorted(pinned.values())))
    os.environ[PIN_FILE_ENV] = str(path)
    return path


def _supervisor(pin_file: Path) -> int:
    return int(pin_file.stem.removeprefix(PIN_PREFIX).split("-")[0])


def hold_pins() -> None:
    """In a server's worker: hold its pin file while this worker lives, even if its supervisor is killed."""
    if not (path := os.environ.get(PIN_FILE_ENV)):
        return
    if not leases.hold(Path(path), _supervisor(Path(path))):
        logger.warning("%s is gone, or the server that wrote it has stopped: a build may remove the model "
                       "versions this worker serves", path)  # fmt: skip


def in_use() -> dict[str, int]:
    """Tags pinned by servers that still run → their supervisor's pid; pin files no process holds are removed."""
    used: dict[str, int] = {}
    if not (folder := models_folder()).is_dir():
        return used
    leases.sweep_drafts(folder)
    for path in sorted(folder.glob(f"{PIN_PREFIX}*.json")):
        if not leases.held(path):
            path.unlink(missing_ok=True)
            continue
        try:
            tags = json.loads(path.read_text())
            pid = _supervisor(path)
        except (OSError, ValueError):
            continue
        used.update(dict.fromkeys(map(str, tags), pid))
    return used


def describe(model: Model) -> StoredModelInfo:
    labels: dict[str, str] = dict(model.info.labels)
    meta: dict[str, Any] = dict(model.info.metadata)
    categories = [str(c) for c in meta.get("categories", [])]  # a hand-edited record may hold numbers
    return StoredModelInfo(
        tag=str(model.tag),
        path=model.path,
        backend=labels.get("backend", ""),
        weights=str(labels.get("weights", "unknown")),
        source_hash=labels.get("source_hash", ""),
        preprocess=_PREPROCESS.validate_python(meta.get("preprocess", {})),  # before families: the default's
        categories=categories,
        family=labels.get("family") or DEFAULT_FAMILY,
        num_classes=int(meta.get("num_classes", len(categories))),
        weights_description=str(meta.get("weights_description", "")),
        accuracy=meta.get("accuracy"),
    )


def family_spec(family_name: str | None = None) -> PreprocessSpec:
    """The preprocessing a family's stored models expect, for the tools that feed them outside a server."""
    for model in (find(backend, None, family_name) for backend in ("pytorch", "onnx")):
        if model is not None:
            return describe(model).preprocess
    return PreprocessSpec()


def is_current(model: Model | None, source_hash: str, built_by: str) -> bool:
    """True when a stored model was built from this source hash, in this build format, by this build code
    (``built_by``: build_models.context.build_code)."""
    if model is None:
        return False
    labels = model.info.labels
    return (labels.get("source_hash"), labels.get("build_format"), labels.get("built_by")) == (
        source_hash,
        BUILD_FORMAT,
        built_by,
    )
