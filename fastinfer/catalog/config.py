"""Settings: every ``FASTINFER_*`` environment variable, parsed once into one object that runners and the front
share, so a value means the same in every process ``bentoml serve`` starts. Defaults serve out of the box."""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import MISSING, dataclass, field, replace
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from fastinfer.catalog import backends, store
from fastinfer.catalog.backends import BACKENDS, SPECS
from fastinfer.common.client import API_KEY_SYNTAX

API_KEY_MIN_LENGTH = 16  # a short key is guessed: 401s are not rate limited
CACHE_HMAC_KEY_MIN_LENGTH = 32  # anyone who can read Redis holds (key, entry, MAC) triples: a short key is guessed


# Beyond these a value is a typo or a broken tuned file, not a configuration: refused at start-up.
MAX_WORKERS = 256
MAX_THREADS = 1024
MAX_BATCH_SIZE = 1024
MAX_LATENCY_MS = 10_000


def _env(names: str, doc: str, default: Any = MISSING, shown: str = "", **field_args: Any) -> Any:
    """A field set by the variable(s) ``names`` (space-separated) and its meaning, for docs/configuration.md's table
    (docs/hooks/settings_table.py); ``shown``: the default as the table says it, where the field's does not."""
    return field(default=default, metadata={"env": names.split(), "doc": doc, "shown": shown}, **field_args)


@dataclass(frozen=True)
class BatchingConfig:
    """A backend's adaptive batching (defaults: the backend table); ``<BACKEND>``: its name as in ``ONNX_INT8``."""

    enabled: bool = _env("FASTINFER_BATCHING_<BACKEND>", "requests go to the runner's `infer_batched` (on) or `infer`")
    max_batch_size: int = _env(
        "FASTINFER_MAX_BATCH_SIZE_<BACKEND>", f"largest batch a runner forms (1–{MAX_BATCH_SIZE})"
    )
    max_latency_ms: int = _env(
        "FASTINFER_MAX_LATENCY_MS_<BACKEND>",
        "how long a request reaching an idle runner waits for companions (under load batches form anyway; "
        f"0–{MAX_LATENCY_MS})",
    )


@dataclass(frozen=True)
class GroqConfig:
    api_key: str = _env(  # never printed
        "GROQ_API_KEY GROQ_API_KEY_FILE",
        "enables `/analyze`; `_FILE`: a file holding the key (a secret), instead. An empty or unreadable file stops "
        "start-up",
        "",
        repr=False,
    )
    model: str = _env("FASTINFER_GROQ_MODEL", "Groq model", "llama-3.1-8b-instant")
    base_url: str | None = _env(
        "FASTINFER_GROQ_BASE_URL GROQ_BASE_URL", "where the Groq API is (the first one set)", None, shown="Groq's"
    )
    timeout_s: float = _env("FASTINFER_GROQ_TIMEOUT_S", "Groq request timeout, seconds", 20.0)


