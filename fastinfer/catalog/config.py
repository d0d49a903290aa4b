"""Every ``FASTINFER_*`` variable as one pydantic-settings model, read once per process; each field's type,
default, bounds and description also make docs/configuration.md's table."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Annotated, Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fastinfer.catalog import backends, store
from fastinfer.catalog.backends import BACKENDS, SPECS
from fastinfer.common.client import API_KEY_SYNTAX
from fastinfer.common.files import TooLarge, read_small

API_KEY_MIN_LENGTH = 16  # a short key is guessed: 401s are not rate limited
CACHE_HMAC_KEY_MIN_LENGTH = 32  # anyone who can read Redis holds (key, entry, MAC) triples: a short key is guessed
SECRET_FILE_MAX_BYTES = 64 * 1024  # a secret is a few lines; /dev/zero as a secret file must not hang start-up
BACKEND_KEY = "<BACKEND>"  # in a per-backend variable's name: the backend's name as in ONNX_INT8
BENTO_MODEL_ARGUMENT = "model"  # `make bento MODEL=NAME`: BentoML keeps it in the bento, set again where it is served

# Beyond these a value is a typo or a broken tuned file, not a configuration: refused at start-up.
MAX_WORKERS = 256
MAX_THREADS = 1024
MAX_BATCH_SIZE = 1024
MAX_LATENCY_MS = 10_000


def _count(value: Any) -> Any:
    """Plain ASCII digits only: int() would also take "1_000", "٨" or "８" for a count."""
    if isinstance(value, str) and not re.fullmatch(r"[+-]?[0-9]{1,15}", value.strip()):
        raise ValueError(f"must be an integer, got {value.strip()[:40]!r}")
    return value


def _seconds(value: Any) -> Any:
    """A plain decimal: float() would also take "nan", "inf", "1e3" or "٨"."""
    if isinstance(value, str) and not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", value.strip()):
        raise ValueError(f"must be a number of seconds such as 20 or 2.5, got {value.strip()[:40]!r}")
    return value


CONTACT_URL = re.compile(r"https?://[^\s<>\"]+", re.IGNORECASE)
CONTACT_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


def _contact(raw: Any) -> Any:
    """FASTINFER_CONTACT as OpenAPI's ``info.contact``. A name holds no angle brackets: Swagger UI renders HTML."""
    if not isinstance(raw, str) or not (raw := raw.strip()):
        return raw or {}
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


Count = Annotated[int, BeforeValidator(_count)]
Positive = Annotated[Count, Field(ge=1)]  # a limit of 0 would refuse everything, not switch the limit off
Workers = Annotated[Count, Field(ge=1, le=MAX_WORKERS)]
Threads = Annotated[Count, Field(ge=0, le=MAX_THREADS)]


def _doc(default: Any, text: str, shown: str = "", **field_args: Any) -> Any:
    """A field with its meaning for docs/configuration.md's table; ``shown``: the default as the table says it."""
    return Field(default, description=text, json_schema_extra={"shown": shown} if shown else None, **field_args)


class BatchingConfig(BaseModel):
    """A backend's adaptive batching (defaults: the backend table); ``<BACKEND>``: its name as in ``ONNX_INT8``."""

    model_config = ConfigDict(frozen=True, validate_by_name=True)

    enabled: bool = _doc(
        ..., "requests go to the runner's `infer_batched` (on) or `infer`", alias="FASTINFER_BATCHING_<BACKEND>"
    )
    max_batch_size: Annotated[Count, Field(ge=1, le=MAX_BATCH_SIZE)] = _doc(
        ..., f"largest batch a runner forms (1–{MAX_BATCH_SIZE})", alias="FASTINFER_MAX_BATCH_SIZE_<BACKEND>"
    )
    max_latency_ms: Annotated[Count, Field(ge=0, le=MAX_LATENCY_MS)] = _doc(
        ...,
        "how long a request reaching an idle runner waits for companions (under load batches form anyway; "
        f"0–{MAX_LATENCY_MS})",
        alias="FASTINFER_MAX_LATENCY_MS_<BACKEND>",
    )


