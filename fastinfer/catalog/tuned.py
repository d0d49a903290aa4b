"""The tuned configuration: what ``fastinfer tune`` measured best on this machine, as settings.

``$BENTOML_HOME/tuned/tuned.json`` holds the ``FASTINFER_*`` values chosen and a fingerprint of the machine,
runtimes and models measured; it is in force only where the fingerprint matches, below the environment. A
file that does not hold here is ignored with one line saying why, never a failed start.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

from fastinfer.catalog import tune_space
from fastinfer.catalog.backends import BACKENDS, env_key
from fastinfer.common import hardware
from fastinfer.common.files import read_small
from fastinfer.common.home import bentoml_home

logger = logging.getLogger("fastinfer.tuned")
FILE_ENV = "FASTINFER_TUNED"  # its path; `off` ignores any; unset: $BENTOML_HOME/tuned/tuned.json
RESOLVED_ENV = "FASTINFER_TUNED_RESOLVED"  # set by `bentoml serve`'s parent for its workers (here())
FORMAT = 1
MAX_BYTES = 1024 * 1024  # a tuned file is a few KB; a huge one is not ours
MAX_WHY = 300  # characters of a reason to ignore it
# The settings that decide served throughput; a tuned file holds only the values the tuner chooses from.
_KEYS = "|".join(env_key(backend) for backend in BACKENDS)
TUNABLE = re.compile(
    rf"FASTINFER_(DEFAULT_BACKEND|FRONT_WORKERS|RUNNER_WORKERS|THREADS|IN_FRONT|DECODE_THREADS"
    rf"|(BATCHING|MAX_BATCH_SIZE|MAX_LATENCY_MS)_({_KEYS}))"
)
# Settings since removed, which the environment or a tuned file of an earlier version may still set: the environment's
# is ignored and said once (the server's deployment hook), a tuned file naming one is ignored whole.
REMOVED = {
    "FASTINFER_SCHEDULING": "`turns` measured no gain: docs/tuning.md#scheduling",
    "FASTINFER_GROQ_BASE_URL": "GROQ_BASE_URL, the groq SDK's own variable, says where Groq is",
    "FASTINFER_MAX_UPLOADS": "bodies arriving at once are twice FASTINFER_MAX_CONCURRENCY",
    "FASTINFER_RUNNER_TELEMETRY": "BentoML's configuration adds a runner's log, metrics and spans: "
    "docs/metrics.md#runner-telemetry",
}
RUNTIMES = ("fastinfer", "bentoml", "onnxruntime", "openvino", "torch", "coremltools")
MACHINE_KEYS = ("machine", "cpu", "cores", "isa")  # what makes two machines the same for a measurement


def default_path() -> Path:
    return bentoml_home() / "tuned" / "tuned.json"


def path() -> Path | None:
    """Where this process looks for the tuned file (None: FASTINFER_TUNED=off)."""
    raw = os.environ.get(FILE_ENV, "").strip()
    if raw.lower() == "off":
        return None
    return Path(raw) if raw else default_path()


def runtime_versions() -> dict[str, str]:
    versions = {}
    for name in RUNTIMES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def machine_fingerprint(hw: dict[str, Any] | None = None) -> dict[str, Any]:
    """This machine as a tuning depends on it: CPU, instruction sets, usable cores, runtime versions."""
    hw = hw if hw is not None else hardware.probe()
    return {**{key: hw.get(key) for key in MACHINE_KEYS}, "runtimes": runtime_versions()}


@dataclass(frozen=True)
class Tuned:
    """The tuned file as this process found it: its settings when in force, else why not."""

    path: str
    status: Literal["in force", "ignored", "none"] = "none"
    why: str = ""
    created: str = ""
    goal: str = ""
    settings: dict[str, str] = field(default_factory=dict)  # empty unless in force

    @property
    def in_force(self) -> bool:
        return self.status == "in force"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# What a server's parent exported (:func:`export`).
_RESOLVED = TypeAdapter(Tuned)


def _mismatch(recorded: dict[str, Any], here: dict[str, Any]) -> list[str]:
    differs = [key for key in MACHINE_KEYS if recorded.get(key) != here.get(key)]
    runtimes, now = recorded.get("runtimes") or {}, here.get("runtimes") or {}
    differs += [
        f"{name} {str(runtimes.get(name))[:40]} → {now.get(name)}"
        for name in RUNTIMES
        if runtimes.get(name) != now.get(name)
    ]
    return differs


def check(
    data: Any, here: dict[str, Any], stored: dict[str, str | None], can_run: dict[str, str | None]
) -> tuple[dict[str, str], str]:
    """The settings of a parsed tuned file if it holds here, else ({}, why not). ``stored``: model name → the
    tag served now; ``can_run``: backend → None, or why it cannot."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}, f"not a tuned file of format {FORMAT}"
    settings, recorded = data.get("settings"), data.get("fingerprint")
    if not isinstance(settings, dict) or not isinstance(recorded, dict) or not isinstance(recorded.get("models"), dict):
        return {}, "its settings or fingerprint are missing"
    if gone := sorted(REMOVED.keys() & settings.keys()):  # the tuner wrote it only when it chose `turns`
        return {}, (
            f"it was tuned with {gone[0]}, since removed ({REMOVED[gone[0]]}), and its other values were "
            "measured with it; run `fastinfer tune` again"
        )
    if not settings:
        return {}, "it sets nothing"
    if not recorded["models"]:
        return {}, "it records no model versions: nothing says what it was measured with"
    if bad := [k for k in settings if not TUNABLE.fullmatch(str(k))]:
        return {}, f"it sets what tuning may not: {', '.join(map(str, bad))[:200]}"
    if odd := [str(k) for k, v in settings.items() if not isinstance(v, str)]:
        return {}, f"its values must be strings, as in the environment: {', '.join(odd)[:200]}"
    if differs := _mismatch(recorded, here):
        return {}, f"tuned on another machine or runtime ({', '.join(differs)})"
    if gone := [name for name, tag in recorded["models"].items() if stored.get(name) != tag]:
        return {}, f"tuned for models no longer served here ({', '.join(sorted(gone))}); run `fastinfer tune` again"
    # One value the tuner never chose leaves the whole file out: its other values were measured only with it.
    cores = here.get("cores") if isinstance(here.get("cores"), int) else 1
    if why := tune_space.why_not(settings, cores):
        return {}, why
    backend = settings["FASTINFER_DEFAULT_BACKEND"].strip()  # the engine in front, if any, is this one
    if backend not in can_run:
        return {}, f"it names no backend: {backend[:40]!r}"
    if (why := can_run[backend]) is not None:
        return {}, f"it chose {backend}, which cannot run here: {why}"
    return settings, "in force"