@dataclass(frozen=True)
class Settings:
    model: str = _env(
        "FASTINFER_MODEL", "the model family served: `<model>-<backend>` in the store", store.DEFAULT_FAMILY
    )
    backends: tuple[str, ...] = _env(
        "FASTINFER_BACKENDS",
        "comma-separated backends this server serves; one left out starts no runner and answers 503 saying so "
        "(`all` or unset: every backend)",
        BACKENDS,
        shown="(every backend)",
    )
    default_backend: str = _env(  # `auto` follows this machine (fastinfer/catalog/choice.py)
        "FASTINFER_DEFAULT_BACKEND",
        "backend of requests that name none; `auto` (any case): the tuned file's, else the one recommended for this "
        "machine (measured, else by rule: see [Backends](backends.md#the-default-backend))",
        "auto",
    )
    max_bytes: int = _env("FASTINFER_MAX_BYTES", "largest request body (413 above it)", 20 * 1024 * 1024)
    max_pixels: int = _env("FASTINFER_MAX_PIXELS", "largest image, width × height (413, not decoded)", 50_000_000)
    front_workers: int = _env("FASTINFER_FRONT_WORKERS", f"front worker processes (1–{MAX_WORKERS})", 1)
    runner_workers: int = _env("FASTINFER_RUNNER_WORKERS", f"worker processes per runner (1–{MAX_WORKERS})", 1)
    threads: int = _env(
        "FASTINFER_THREADS", f"intra-op threads per runner process (0–{MAX_THREADS}; 0: cores ÷ runner workers)", 0
    )
    decode_threads: int = _env(
        "FASTINFER_DECODE_THREADS",
        f"threads per front worker that read, hash and decode images (0–{MAX_THREADS}; 0: one per core)",
        0,
    )
    runner_telemetry: bool = _env(
        "FASTINFER_RUNNER_TELEMETRY",
        "`true`: BentoML's log, metrics and spans for each call to a runner ([Metrics](metrics.md#runner-telemetry))",
        False,
    )
    request_timeout_s: int = _env(
        "FASTINFER_TIMEOUT_S", "request timeout, upload included (504; 408 if the body was not in)", 30
    )
    max_concurrency: int = _env(
        "FASTINFER_MAX_CONCURRENCY", "requests in flight per front worker (their body in); more get 429", 64
    )
    max_uploads: int = _env(
        "FASTINFER_MAX_UPLOADS",
        "bodies arriving at once per front worker; more get 429",
        128,
        shown="2 × `FASTINFER_MAX_CONCURRENCY` (`128`)",
    )
    body_idle_s: int = _env("FASTINFER_BODY_IDLE_S", "a request body that stalls this long gets 408", 10)
    # Per front worker, below the ASGI app (fastinfer/front/connections.py): before a request's headers are in.
    keepalive_s: int = _env(
        "FASTINFER_KEEPALIVE_S",
        "a connection with no request in progress closes after this long without a byte (before its first request "
        "too); behind a load balancer, set it above the balancer's idle timeout. It replaces "
        "`bentoml serve --timeout-keep-alive`",
        5,
    )
    header_timeout_s: int = _env(
        "FASTINFER_HEADER_TIMEOUT_S", "a request's line and headers must arrive within this of its first byte (408)", 10
    )
    max_header_bytes: int = _env("FASTINFER_MAX_HEADER_BYTES", "largest request line + headers (431)", 32768)
    max_headers: int = _env("FASTINFER_MAX_HEADERS", "most header fields in a request (431)", 100)
    max_connections: int = _env(
        "FASTINFER_MAX_CONNECTIONS",
        "open connections per front worker ([beyond it](overload.md#connections-and-headers))",
        1000,
    )
    min_free_disk_mb: int = _env(
        "FASTINFER_MIN_FREE_DISK_MB",
        "less free than this under `BENTOML_HOME` and `/readyz` answers 503 (`0`: only once metric files cannot "
        "be written)",
        16,
    )
    max_batch_images: int = _env(
        "FASTINFER_MAX_BATCH_IMAGES",
        "images in one `POST /classify/batch` (400 above it; the body still counts against `FASTINFER_MAX_BYTES`)",
        32,
    )
    batching: dict[str, BatchingConfig] = field(default_factory=dict)
    cache: str = _env("FASTINFER_CACHE", "`auto` | `redis` | `memory` | `off` (see [Cache](cache.md))", "auto")
    redis_url: str = _env(  # may carry a password
        "REDIS_URL FASTINFER_REDIS_PASSWORD FASTINFER_REDIS_PASSWORD_FILE",
        "the cache's Redis; its password apart (a secret): `FASTINFER_REDIS_PASSWORD`, put into the URL for you "
        "(percent-encoded; not also in the URL; never shown), or `_FILE`, a file holding it. An empty or unreadable "
        "file stops start-up",
        "redis://127.0.0.1:6379/0",
        shown="`redis://127.0.0.1:6379/0`, no password",
        repr=False,
    )
    cache_ttl_s: int = _env("FASTINFER_CACHE_TTL", "seconds an entry lives", 86400)
    cache_timeout_ms: int = _env("FASTINFER_CACHE_TIMEOUT_MS", "limit on each Redis call, ms", 50)
    cache_max_entries: int = _env("FASTINFER_CACHE_MAX_ENTRIES", "bound of the memory cache", 10000)
    cache_hmac_key: str = _env(  # empty: unsigned (never printed)
        "FASTINFER_CACHE_HMAC_KEY FASTINFER_CACHE_HMAC_KEY_FILE",
        f"signs cache entries (≥ {CACHE_HMAC_KEY_MIN_LENGTH} characters; the same on every server sharing the "
        "Redis); an entry without a valid signature is never served; `_FILE`: a file holding it, instead",
        "",
        shown="(none: unsigned)",
        repr=False,
    )
    groq: GroqConfig = field(default_factory=GroqConfig)
    api_keys: tuple[str, ...] = _env(  # empty: no key needed (never printed)
        "FASTINFER_API_KEYS FASTINFER_API_KEYS_FILE",
        f"comma-separated API keys (each ≥ {API_KEY_MIN_LENGTH} characters of letters, digits, `-._~+/`); when set, "
        "every API needs `Authorization: Bearer <key>` (see [Access](access.md)); `_FILE`: a file holding them "
        "(comma- or newline-separated), e.g. a Compose secret, instead. An empty or unreadable file stops start-up",
        (),
        shown="(none: open)",
        repr=False,
    )
    api_keys_from: str = ""  # the variable the keys came from (FASTINFER_API_KEYS or its _FILE), for the log
    analyze_per_minute: int = _env(  # each spends Groq quota
        "FASTINFER_ANALYZE_PER_MINUTE",
        "`/analyze` calls per client in any 60 s, per front worker (429 with `Retry-After` above it)",
        10,
    )
    analyze_total_per_minute: int = _env(
        "FASTINFER_ANALYZE_TOTAL_PER_MINUTE",
        "`/analyze` calls from all clients in any 60 s, per replica, shared out among its front workers (30: the "
        "free-tier request rate Groq publishes for its small models; not checked from here, so match it to your plan)",
        30,
    )
    contact: dict[str, str] = _env(  # noqa: RUF009 (a field(): default_factory) {}: not set
        "FASTINFER_CONTACT",
        "who answers for this server, shown on the API page: an `http(s)://` URL, an e-mail address (`mailto:` "
        "too), a name, or `Name <URL or address>`; anything else stops start-up",
        default_factory=dict,
    )
    in_front: frozenset[str] = _env(  # the runners whose engine the front worker holds
        "FASTINFER_IN_FRONT",
        "comma-separated backends whose engine runs inside the front worker instead of in a runner process (see "
        "[Architecture](architecture.md#where-engines-run)); needs `FASTINFER_FRONT_WORKERS=1`; `none`: every "
        "engine in its runner, whatever a tuned file says",
        frozenset(),
        shown="(none: every engine in its runner)",
    )
    tuned: dict[str, Any] = _env(  # noqa: RUF009 (a field()) the tuned file as found (fastinfer/catalog/tuned.py)
        "FASTINFER_TUNED",
        "the tuned file `fastinfer tune` writes and the server reads at start-up (see [Tuning](tuning.md)); `off`: "
        "ignore it",
        shown="`$BENTOML_HOME/tuned/tuned.json`",
        default_factory=dict,
    )
    sources: dict[str, str] = field(default_factory=dict)  # tunable variable → environment | tuned (if set)

    def batching_for(self, backend: str) -> BatchingConfig:
        return self.batching[backend]  # every backend has an entry (get_settings builds them all)