class GroqConfig(BaseModel):
    model_config = ConfigDict(frozen=True, validate_by_name=True)

    api_key: str = _doc(  # never printed
        "",
        "enables `/analyze`; `_FILE`: a file holding the key (a secret), instead. An empty or unreadable file stops "
        "start-up",
        repr=False,
        validation_alias=AliasChoices("GROQ_API_KEY", "GROQ_API_KEY_FILE"),
    )
    model: str = _doc("llama-3.1-8b-instant", "Groq model", alias="FASTINFER_GROQ_MODEL")
    base_url: str | None = _doc(
        None, "where the Groq API is (the `groq` SDK's variable)", "Groq's", alias="GROQ_BASE_URL"
    )
    timeout_s: Annotated[float, BeforeValidator(_seconds), Field(ge=0.1, le=600)] = _doc(
        20.0,
        "Groq request timeout, seconds (0.1–600; under `FASTINFER_TIMEOUT_S`, or that 504 comes first)",
        alias="FASTINFER_GROQ_TIMEOUT_S",
    )


class Settings(BaseSettings):
    """``Settings()``: the environment over the defaults; :func:`get_settings` puts the tuned file between them.
    A field without a description is not a variable."""

    model_config = SettingsConfigDict(env_prefix="FASTINFER_", frozen=True, validate_by_name=True, extra="ignore")

    model: Annotated[str, AfterValidator(store.check_family)] = _doc(
        store.DEFAULT_FAMILY, "the model family served: `<model>-<backend>` in the store"
    )
    backends: tuple[str, ...] = _doc(
        BACKENDS,
        "comma-separated backends this server serves; one left out starts no runner and answers 503 saying so "
        "(`all` or unset: every backend)",
        "(every backend)",
    )
    default_backend: str = _doc(  # `auto` follows this machine (fastinfer/catalog/choice.py)
        "auto",
        "backend of requests that name none; `auto` (any case): the tuned file's, else the one recommended for this "
        "machine (measured, else by rule: see [Backends](backends.md#the-default-backend))",
    )
    max_bytes: Positive = _doc(20 * 1024 * 1024, "largest request body (413 above it)")
    max_pixels: Positive = _doc(50_000_000, "largest image, width × height (413, not decoded)")
    front_workers: Workers = _doc(1, f"front worker processes (1–{MAX_WORKERS})")
    runner_workers: Workers = _doc(1, f"worker processes per runner (1–{MAX_WORKERS})")
    threads: Threads = _doc(0, f"intra-op threads per runner process (0–{MAX_THREADS}; 0: cores ÷ runner workers)")
    decode_threads: Threads = _doc(
        0, f"threads per front worker that read, hash and decode images (0–{MAX_THREADS}; 0: one per core)"
    )
    request_timeout_s: Positive = _doc(
        30, "request timeout, upload included (504; 408 if the body was not in)", alias="FASTINFER_TIMEOUT_S"
    )
    max_concurrency: Positive = _doc(
        64,
        "requests in flight per front worker (their body in), and twice as many bodies arriving at once; more get 429",
    )
    body_idle_s: Positive = _doc(10, "a request body that stalls this long gets 408")
    # Per front worker, below the ASGI app (fastinfer/front/connections.py): before a request's headers are in.
    keepalive_s: Positive = _doc(
        5,
        "a connection with no request in progress closes after this long without a byte (before its first request "
        "too); behind a load balancer, set it above the balancer's idle timeout. It replaces "
        "`bentoml serve --timeout-keep-alive`",
    )
    header_timeout_s: Positive = _doc(
        10, "a request's line and headers must arrive within this of its first byte (408)"
    )
    max_header_bytes: Positive = _doc(32768, "largest request line + headers (431)")
    max_headers: Positive = _doc(100, "most header fields in a request (431)")
    max_connections: Positive = _doc(
        1000, "open connections per front worker ([beyond it](overload.md#connections-and-headers))"
    )
    min_free_disk_mb: Annotated[Count, Field(ge=0)] = _doc(
        16,
        "less free than this under `BENTOML_HOME` and `/readyz` answers 503 (`0`: only once metric files cannot "
        "be written)",
    )
    max_batch_images: Positive = _doc(
        32, "images in one `POST /classify/batch` (400 above it; the body still counts against `FASTINFER_MAX_BYTES`)"
    )
    batching: dict[str, BatchingConfig] = Field({}, validate_default=True)
    cache: Annotated[Literal["auto", "redis", "memory", "off"], BeforeValidator(str.lower)] = _doc(
        "auto", "`auto` | `redis` | `memory` | `off` (see [Cache](cache.md))"
    )
    redis_url: str = _doc(  # may carry a password
        "redis://127.0.0.1:6379/0",
        "the cache's Redis; its password apart (a secret): `FASTINFER_REDIS_PASSWORD`, put into the URL for you "
        "(percent-encoded; not also in the URL; never shown), or `_FILE`, a file holding it. An empty or unreadable "
        "file stops start-up",
        "`redis://127.0.0.1:6379/0`, no password",
        repr=False,
        validation_alias=AliasChoices("REDIS_URL", "FASTINFER_REDIS_PASSWORD", "FASTINFER_REDIS_PASSWORD_FILE"),
    )
    cache_ttl_s: Positive = _doc(86400, "seconds an entry lives", alias="FASTINFER_CACHE_TTL")
    cache_timeout_ms: Positive = _doc(50, "limit on each Redis call, ms")
    cache_max_entries: Positive = _doc(10000, "bound of the memory cache")
    cache_hmac_key: str = _doc(  # empty: unsigned (never printed)
        "",
        f"signs cache entries (≥ {CACHE_HMAC_KEY_MIN_LENGTH} characters; the same on every server sharing the "
        "Redis); an entry without a valid signature is never served; `_FILE`: a file holding it, instead",
        "(none: unsigned)",
        repr=False,
        validation_alias=AliasChoices("FASTINFER_CACHE_HMAC_KEY", "FASTINFER_CACHE_HMAC_KEY_FILE"),
    )
    groq: GroqConfig = Field(default_factory=GroqConfig)
    api_keys: tuple[str, ...] = _doc(  # empty: no key needed (never printed)
        (),
        f"comma-separated API keys (each ≥ {API_KEY_MIN_LENGTH} characters of letters, digits, `-._~+/`); when set, "
        "every API needs `Authorization: Bearer <key>` (see [Access](access.md)); `_FILE`: a file holding them "
        "(comma- or newline-separated), e.g. a Compose secret, instead. An empty or unreadable file stops start-up",
        "(none: open)",
        repr=False,
        validation_alias=AliasChoices("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE"),
    )
    api_keys_from: str = ""  # the variable the keys came from (FASTINFER_API_KEYS or its _FILE), for the log
    analyze_per_minute: Positive = _doc(  # each spends Groq quota
        10, "`/analyze` calls per client in any 60 s, per front worker (429 with `Retry-After` above it)"
    )
    analyze_total_per_minute: Positive = _doc(
        30,
        "`/analyze` calls from all clients in any 60 s, per replica, shared out among its front workers (30: the "
        "free-tier request rate Groq publishes for its small models; not checked from here, so match it to your plan)",
    )
    contact: Annotated[dict[str, str], BeforeValidator(_contact)] = _doc(  # {}: not set
        {},
        "who answers for this server, shown on the API page: an `http(s)://` URL, an e-mail address (`mailto:` "
        "too), a name, or `Name <URL or address>`; anything else stops start-up",
    )
    in_front: frozenset[str] = _doc(  # the runners whose engine the front worker holds
        frozenset(),
        "comma-separated backends whose engine runs inside the front worker instead of in a runner process (see "
        "[Architecture](architecture.md#where-engines-run)); needs `FASTINFER_FRONT_WORKERS=1`; `none`: every "
        "engine in its runner (those a bento was built without aside), whatever a tuned file says",
        "(unset: with one front worker, one worker per runner and no tuned file in force, the default backend's "
        "engine; else none)",
    )
    tuned: dict[str, Any] = {}  # the tuned file as found (fastinfer/catalog/tuned.py)
    sources: dict[str, str] = {}  # tunable variable → environment | tuned (if set)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, Variables(settings_cls, os.environ)

    @field_validator("backends", mode="before")
    @classmethod
    def _served(cls, value: Any) -> Any:
        return backends.switched_on(value) if isinstance(value, str) else value

    @field_validator("default_backend")
    @classmethod
    def _default_backend(cls, value: str, info: ValidationInfo) -> str:
        if value.lower() == "auto":
            return "auto"
        if value not in BACKENDS:
            raise ValueError(f"must be auto or one of {', '.join(BACKENDS)}")
        if value not in (served := info.data.get("backends", BACKENDS)):
            raise ValueError(f"={value} is not among FASTINFER_BACKENDS={','.join(served)}")
        return value

    @field_validator("batching", mode="before")
    @classmethod
    def _per_backend(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every backend's batching: the variables set, over the backend table's defaults."""
        table = {name: dict(zip(BatchingConfig.model_fields, SPECS[name].batching, strict=True)) for name in BACKENDS}
        if unknown := set(given) - set(table):
            raise ValueError(f"names no backend: {', '.join(sorted(unknown))}")
        return {name: given.get(name) if isinstance(given.get(name), BatchingConfig) else
                {**defaults, **(given.get(name) or {})} for name, defaults in table.items()}  # fmt: skip

    @field_validator("in_front", mode="before")
    @classmethod
    def _in_front(cls, value: Any, info: ValidationInfo) -> Any:
        """The runners named (``coreml`` brings in the runner serving it); ``none``: every engine in its runner,
        whatever a tuned file says (an empty value is unset, so it cannot)."""
        if not isinstance(value, str):
            return value
        if value.lower() == "none":
            return frozenset()
        names = backends.backend_names(value)
        workers = info.data.get("front_workers", 1)
        if names and workers != 1:
            raise ValueError(
                "needs FASTINFER_FRONT_WORKERS=1: each front worker would load its own engine "
                f"and batch alone (FASTINFER_FRONT_WORKERS={workers}); runners batch across workers"
            )
        if off := [name for name in names if name not in info.data.get("backends", BACKENDS)]:
            raise ValueError(f"names backends FASTINFER_BACKENDS leaves out: {', '.join(off)}")
        return frozenset(SPECS[name].runner_name for name in names)

    @model_validator(mode="after")
    def _engine_options(self) -> Settings:
        backends.openvino_precision()  # read where the engine opens (the backend table); a bad value stops start-up
        return self

    def batching_for(self, backend: str) -> BatchingConfig:
        return self.batching[backend]  # every backend has an entry (the batching validator fills them all)

    @property
    def max_uploads(self) -> int:
        """Bodies arriving at once per front worker: slow uploads hold these, not the requests' slots."""
        return 2 * self.max_concurrency


def variables(name: str, field: FieldInfo) -> list[str]:
    """The variables that set a field: its alias(es), else ``FASTINFER_`` + its name."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [alias] if isinstance(alias, str) else [f"{Settings.model_config.get('env_prefix')}{name.upper()}"]


# Fields read from two variables, a value and a file holding it (Compose secrets are files); checked where read.
_SECRETS = {"api_keys", "cache_hmac_key", "redis_url", "api_key"}


class Variables(PydanticBaseSettingsSource):
    """The fields' values from ``values`` (the environment, or a tuned file's settings), by variable name: stripped,
    an empty one unset, and so is ``auto`` as the default backend, so that a tuned file below may name it."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.raw = values
        self.values = {k: v.strip() for k, v in values.items() if isinstance(v, str) and v.strip()}
        if self.values.get("FASTINFER_DEFAULT_BACKEND", "").lower() == "auto":
            del self.values["FASTINFER_DEFAULT_BACKEND"]

    def _lookup(self, names: list[str]) -> str | None:
        return next((self.values[name] for name in names if name in self.values), None)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._lookup(variables(field_name, field)), field_name, False

    def _fields(self, model: type[BaseModel], backend: str = "") -> dict[str, Any]:
        """The values set for ``model``'s fields (``backend``: the one its per-backend variables name)."""
        found = {}
        for name, field in model.model_fields.items():
            if field.description is None or name in _SECRETS:  # not a variable; or read with its _FILE
                continue
            names = [variable.replace(BACKEND_KEY, backends.env_key(backend)) for variable in variables(name, field)]
            if (value := self._lookup(names)) is not None:
                found[name] = value
        return found

    def __call__(self) -> dict[str, Any]:
        self.errors: list[str] = []  # the secrets' and REDIS_URL's, said with the fields' (_read)
        found = self._fields(self.settings_cls)
        if batching := {name: given for name in BACKENDS if (given := self._fields(BatchingConfig, name))}:
            found["batching"] = batching
        groq = self._fields(GroqConfig)
        if (keys := self._checked(lambda: _api_keys(*_secret(self.raw, "FASTINFER_API_KEYS")))) is not None:
            found["api_keys"], found["api_keys_from"] = keys
        if key := self._checked(lambda: _cache_hmac_key(*_secret(self.raw, "FASTINFER_CACHE_HMAC_KEY"))):
            found["cache_hmac_key"] = key
        if groq_key := self._checked(lambda: _groq_key(*_secret(self.raw, "GROQ_API_KEY"))):
            groq["api_key"] = groq_key
        if "FASTINFER_GROQ_BASE_URL" in self.values and "GROQ_BASE_URL" not in self.values:
            # Ignored, /analyze would send the key and the prompts to Groq's public API instead of that gateway.
            self.errors.append("FASTINFER_GROQ_BASE_URL was removed: set GROQ_BASE_URL (the groq SDK's own) instead")
        if groq:
            found["groq"] = groq
        url = self.values.get("REDIS_URL") or str(Settings.model_fields["redis_url"].default)
        with_password = self._checked(lambda: _redis_url(self.raw, url))
        if with_password not in (None, Settings.model_fields["redis_url"].default):
            found["redis_url"] = with_password
        return found

    def _checked(self, read: Callable[[], Any]) -> Any:
        """``read()``, or None with its ValueError kept for the one report of every bad variable."""
        try:
            return read()
        except ValueError as exc:
            self.errors.append(str(exc))
            return None