def load(where: Path | None = None) -> Tuned:
    """The tuned file at ``where`` (default: :func:`path`) as it holds on this machine, never raising."""
    from fastinfer.catalog.backends import BACKENDS, unavailable_reason

    where = path() if where is None else where
    if where is None:
        return Tuned("", status="none", why=f"{FILE_ENV}=off")
    shown = shown_path(where)
    try:
        data = json.loads(_read(where))
    except FileNotFoundError:
        if os.path.lexists(where):  # the name is there: a link to a file that is not
            return Tuned(shown, status="ignored", why="a symlink to nothing")
        return Tuned(shown, status="none", why="no tuned file: `fastinfer tune` writes one")
    except Exception as exc:  # a loop, a name too long, a NUL, a folder it may not read, not a file, not JSON
        return Tuned(shown, status="ignored", why=_unreadable(exc))
    try:
        recorded = ((data.get("fingerprint") or {}).get("models") or {}) if isinstance(data, dict) else {}
        stored = model_tags(list(recorded)) if isinstance(recorded, dict) else {}
        settings, why = check(data, machine_fingerprint(), stored, {b: unavailable_reason(b) for b in BACKENDS})
    except Exception as exc:  # unreadable, truncated, not JSON, nested past the parser's depth, odd shapes
        return Tuned(shown, status="ignored", why=_unreadable(exc))
    if not settings:  # the reason quotes the file: kept short (every worker inherits it in its environment)
        return Tuned(shown, status="ignored", why=why[:MAX_WHY])
    created, goal = (_plain(data.get(key)) for key in ("created", "goal"))
    return Tuned(shown, "in force", created=created, goal=goal, settings=settings)