# The tuned file's values while get_settings parses (fastinfer/catalog/tuned.py): below the environment.
_tuned_values: dict[str, str] = {}


def _setting(name: str) -> str:
    """A setting as given: the environment's value, else the tuned file's, else "" (the default)."""
    return os.environ.get(name, "").strip() or _tuned_values.get(name, "").strip()


def _int(name: str, default: int) -> int:
    raw = _setting(name)
    if not raw:
        return default
    # Plain ASCII digits only: int() would also take "1_000", "٨" or "８" for a count.
    if not re.fullmatch(r"[+-]?[0-9]{1,15}", raw):
        raise ValueError(f"{name} must be an integer, got {raw[:40]!r}")
    return int(raw)


def _in_front(raw: str, front_workers: int) -> frozenset[str]:
    """FASTINFER_IN_FRONT as the runners named (``coreml`` brings in the runner serving it); ``none``: every engine
    in its runner, whatever a tuned file says (an empty value is unset, so it cannot)."""
    if raw.strip().lower() == "none":
        return frozenset()
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if unknown := [name for name in names if name not in BACKENDS]:
        raise ValueError(
            f"FASTINFER_IN_FRONT names no backend: {', '.join(repr(n[:40]) for n in unknown)}; "
            f"valid: {', '.join(BACKENDS)}"
        )
    if names and front_workers != 1:
        raise ValueError(
            "FASTINFER_IN_FRONT needs FASTINFER_FRONT_WORKERS=1: each front worker would load its own engine "
            f"and batch alone (FASTINFER_FRONT_WORKERS={front_workers}); runners batch across workers"
        )
    if off := [name for name in names if name not in backends.switched_on()]:
        raise ValueError(f"FASTINFER_IN_FRONT names backends FASTINFER_BACKENDS leaves out: {', '.join(off)}")
    return frozenset(SPECS[name].runner_name for name in names)