def _secret(environ: Mapping[str, str], name: str) -> tuple[str, str]:
    """(value, its variable): ``name``'s, or the content of the file ``name``_FILE names; ("", "") when neither
    is set. An unreadable or empty file stops start-up."""
    file_name = f"{name}_FILE"
    path = environ.get(file_name, "").strip()  # empty = unset (compose leaves it empty on purpose)
    if not path:
        return environ.get(name, "").strip(), name if name in environ else ""
    if environ.get(name, "").strip():
        raise ValueError(f"set {name} or {file_name}, not both")
    try:
        value = read_small(path, SECRET_FILE_MAX_BYTES)
    except OSError as exc:
        raise ValueError(f"{file_name}: cannot read {path!r} ({type(exc).__name__})") from None
    except ValueError as exc:  # too large, or not a regular file
        why = f"{exc}: not a secret file" if isinstance(exc, TooLarge) else exc
        raise ValueError(f"{file_name}: {path!r} is {why}") from None
    try:
        text = value.decode("utf-8-sig").strip()  # a BOM (Windows editors) is not part of the secret
    except UnicodeDecodeError:
        raise ValueError(f"{file_name}: {path!r} is not UTF-8 text") from None
    if not text:
        raise ValueError(f"{file_name}: {path!r} is empty; unset {file_name} to run without it")
    return text, file_name


