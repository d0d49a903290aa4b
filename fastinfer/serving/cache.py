"""Response cache: Redis (shared by every worker and server, fail-open) or a bounded in-process LRU; docs/cache.md.

Keys: ``fastinfer:v<format>:<model tag>:<backend>:<top_k>:<engine digest>:<sha256 of the image>``. Values:
``{"v": <format>, "mac": <HMAC or null>, "body": <response body>}`` as JSON, in Redis and in memory alike.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fastinfer.catalog.family import MAX_LABEL
from fastinfer.common.errors import one_line
from fastinfer.common.schemas import TOP_K_MAX

logger = logging.getLogger("fastinfer.cache")

CACHE_FORMAT = "4"  # bumped when the value's shape changes, so old entries are never served
NAMESPACE = "fastinfer"
INDEX_KEY = f"{NAMESPACE}:v{CACHE_FORMAT}:index"


def cache_key(image: bytes, backend: str, model_tag: str, top_k: int, engine: str) -> str:
    return digest_key(hashlib.sha256(image).hexdigest(), backend, model_tag, top_k, engine)


def digest_key(sha256_hex: str, backend: str, model_tag: str, top_k: int, engine: str) -> str:
    """The key of an image whose sha256 is already known (hashed off the event loop, for instance)."""
    return f"{NAMESPACE}:v{CACHE_FORMAT}:{model_tag}:{backend}:{top_k}:{engine_digest(engine)}:{sha256_hex}"


@functools.lru_cache(maxsize=64)
def engine_digest(engine: str) -> str:
    """An engine's identity, short and of key-safe characters (the answer itself carries it in full)."""
    return hashlib.sha256(engine.encode()).hexdigest()[:16]


def redact_url(url: str) -> str:
    """``url`` without ``user:password@`` or query (redis-py reads ``?password=`` there), for logs and stats."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a REDIS_URL that does not parse)"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


class InvalidEntry(ValueError):
    """A cached value this version must not serve; the message says why."""


class WriteRefused(Exception):
    """The store answered but would not store (full, read-only): its reads still work."""


def entry_mac(hmac_key: bytes, key: str, body_text: str | bytes) -> str:
    """HMAC-SHA256 over the Redis key (an entry copied under another key fails) and the body's exact text."""
    text = body_text.encode() if isinstance(body_text, str) else body_text
    return hmac.new(hmac_key, key.encode() + b"\n" + text, hashlib.sha256).hexdigest()


def encode_entry(body: dict[str, Any], key: str = "", hmac_key: bytes = b"") -> str:
    """The stored value of ``body`` under ``key``, signed with ``hmac_key`` if any; the body last, as a slice."""
    text = _body_text(body)
    mac = f'"{entry_mac(hmac_key, key, text)}"' if hmac_key else "null"
    return f'{{"v":"{CACHE_FORMAT}","mac":{mac},"body":{text}}}'


def _body_text(body: dict[str, Any]) -> str:
    # In the body's own order (a hit answers in it). Non-ASCII as UTF-8, so a CJK label costs 3 bytes, not a
    # 6-byte \uXXXX escape; a lone surrogate (a label from a non-UTF-8 file name) cannot be UTF-8: escaped.
    text = json.dumps(body, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(body)
    return text


SIGNED_HEAD = f'{{"v":"{CACHE_FORMAT}","mac":"'.encode()
MAC_HEX = 64  # SHA-256, in hex
BODY_HEAD = b'","body":'


def _signed_body(raw: str | bytes, key: str, hmac_key: bytes) -> bytes:
    """The body text of an entry signed with ``hmac_key`` under ``key``; else InvalidEntry."""
    data = raw.encode() if isinstance(raw, str) else raw
    mac_end = len(SIGNED_HEAD) + MAC_HEX
    if not (data.startswith(SIGNED_HEAD) and data[mac_end:].startswith(BODY_HEAD) and data.endswith(b"}")):
        raise InvalidEntry("not a signed entry of this format (FASTINFER_CACHE_HMAC_KEY is set)")
    text = data[mac_end + len(BODY_HEAD) : -1]
    if not hmac.compare_digest(data[len(SIGNED_HEAD) : mac_end], entry_mac(hmac_key, key, text).encode()):
        raise InvalidEntry("its MAC is not valid: not written by a server holding FASTINFER_CACHE_HMAC_KEY")
    return text


@dataclass(frozen=True)
class Expected:
    """What an entry under a key must say, weights kind and class names included (no entry may relabel them)."""

    backend: str
    model_tag: str
    top_k: int
    weights: str
    engine: str
    categories: Sequence[str] = ()


# The largest entry a build's family can make (docs/cache.md): top_k's class names and "class", MAX_LABEL characters
# of at most 4 UTF-8 bytes (the build refuses the control characters JSON escapes longer), plus the rest (~2 KB).
LABEL_BYTES = 4
MAX_ENTRY_BYTES = (TOP_K_MAX + 1) * MAX_LABEL * LABEL_BYTES + 8 * 1024


_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)  # JSON's true is no index, NaN no score