def _bounded(name: str, default: int, low: int, high: int) -> int:
    value = _int(name, default)
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}, got {value}")
    return value


BENTO_MODEL_ARGUMENT = "model"  # `make bento MODEL=NAME`: BentoML keeps it in the bento, set again where it is served


def _model() -> str:
    """FASTINFER_MODEL, the family served; unset, a bento's own (BENTO_MODEL_ARGUMENT) becomes it, for every
    lookup in the store and every process this one starts."""
    if not os.environ.get(store.FAMILY_ENV, "").strip() and (built_for := _bento_argument(BENTO_MODEL_ARGUMENT)):
        os.environ[store.FAMILY_ENV] = built_for
    try:
        return store.family()
    except store.BadFamilyName as exc:
        raise ValueError(f"{store.FAMILY_ENV}: {exc}") from None


def _bento_argument(name: str) -> str:
    """A bento argument (``--arg NAME=VALUE``, or a served bento's own); "" when not given or without BentoML."""
    if "bentoml" not in sys.modules:
        return ""
    import bentoml

    return str(getattr(bentoml.use_arguments(), name, "") or "").strip()


def _default_backend() -> str:
    """FASTINFER_DEFAULT_BACKEND: a backend, or ``auto`` (any case; unset too), which still lets a tuned file name
    the backend: auto means tuned, else measured, else the rule."""
    raw = os.environ.get("FASTINFER_DEFAULT_BACKEND", "").strip()
    if raw.lower() == "auto":
        raw = ""
    value = raw or _tuned_values.get("FASTINFER_DEFAULT_BACKEND", "").strip() or Settings.default_backend
    return "auto" if value.lower() == "auto" else value


def _positive(name: str, default: int, low: int = 1) -> int:
    """An integer >= ``low`` (1 or 0): a limit of 0 would refuse everything, not switch the limit off."""
    value = _int(name, default)
    if value < low:
        raise ValueError(f"{name} must be {'at least 1' if low else '0 or more'}, got {value}")
    return value


def _bool(name: str, default: bool) -> bool:
    raw = _setting(name).lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


SECRET_FILE_MAX_BYTES = 64 * 1024  # a secret is a few lines; /dev/zero as a secret file must not hang start-up