def _api_keys(raw: str, source: str) -> tuple[tuple[str, ...], str] | None:
    """(keys, their variable), None when unset: comma- or newline-separated keys, each a Bearer token (token68)."""
    if not source:
        return None
    keys = tuple(dict.fromkeys(k.strip() for k in raw.replace("\n", ",").split(",") if k.strip()))
    if not keys:  # e.g. an empty value from a Secret: running open by mistake is worse than not starting
        raise ValueError(f"{source} is set but holds no key; unset it to run without API keys")
    for number, key in enumerate(keys, 1):  # the key itself is never echoed
        if not API_KEY_SYNTAX.fullmatch(key):
            raise ValueError(
                f"{source}: key {number} of {len(keys)} has characters a Bearer token cannot carry "
                "(allowed: letters, digits and -._~+/ with = only at the end)"
            )
        if len(key) < API_KEY_MIN_LENGTH:
            raise ValueError(f"{source}: key {number} of {len(keys)} is {_SHORT.format(API_KEY_MIN_LENGTH)}")
    return keys, source


_SHORT = 'shorter than {} characters; make one with: python3 -c "import secrets; print(secrets.token_urlsafe(32))"'


def _groq_key(raw: str, source: str) -> str:
    """One line of printable ASCII: anything else would break the HTTP header of every call to Groq."""
    if not (raw.isascii() and raw.isprintable()) or any(c.isspace() for c in raw):
        raise ValueError(f"{source}: a Groq key is one line of printable ASCII without spaces")
    return raw