class _Prediction(BaseModel):
    model_config = _STRICT
    label: str
    index: int = Field(ge=0)
    score: float = Field(ge=0.0, le=1.0)


class _Body(BaseModel):
    """A response body as stored: its keys exactly, each of its type."""

    model_config = _STRICT
    class_: str = Field(alias="class")
    class_index: int
    confidence: float = Field(ge=0.0, le=1.0)
    top_k: list[_Prediction]
    backend: str
    model: str
    weights: str
    engine: str
    cached: bool


class _Entry(BaseModel):
    model_config = _STRICT
    v: Literal[CACHE_FORMAT]  # type: ignore[valid-type]
    mac: str | None
    body: _Body


class _Versioned(BaseModel):
    v: str


def _stated_version(raw: str | bytes) -> str | None:
    """The format an entry that is not ours says it is, if it says: read only once it failed, never on a hit."""
    try:
        return _Versioned.model_validate_json(raw).v
    except ValidationError:
        return None


BODY_KEYS = frozenset(field.alias or name for name, field in _Body.model_fields.items())
# The names an entry's error may place a fault at; any other is a key of the entry's own, never said.
_FIELDS = frozenset(f.alias or n for m in (_Entry, _Body, _Prediction) for n, f in m.model_fields.items())


def decode_entry(raw: str | bytes, expected: Expected, key: str = "", hmac_key: bytes = b"") -> dict[str, Any]:
    """The body stored in ``raw`` under ``key``, checked against ``expected`` (and its MAC); else ValueError."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise InvalidEntry(f"more than {MAX_ENTRY_BYTES:,} bytes, larger than any entry of ours")
    try:
        if hmac_key:  # the MAC first: nothing of an entry is believed, or parsed, before it is checked
            body = _Body.model_validate_json(_signed_body(raw, key, hmac_key))
        else:
            body = _Entry.model_validate_json(raw).body
    except ValidationError as exc:  # not JSON, not UTF-8, a key missing or extra, a value of another type
        if not hmac_key and (version := _stated_version(raw)) not in (None, CACHE_FORMAT):
            said = repr(version) if version.isdigit() and len(version) <= 4 else "of no version of ours"
            raise InvalidEntry(f"format {said}, this version reads {CACHE_FORMAT!r}") from None
        first = exc.errors(include_url=False, include_input=False)[0]  # where and what, not the stored text
        parts = ["body"] if hmac_key else []  # a signed entry's body is what was parsed
        parts += [p if isinstance(p, int) or p in _FIELDS else "?" for p in first["loc"]]
        where = ".".join(map(str, parts)) or "the entry"
        raise InvalidEntry(f"not an entry of ours: {where}: {first['msg']}") from None
    said = (body.backend, body.model, body.weights, body.engine)
    if said != (expected.backend, expected.model_tag, expected.weights, expected.engine):
        raise InvalidEntry(
            f"answers {'/'.join(map(repr, said))}, the key "
            f"{expected.backend!r}/{expected.model_tag!r}/{expected.weights!r}/{expected.engine!r}"
        )
    ranked = body.top_k
    if len(ranked) != expected.top_k:
        raise InvalidEntry(f"top_k is not a list of {expected.top_k} predictions")
    indices = [p.index for p in ranked]
    if len(set(indices)) != len(indices):
        raise InvalidEntry("a class appears twice in top_k")
    names = expected.categories
    if names and any(p.index >= len(names) or p.label != names[p.index] for p in ranked):
        raise InvalidEntry("a label is not its class index's name")
    scores = [p.score for p in ranked]
    if any(a < b for a, b in itertools.pairwise(scores)) or sum(scores) > 1.0 + 1e-3:  # float rounding
        raise InvalidEntry("top_k scores are not a ranked softmax")
    if (body.class_, body.class_index, body.confidence) != (ranked[0].label, ranked[0].index, ranked[0].score):
        raise InvalidEntry("class, class_index, confidence disagree with top_k[0]")
    return body.model_dump(by_alias=True)  # in the order answers have: a hit answers in it


@dataclass
class CacheStats:
    mode: str  # the fields in the order /cache/stats shows them (as_dict), after "healthy"
    degraded: str | None = None  # why the cache is not working right now
    hits: int = 0
    misses: int = 0
    errors: int = 0  # lookups that failed, or skipped the cache while its breaker was open
    invalid: int = 0  # bad entries read (also counted in misses)
    bypasses: int = 0
    writes_refused: int = 0  # answers not stored: refused by a store that still reads, or backing off after it
    write_errors: int = 0  # answers not stored: the SET failed, or skipped while the breaker was open
    too_large: int = 0  # answers not stored: larger than a read accepts (MAX_ENTRY_BYTES)
    signed: bool = False  # entries carry an HMAC (FASTINFER_CACHE_HMAC_KEY)
    since: float = field(default_factory=time.time)

    def as_dict(self, keys: int | None) -> dict[str, Any]:
        lookups = self.hits + self.misses + self.errors  # an error is a lookup the cache did not answer
        shown = {"mode": self.mode, "healthy": self.degraded is None, **asdict(self)}
        shown["hit_rate"] = round(self.hits / lookups, 4) if lookups else 0.0
        shown["keys"] = keys
        shown["since"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(shown.pop("since")))
        return shown


class ResponseCache:
    """Fail-open lookups and stores around a store's ``_get``/``_set``, with the breaker and write back-off
    described above. The base class itself is the ``off`` cache: every lookup misses."""

    mode = "off"
    timeout_s: float | None = None  # the limit on each call to the store, for the messages

    def __init__(self, retry_after_s: float = 1.0, hmac_key: str | bytes = b"") -> None:
        self.stats = CacheStats(self.mode)
        self.retry_after_s = retry_after_s
        self.hmac_key = hmac_key.encode() if isinstance(hmac_key, str) else hmac_key
        self.stats.signed = bool(self.hmac_key)
        self._open_until = 0.0  # the breaker: no reads or writes before this
        self._writes_until = 0.0  # the write back-off: no writes before this
        self._outage: str | None = None  # why the store does not answer
        self._refusal: str | None = None  # why it answers but will not store
        self._last_log: dict[str, float] = {}  # kind of warning → when it was last logged
        self._told_too_large = False

    async def lookup(self, key: str, expected: Expected) -> tuple[dict[str, Any] | None, str]:
        """The cached body (or None) and the event: ``hit``, ``miss``, ``invalid`` or ``error``."""
        if time.monotonic() < self._open_until:
            self.stats.errors += 1
            return None, "error"
        try:
            raw = await self._get(key)
        except InvalidEntry as exc:  # readable, but not a value of ours (e.g. a list under the key)
            self._answered()
            self._invalid(key, exc)
            return None, "invalid"
        except Exception as exc:
            self._failed("GET", exc)
            return None, "error"
        self._answered()
        if raw is None:
            self.stats.misses += 1
            return None, "miss"
        try:
            body = decode_entry(raw, expected, key, self.hmac_key)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
            self._invalid(key, exc)
            return None, "invalid"
        self.stats.hits += 1
        return body, "hit"

    async def store(self, key: str, value: dict[str, Any]) -> None:
        now = time.monotonic()
        if now < self._open_until:
            self.stats.write_errors += 1
            return
        if now < self._writes_until:  # refused a moment ago: asking again costs a round trip for nothing
            self.stats.writes_refused += 1
            return
        raw = encode_entry(value, key, self.hmac_key).encode()  # bytes: the limit is on what a read gets
        if len(raw) > MAX_ENTRY_BYTES:  # a read would refuse it: writing it costs a SET for nothing
            self._too_large(key, len(raw))
            return
        try:
            await self._set(key, raw)
        except WriteRefused as exc:
            self._refused(exc)
            return
        except Exception as exc:
            self._failed("SET", exc)
            return
        self._answered()
        if self._refusal is not None:
            logger.warning("cache recovered: %s stores again", self.mode)
            self._refusal = None
            self._update_degraded()

    def bypassed(self) -> None:
        self.stats.bypasses += 1

    async def describe(self) -> dict[str, Any]:
        keys = None
        if time.monotonic() >= self._open_until:
            try:
                keys = await self._key_count()
            except Exception:  # counting keys is best effort (a SCAN can be slow under load): not an outage
                keys = None
        return self.stats.as_dict(keys)

    def _failed(self, op: str, exc: BaseException) -> None:
        if op == "GET":
            self.stats.errors += 1
        else:
            self.stats.write_errors += 1
        reason = one_line(exc)
        if isinstance(exc, TimeoutError) and self.timeout_s:  # asyncio.wait_for's has no message
            reason = f"timed out after {self.timeout_s * 1000:g} ms"
        self._outage = f"{self.mode} {op} failed: {reason}"[:300]
        self._update_degraded()
        self._open_until = time.monotonic() + self.retry_after_s
        self._warn(
            "outage", "cache degraded, serving without it (retry every %gs): %s", self.retry_after_s, self._outage
        )

    def _refused(self, exc: WriteRefused) -> None:
        self.stats.writes_refused += 1
        retry = f"reads still served, a write tried again every {self.retry_after_s:g} s"
        self._refusal = f"writes refused: {' '.join(str(exc).split())[:240]} ({retry})"
        self._update_degraded()
        self._writes_until = time.monotonic() + self.retry_after_s
        self._warn("refusal", "cache degraded, new answers not stored: %s", self._refusal)

    def _too_large(self, key: str, size: int) -> None:
        self.stats.too_large += 1
        if not self._told_too_large:  # the same model's answers, again and again: once is enough
            self._told_too_large = True
            logger.warning(
                "cache: an answer of %s bytes is not stored, over the %s bytes a read accepts (%s); answers this "
                "large are computed every time, counted in too_large",
                f"{size:,}",
                f"{MAX_ENTRY_BYTES:,}",
                key,
            )

    def _invalid(self, key: str, exc: BaseException) -> None:
        # The store answered: a bad entry is the entry's fault, not an outage (no breaker).
        self.stats.misses += 1
        self.stats.invalid += 1
        # One line, bounded: what an entry says (its backend, say) is anyone's text who can write to Redis.
        self._warn("invalid", "cache entry %s ignored (%s): %s", key, type(exc).__name__, one_line(exc, named=False))

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        """Log at most one line of each kind per 30 s, however many requests fail."""
        now = time.monotonic()
        if now - self._last_log.get(kind, 0.0) > 30:
            self._last_log[kind] = now
            logger.warning(message, *args)

    def _answered(self) -> None:
        """The store answered: no outage (a refusal of writes is cleared only by a stored write)."""
        if self._outage is not None:
            logger.warning("cache recovered: %s answers again", self.mode)
            self._outage = None
            self._update_degraded()

    def _update_degraded(self) -> None:
        self.stats.degraded = "; ".join(r for r in (self._outage, self._refusal) if r) or None

    async def _get(self, key: str) -> str | bytes | None:
        return None

    async def _set(self, key: str, raw: str | bytes) -> None:
        return None

    async def _key_count(self) -> int | None:
        return 0

    async def close(self) -> None:
        return None


class MemoryCache(ResponseCache):
    """A bounded LRU in this process. It keeps the encoded entry, as Redis does: the same validation, and a
    hit hands out a fresh dict."""

    mode = "memory"

    def __init__(self, max_entries: int, ttl_s: float, hmac_key: str | bytes = b"") -> None:
        super().__init__(hmac_key=hmac_key)
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._data: OrderedDict[str, tuple[float, str | bytes]] = OrderedDict()

    async def _get(self, key: str) -> str | bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, raw = item
        if expires < time.monotonic():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return raw

    async def _set(self, key: str, raw: str | bytes) -> None:
        self._data[key] = (time.monotonic() + self.ttl_s, raw)
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def _key_count(self) -> int:
        return len(self._data)


REFUSALS = ("OOM", "READONLY", "MISCONF", "NOREPLICAS")  # Redis up and reading, but not storing


def _refusal(exc: BaseException) -> WriteRefused | None:
    """``exc`` as a WriteRefused when it is one of REFUSALS, else None (an outage)."""
    from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

    if isinstance(exc, OutOfMemoryError):  # redis-py strips the code from these two
        return WriteRefused(f"OOM {exc}")
    if isinstance(exc, ReadOnlyError):
        return WriteRefused(f"READONLY {exc}")
    if isinstance(exc, ResponseError) and str(exc).split(" ", 1)[0] in REFUSALS:
        return WriteRefused(str(exc))
    return None


class RedisCache(ResponseCache):
    """Redis shared by every worker and server; each call bounded by ``timeout_s``."""

    mode = "redis"

    def __init__(self, url: str, ttl_s: float, timeout_s: float, hmac_key: str | bytes = b"") -> None:
        super().__init__(hmac_key=hmac_key)
        import redis.asyncio as redis

        self.url = url
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        # The client reconnects by itself on the next command once Redis is back.
        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def ping(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self.client.ping(), self.timeout_s * 4))
        except Exception:
            return False

    async def _get(self, key: str) -> bytes | None:
        from redis.exceptions import ResponseError

        try:
            # GETRANGE: bounded, and as cheap as GET (docs/cache.md).
            raw = await asyncio.wait_for(self.client.getrange(key, 0, MAX_ENTRY_BYTES), self.timeout_s)
        except ResponseError as exc:
            if "WRONGTYPE" in str(exc):  # another type under our key: a bad entry, not an outage
                raise InvalidEntry(f"not a string value: {exc}") from exc
            raise
        if not raw:  # GETRANGE answers "" for a missing key (and for an empty value: no entry of ours either)
            return None
        if len(raw) > MAX_ENTRY_BYTES:
            raise InvalidEntry(f"more than {MAX_ENTRY_BYTES:,} bytes, larger than any entry of ours (not read whole)")
        return raw

    async def _set(self, key: str, raw: str | bytes) -> None:
        ttl_ms = max(1, int(self.ttl_s * 1000))
        now = time.time()
        async with self.client.pipeline(transaction=False) as pipe:  # one round trip
            pipe.set(key, raw, px=ttl_ms)
            pipe.zadd(INDEX_KEY, {key: now + self.ttl_s})
            pipe.zremrangebyscore(INDEX_KEY, "-inf", now)  # keeps the index bounded: each member dropped once
            pipe.pexpire(INDEX_KEY, ttl_ms)  # and gone when writes stop
            results = await asyncio.wait_for(pipe.execute(raise_on_error=False), self.timeout_s)
        if isinstance(results[0], Exception):
            raise _refusal(results[0]) or results[0]
        # An index command failing (say, a foreign value under INDEX_KEY) only skews the count.

    async def _key_count(self) -> int:
        now = time.time()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(INDEX_KEY, "-inf", now)  # a write: a replica refuses it (READONLY)
            pipe.zcount(INDEX_KEY, f"({now}", "+inf")  # a read, so the count survives that
            _, count = await asyncio.wait_for(pipe.execute(raise_on_error=False), self.timeout_s)
        if isinstance(count, Exception):
            raise count
        return int(count)

    async def close(self) -> None:
        await self.client.aclose()


async def open_cache(
    mode: str, redis_url: str, ttl_s: float, timeout_s: float, max_entries: int, *, hmac_key: str | bytes = b""
) -> ResponseCache:
    """``redis`` | ``memory`` | ``off`` | ``auto`` (Redis when it answers now, else memory)."""
    if mode == "off":
        cache: ResponseCache = ResponseCache()
    elif mode == "memory":
        cache = MemoryCache(max_entries, ttl_s, hmac_key)
    elif mode in ("redis", "auto"):
        redis_cache = RedisCache(redis_url, ttl_s, timeout_s, hmac_key)
        if await redis_cache.ping() or mode == "redis":
            cache = redis_cache  # in "redis" mode an absent Redis is "degraded", not a fallback
        else:
            await redis_cache.close()
            cache = MemoryCache(max_entries, ttl_s, hmac_key)
            cache.stats.mode = "memory (auto: redis unreachable at start-up)"
    else:
        raise ValueError(f"FASTINFER_CACHE must be redis, memory, off or auto, not {mode!r}")
    if cache.mode == "redis":
        cache.stats.mode = f"redis ({redact_url(redis_url)})"  # never the password
    signed = ", entries signed (HMAC-SHA256)" if cache.stats.signed else ""
    logger.warning("response cache: %s%s", cache.stats.mode, signed)
    return cache