def _secret(name: str, file_name: str) -> tuple[str, str]:
    """(value, the variable it came from): ``name``'s, or the content of the file ``file_name`` names (Compose
    secrets are files); ("", "") when neither is set. Set means meant: an unreadable or empty file stops start-up."""
    path = os.environ.get(file_name, "").strip()  # empty = unset (compose leaves it empty on purpose)
    if not path:
        return os.environ.get(name, "").strip(), name if name in os.environ else ""
    if os.environ.get(name, "").strip():
        raise ValueError(f"set {name} or {file_name}, not both")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block start-up, a device never end
            raise ValueError(f"{file_name}: {path!r} is not a regular file")
        with open(path, "rb") as f:
            value = f.read(SECRET_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{file_name}: cannot read {path!r} ({type(exc).__name__})") from None
    if len(value) > SECRET_FILE_MAX_BYTES:
        raise ValueError(f"{file_name}: {path!r} is larger than {SECRET_FILE_MAX_BYTES} bytes: not a secret file")
    try:
        text = value.decode("utf-8-sig").strip()  # a BOM (Windows editors) is not part of the secret
    except UnicodeDecodeError:
        raise ValueError(f"{file_name}: {path!r} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{file_name}: {path!r} is empty; unset {file_name} to run without it")
    return text, file_name


def _api_keys(raw: str, source: str) -> tuple[str, ...]:
    """Comma- or newline-separated keys; each must be sendable as a Bearer token (RFC 6750 token68)."""
    keys = tuple(dict.fromkeys(k.strip() for k in raw.replace("\n", ",").split(",") if k.strip()))
    if source and not keys:  # e.g. an empty value from a Secret: running open by mistake is worse than not starting
        raise ValueError(f"{source} is set but holds no key; unset it to run without API keys")
    for number, key in enumerate(keys, 1):
        if not API_KEY_SYNTAX.fullmatch(key):  # the key itself is never echoed
            raise ValueError(
                f"{source}: key {number} of {len(keys)} has characters a Bearer token cannot carry "
                "(allowed: letters, digits and -._~+/ with = only at the end)"
            )
        if len(key) < API_KEY_MIN_LENGTH:
            raise ValueError(
                f"{source}: key {number} of {len(keys)} is shorter than {API_KEY_MIN_LENGTH} characters; "
                'make one with: python3 -c "import secrets; print(secrets.token_urlsafe(32))"'
            )
    return keys


def _groq_key(raw: str, source: str) -> str:
    """One line of printable ASCII: anything else would break the HTTP header of every call to Groq."""
    if not (raw.isascii() and raw.isprintable()) or any(c.isspace() for c in raw):
        raise ValueError(f"{source}: a Groq key is one line of printable ASCII without spaces")
    return raw


def _redis_url(url: str) -> str:
    """REDIS_URL with FASTINFER_REDIS_PASSWORD (or its _FILE) put in, percent-encoded: any character may be in it."""
    password, source = _secret("FASTINFER_REDIS_PASSWORD", "FASTINFER_REDIS_PASSWORD_FILE")
    if not password:
        return url
    parts = urlsplit(url)
    if parts.password is not None or "password=" in parts.query:
        raise ValueError(f"REDIS_URL holds a password and {source} is set: give it in one place")
    user = parts.netloc.rpartition("@")[0]  # a username stays (already encoded)
    netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def _cache_hmac_key(raw: str, source: str) -> str:
    if source and not raw:  # set means meant: an empty Secret value must not leave the cache unsigned
        raise ValueError(f"{source} is set but holds no key; unset it to run with unsigned cache entries")
    if raw and len(raw) < CACHE_HMAC_KEY_MIN_LENGTH:  # the key itself is never echoed
        raise ValueError(
            f"{source} is shorter than {CACHE_HMAC_KEY_MIN_LENGTH} characters; "
            'make one with: python3 -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    return raw


CONTACT_URL = re.compile(r"https?://[^\s<>\"]+", re.IGNORECASE)
CONTACT_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def _contact(raw: str) -> dict[str, str]:
    """FASTINFER_CONTACT as OpenAPI's ``info.contact``. A name holds no angle brackets: Swagger UI renders HTML."""
    raw = raw.strip()
    if not raw:
        return {}
    if len(raw) > 200 or not raw.isprintable():
        raise ValueError("FASTINFER_CONTACT must be one line of at most 200 printable characters")
    name, target = "", raw
    if (named := re.fullmatch(r"([^<>]*?)\s*<([^<>]*)>", raw)) is not None:
        name, target = named.group(1).strip(), named.group(2).strip()
    if target[:7].lower() == "mailto:":
        target = target[7:]
    if CONTACT_URL.fullmatch(target):
        return {"name": name or target, "url": target}
    if CONTACT_EMAIL.fullmatch(target):
        return {"name": name or target, "email": target}
    if named is None and not re.search(r"://|@|[<>]", raw):
        return {"name": raw}
    raise ValueError("FASTINFER_CONTACT must be an http(s) URL, an e-mail address, a name, or 'Name <URL or address>'")


def _batching(backend: str) -> BatchingConfig:
    key = backends.env_key(backend)
    on, size, latency = SPECS[backend].batching
    return BatchingConfig(
        enabled=_bool(f"FASTINFER_BATCHING_{key}", on),
        max_batch_size=_bounded(f"FASTINFER_MAX_BATCH_SIZE_{key}", size, 1, MAX_BATCH_SIZE),
        max_latency_ms=_bounded(f"FASTINFER_MAX_LATENCY_MS_{key}", latency, 0, MAX_LATENCY_MS),
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings: the environment, then the tuned file where it is in force here (the environment
    wins). Tuned values that do not parse or clash with the environment leave the tuned file out, never fail."""
    from fastinfer.catalog import tuned as tuning

    _model()  # first: the tuned file is for one family's models, and a bad name stops start-up here
    found = tuning.here()
    untuned = _parse({}, found.as_dict() if not found.in_force else {})  # the environment's own errors stop start-up
    if not found.in_force:
        return untuned
    try:
        return _parse(found.settings, found.as_dict())
    except ValueError as exc:
        why = f"its values do not hold with this environment: {exc}"
        tuning.warn_ignored(found.path, why)
        return replace(untuned, tuned={**found.as_dict(), "status": "ignored", "why": why, "settings": {}})


def _parse(tuned_values: dict[str, str], tuned: dict[str, Any]) -> Settings:
    _tuned_values.clear()
    _tuned_values.update(tuned_values)
    try:
        settings = _from_environment()
    finally:
        _tuned_values.clear()

    def from_environment(name: str) -> bool:
        value = os.environ.get(name, "").strip()
        return bool(value) and not (name == "FASTINFER_DEFAULT_BACKEND" and value.lower() == "auto")

    sources = {name: "environment" if from_environment(name) else "tuned" for name in tuned_values}
    sources |= {name: "environment" for name in os.environ if tuning_name(name) and from_environment(name)}
    return replace(settings, tuned=tuned, sources=sources)


def tuning_name(name: str) -> bool:
    from fastinfer.catalog.tuned import TUNABLE

    return TUNABLE.fullmatch(name) is not None


def _from_environment() -> Settings:
    default_backend = _default_backend()
    if os.environ.get("FASTINFER_CACHE", "auto").strip().lower() not in ("", "auto", "redis", "memory", "off"):
        raise ValueError("FASTINFER_CACHE must be one of auto, redis, memory, off")
    if default_backend != "auto" and default_backend not in BACKENDS:
        raise ValueError(f"FASTINFER_DEFAULT_BACKEND must be auto or one of {', '.join(BACKENDS)}")
    served = backends.switched_on()
    if default_backend != "auto" and default_backend not in served:
        raise ValueError(
            f"FASTINFER_DEFAULT_BACKEND={default_backend} is not among FASTINFER_BACKENDS={','.join(served)}"
        )
    # Read where the engine opens (the backend table); checked here so that a bad value stops start-up.
    backends.openvino_precision()
    max_concurrency = _positive("FASTINFER_MAX_CONCURRENCY", Settings.max_concurrency)
    api_keys, api_keys_from = _secret("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE")
    front_workers = _bounded("FASTINFER_FRONT_WORKERS", Settings.front_workers, 1, MAX_WORKERS)
    cache_hmac = _secret("FASTINFER_CACHE_HMAC_KEY", "FASTINFER_CACHE_HMAC_KEY_FILE")
    return Settings(
        model=_model(),
        backends=served,
        default_backend=default_backend,
        max_bytes=_positive("FASTINFER_MAX_BYTES", Settings.max_bytes),
        max_pixels=_positive("FASTINFER_MAX_PIXELS", Settings.max_pixels),
        front_workers=front_workers,
        runner_workers=_bounded("FASTINFER_RUNNER_WORKERS", Settings.runner_workers, 1, MAX_WORKERS),
        threads=_bounded("FASTINFER_THREADS", Settings.threads, 0, MAX_THREADS),
        decode_threads=_bounded("FASTINFER_DECODE_THREADS", Settings.decode_threads, 0, MAX_THREADS),
        runner_telemetry=_bool("FASTINFER_RUNNER_TELEMETRY", Settings.runner_telemetry),
        request_timeout_s=_positive("FASTINFER_TIMEOUT_S", Settings.request_timeout_s),
        max_concurrency=max_concurrency,
        max_uploads=_positive("FASTINFER_MAX_UPLOADS", 2 * max_concurrency),
        body_idle_s=_positive("FASTINFER_BODY_IDLE_S", Settings.body_idle_s),
        keepalive_s=_positive("FASTINFER_KEEPALIVE_S", Settings.keepalive_s),
        header_timeout_s=_positive("FASTINFER_HEADER_TIMEOUT_S", Settings.header_timeout_s),
        max_header_bytes=_positive("FASTINFER_MAX_HEADER_BYTES", Settings.max_header_bytes),
        max_headers=_positive("FASTINFER_MAX_HEADERS", Settings.max_headers),
        max_connections=_positive("FASTINFER_MAX_CONNECTIONS", Settings.max_connections),
        min_free_disk_mb=_positive("FASTINFER_MIN_FREE_DISK_MB", Settings.min_free_disk_mb, 0),
        max_batch_images=_positive("FASTINFER_MAX_BATCH_IMAGES", Settings.max_batch_images),
        batching={name: _batching(name) for name in BACKENDS},
        cache=os.environ.get("FASTINFER_CACHE", "auto").strip().lower() or "auto",
        redis_url=_redis_url(os.environ.get("REDIS_URL", "").strip() or Settings.redis_url),
        cache_ttl_s=_int("FASTINFER_CACHE_TTL", Settings.cache_ttl_s),
        cache_timeout_ms=_int("FASTINFER_CACHE_TIMEOUT_MS", Settings.cache_timeout_ms),
        cache_max_entries=_int("FASTINFER_CACHE_MAX_ENTRIES", Settings.cache_max_entries),
        cache_hmac_key=_cache_hmac_key(*cache_hmac),
        api_keys=_api_keys(api_keys, api_keys_from),
        api_keys_from=api_keys_from,
        analyze_per_minute=_positive("FASTINFER_ANALYZE_PER_MINUTE", Settings.analyze_per_minute),
        analyze_total_per_minute=_positive("FASTINFER_ANALYZE_TOTAL_PER_MINUTE", Settings.analyze_total_per_minute),
        contact=_contact(os.environ.get("FASTINFER_CONTACT", "")),
        in_front=_in_front(_setting("FASTINFER_IN_FRONT"), front_workers),
        groq=GroqConfig(
            api_key=_groq_key(*_secret("GROQ_API_KEY", "GROQ_API_KEY_FILE")),
            model=os.environ.get("FASTINFER_GROQ_MODEL", "").strip() or GroqConfig.model,
            base_url=(os.environ.get("FASTINFER_GROQ_BASE_URL") or os.environ.get("GROQ_BASE_URL") or "").strip()
            or None,
            timeout_s=float(_int("FASTINFER_GROQ_TIMEOUT_S", int(GroqConfig.timeout_s))),
        ),
    )