def _redis_url(environ: Mapping[str, str], url: str) -> str:
    """REDIS_URL with FASTINFER_REDIS_PASSWORD (or its _FILE) put in, percent-encoded; never echoed."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- a port that is no number raises here, not in the cache at start-up
    except ValueError:
        raise ValueError("REDIS_URL is not a URL such as redis://host:6379/0") from None
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.netloc or parts.path):
        raise ValueError("REDIS_URL must be a redis://, rediss:// or unix:// URL, such as redis://host:6379/0")
    password, source = _secret(environ, "FASTINFER_REDIS_PASSWORD")
    if not password:
        return url
    if parts.password is not None or "password=" in parts.query:
        raise ValueError(f"REDIS_URL holds a password and {source} is set: give it in one place")
    user = parts.netloc.rpartition("@")[0]  # a username stays (already encoded)
    netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def _cache_hmac_key(raw: str, source: str) -> str:
    if source and not raw:  # set means meant: an empty Secret value must not leave the cache unsigned
        raise ValueError(f"{source} is set but holds no key; unset it to run with unsigned cache entries")
    if raw and len(raw) < CACHE_HMAC_KEY_MIN_LENGTH:  # the key itself is never echoed
        raise ValueError(f"{source} is {_SHORT.format(CACHE_HMAC_KEY_MIN_LENGTH)}")
    return raw


def _field(loc: tuple[int | str, ...]) -> tuple[str, FieldInfo | None, str]:
    """(field name, field, backend) of an error's location, e.g. ("batching", "onnx-int8", "max_batch_size")."""
    if loc and loc[0] == "batching" and len(loc) == 3:
        return str(loc[2]), BatchingConfig.model_fields.get(str(loc[2])), str(loc[1])
    if loc and loc[0] == "groq" and len(loc) == 2:
        return str(loc[1]), GroqConfig.model_fields.get(str(loc[1])), ""
    return (str(loc[0]), Settings.model_fields.get(str(loc[0])), "") if loc else ("", None, "")