def _unreadable(exc: Exception) -> str:
    """Why a file could not be read, in one line; an OSError by its errno's words, not the path (clients see this)."""
    said = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"unreadable ({type(exc).__name__}: {' '.join(said.split())[:120]})"


def _read(where: Path) -> str:
    return read_small(where, MAX_BYTES).decode("utf-8")


def _plain(value: Any) -> str:
    """A free-text field of the file as the API page may show it: one short line, no Markdown or HTML."""
    return re.sub(r"[^A-Za-z0-9 .,:;=_+/()\-]", "", str(value or ""))[:80]


def shown_path(where: Path) -> str:
    """The file's path as clients may see it: under BentoML's home as $BENTOML_HOME/…, else its name."""
    try:
        return f"$BENTOML_HOME/{where.resolve().relative_to(bentoml_home().resolve())}"
    except Exception:  # not under it; or either path cannot resolve (3.11 raises RuntimeError for a symlink loop)
        return where.name


def model_tags(names: list[str] | None = None) -> dict[str, str | None]:
    """Store name → the tag this process serves for it, or None; every backend's models when ``names`` is None."""
    from fastinfer.catalog import holdings
    from fastinfer.catalog.backends import SPECS

    where = {
        name: (spec.artifact, batch)
        for spec in SPECS.values()
        for name, batch in zip(spec.model_names(), spec.static_batches, strict=True)
    }
    tags: dict[str, str | None] = {}
    for name in where if names is None else names:
        try:
            model = holdings.serving(*where[name]) if name in where else None
        except LookupError:  # the pinned version is gone
            model = None
        tags[name] = str(model.tag) if model is not None else None
    return tags


def warn_removed(names: list[str], where: str) -> None:
    for name in names:
        logger.warning("%s in %s is ignored: the setting was removed (%s)", name, where, REMOVED[name])


def removed_in_environment() -> list[str]:
    """The removed settings the environment still sets (said once, by the server's deployment hook)."""
    return [name for name in REMOVED if os.environ.get(name, "").strip()]


def warn_ignored(where: str, why: str) -> None:
    logger.warning("tuned configuration %s ignored: %s; the rule-based defaults apply", where, why)


def here() -> Tuned:
    """This process's tuned configuration: under ``bentoml serve``, what the server's parent read (RESOLVED_ENV),
    so that no two processes serve with two versions of the file; elsewhere the file, read when asked."""
    if resolved := os.environ.get(RESOLVED_ENV):
        try:
            found = _RESOLVED.validate_json(resolved)
            if not all(TUNABLE.fullmatch(k) for k in found.settings):  # a value copied from elsewhere
                raise ValueError("settings a tuned file cannot hold")
        except Exception:  # not JSON, nested past the parser's depth, odd shapes: not what the parent set
            return Tuned("", status="ignored", why=f"{RESOLVED_ENV} is not what the server's parent set")
        return replace(found, created=_plain(found.created), goal=_plain(found.goal))
    tuned = load()
    if tuned.status == "ignored":  # the settings carry on by rule
        warn_ignored(tuned.path, tuned.why)
    return tuned


def export(tuned: dict[str, Any]) -> None:
    """Fix, for every process the server starts from now on, the tuned configuration this one read."""
    os.environ[RESOLVED_ENV] = json.dumps(tuned)