def _bounds(field: FieldInfo) -> str:
    low = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in field.metadata if hasattr(m, "le")), None)
    if high is not None:
        return f"must be from {low} to {high}"
    return "must be at least 1" if low else "must be 0 or more"


def _said(exc: ValidationError) -> str:
    """One line per bad value, naming its variable: ``FASTINFER_THREADS must be from 0 to 1024, got 5000``."""
    lines = []
    for error in exc.errors(include_url=False):
        name, field, backend = _field(error["loc"])
        variable = variables(name, field)[0].replace(BACKEND_KEY, backends.env_key(backend)) if field else ""
        if error["type"] == "value_error":
            said = str(error["ctx"]["error"])
        elif error["type"] in ("greater_than_equal", "less_than_equal") and field is not None:
            said = f"{_bounds(field)}, got {error['input']}"
        elif error["type"] == "bool_parsing":  # pydantic's words: 1/0, true/false, yes/no, on/off (any case)
            said = f"must be true or false, got {str(error['input'])[:40]!r}"
        elif error["type"] == "literal_error":
            said = f"must be {error['ctx']['expected']}, got {str(error['input'])[:40]!r}"
        else:
            said = f"{error['msg'][:1].lower()}{error['msg'][1:]}"
        if not said.startswith(variable):  # a validator's own words may name it already
            said = f"{variable}{'' if said[:1] == '=' else ' '}{said}".strip()
        lines.append(said)
    return "\n".join(dict.fromkeys(lines))


def _model() -> None:
    """Unset, FASTINFER_MODEL becomes a bento's own (BENTO_MODEL_ARGUMENT), here and in every process this one
    starts; a name the store cannot hold stops start-up before the tuned file is read."""
    if not os.environ.get(store.FAMILY_ENV, "").strip() and (built_for := _bento_argument(BENTO_MODEL_ARGUMENT)):
        os.environ[store.FAMILY_ENV] = built_for
    try:
        store.family()
    except store.BadFamilyName as exc:
        raise ValueError(f"{store.FAMILY_ENV}: {exc}") from None


def _bento_argument(name: str) -> str:
    """A bento argument (``--arg NAME=VALUE``, or a served bento's own); "" when not given or without BentoML."""
    if "bentoml" not in sys.modules:
        return ""
    import bentoml

    return str(getattr(bentoml.use_arguments(), name, "") or "").strip()


def _read(tuned_values: Mapping[str, str], tuned: dict[str, Any]) -> Settings:
    """The environment over ``tuned_values`` over the defaults, or ValueError naming each bad variable; with
    ``tuned`` (the tuned file as found) and each tunable value's source."""
    from fastinfer.catalog.tuned import TUNABLE

    layers = (Variables(Settings, os.environ), Variables(Settings, tuned_values))
    try:
        settings = Settings(_build_sources=(layers, {}))
    except ValidationError as exc:
        raise ValueError("\n".join([*layers[0].errors, *layers[1].errors, _said(exc)])) from None
    if errors := [*layers[0].errors, *layers[1].errors]:
        raise ValueError("\n".join(errors))
    environment = layers[0].values
    sources = {name: "environment" if name in environment else "tuned" for name in tuned_values}
    sources |= {name: "environment" for name in environment if TUNABLE.fullmatch(name)}
    return settings.model_copy(update={"tuned": tuned, "sources": sources})


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings: the environment, then the tuned file where it is in force here (the environment
    wins). Tuned values that do not parse or clash with the environment leave the tuned file out, never fail."""
    from fastinfer.catalog import tuned as tuning

    _model()  # first: the tuned file is for one family's models
    found = tuning.here()
    untuned = _read({}, found.as_dict() if not found.in_force else {})  # the environment's own errors stop start-up
    if not found.in_force:
        return untuned
    try:
        return _read(found.settings, found.as_dict())
    except ValueError as exc:
        why = f"its values do not hold with this environment: {'; '.join(str(exc).splitlines())}"
        tuning.warn_ignored(found.path, why)
        return untuned.model_copy(
            update={"tuned": {**found.as_dict(), "status": "ignored", "why": why, "settings": {}}}
        )
