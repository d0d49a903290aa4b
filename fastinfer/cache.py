"""Response cache: Redis (shared by every worker and server) or a bounded in-process LRU.

Keys: ``fastinfer:v<format>:<model tag>:<backend>:<top_k>:<sha256 of the image bytes>``; values
are ``{"v": <format>, "body": <response body>}`` as JSON, in Redis and in memory alike. Redis is
fail-open: every call has a short timeout, an error is counted, logged at most once per interval,
and turns the cache off for a moment (a circuit breaker) instead of failing or slowing the
request; the client reconnects by itself when Redis returns.

Every read is validated (format version, keys and types, top_k length, backend and model equal to
the key's): a shared Redis may hold another version's entries during a rolling deploy, or one
written by hand. A bad entry is an ``invalid`` lookup, counted as a miss too: the request runs
inference and its SET overwrites the entry. It is never an error, so it never opens the breaker.

Key count (``/cache/stats``, polled by every dashboard tab) without SCAN: each SET also adds the
key to a sorted set ``fastinfer:v<format>:index`` scored by its expiry time, in the same pipeline
(one round trip). Counting drops the expired members (each is dropped once: amortised O(log n))
and answers ZCARD (O(1)). Not DBSIZE: that is only right on a database of our own, which a shared
Redis may not give us. The index stays bounded without anyone counting: every SET drops its
expired members and refreshes its TTL, so it vanishes when writes stop. Caveats: the count is of
entries this service wrote and that have not expired; one evicted by ``maxmemory`` or deleted by
hand stays counted until its TTL, and expiry uses the writer's clock (skew of a few seconds
between servers shifts the count by the entries expiring within it).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("fastinfer.cache")

CACHE_FORMAT = "2"
"""Bumped when the cached value's shape changes, so old entries are never served (2: ``{v, body}``)."""
NAMESPACE = "fastinfer"
INDEX_KEY = f"{NAMESPACE}:v{CACHE_FORMAT}:index"
BODY_KEYS = frozenset({"class", "class_index", "confidence", "top_k", "backend", "model", "weights", "cached"})
PREDICTION_KEYS = frozenset({"label", "index", "score"})


def cache_key(image: bytes, backend: str, model_tag: str, top_k: int) -> str:
    return digest_key(hashlib.sha256(image).hexdigest(), backend, model_tag, top_k)


def digest_key(sha256_hex: str, backend: str, model_tag: str, top_k: int) -> str:
    """The key of an image whose sha256 is already known (hashed off the event loop, for instance)."""
    return f"{NAMESPACE}:v{CACHE_FORMAT}:{model_tag}:{backend}:{top_k}:{sha256_hex}"


class InvalidEntry(ValueError):
    """A cached value this version must not serve; the message says why."""


def encode_entry(body: dict[str, Any]) -> str:
    return json.dumps({"v": CACHE_FORMAT, "body": body})


@dataclass(frozen=True)
class Expected:
    """What an entry under a key must say: the key's backend, model and top_k, and that model's
    weights kind and class names (so that no entry can relabel a random-init model, or a class)."""

    backend: str
    model_tag: str
    top_k: int
    weights: str
    categories: Sequence[str] = ()


MAX_ENTRY_BYTES = 16 * 1024
"""An entry of ours is ~2 KB at top_k 20. Anything much larger is not ours, and parsing it would hold
the event loop (a 10 MB value held concurrent cache hits for 350 ms)."""


def decode_entry(raw: str | bytes, expected: Expected) -> dict[str, Any]:
    """The response body stored in ``raw``, checked against what the key promises; else ValueError."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise InvalidEntry(f"{len(raw):,} bytes, larger than any entry of ours ({MAX_ENTRY_BYTES:,})")
    entry = json.loads(raw)  # ValueError (JSONDecodeError, UnicodeDecodeError) when not JSON
    if not isinstance(entry, dict) or entry.keys() != {"v", "body"}:
        raise InvalidEntry("not a {v, body} object")
    if entry["v"] != CACHE_FORMAT:
        raise InvalidEntry(f"format {entry['v']!r}, this version reads {CACHE_FORMAT!r}")
    body = entry["body"]
    if not isinstance(body, dict) or body.keys() != BODY_KEYS:
        raise InvalidEntry("the body's keys are not a response's")
    if (body["backend"], body["model"], body["weights"]) != (expected.backend, expected.model_tag, expected.weights):
        raise InvalidEntry(
            f"answers {body['backend']!r}/{body['model']!r}/{body['weights']!r}, the key "
            f"{expected.backend!r}/{expected.model_tag!r}/{expected.weights!r}"
        )
    ranked = body["top_k"]
    k = expected.top_k
    if not isinstance(ranked, list) or not ranked or len(ranked) != k or not all(map(_is_prediction, ranked)):
        raise InvalidEntry(f"top_k is not a list of {k} predictions")
    _check_ranking(ranked, expected.categories)
    best = ranked[0]
    if not (
        isinstance(body["class"], str)
        and _is_int(body["class_index"])
        and _is_probability(body["confidence"])
        and isinstance(body["cached"], bool)
    ):
        raise InvalidEntry("a field has the wrong type")
    if (body["class"], body["class_index"], body["confidence"]) != (best["label"], best["index"], best["score"]):
        raise InvalidEntry("class, class_index, confidence disagree with top_k[0]")
    return body


def _check_ranking(ranked: list[dict[str, Any]], categories: Sequence[str]) -> None:
    """A softmax top-k: distinct classes, each with its own name, scores falling, summing to <= 1."""
    indices = [p["index"] for p in ranked]
    if len(set(indices)) != len(indices):
        raise InvalidEntry("a class appears twice in top_k")
    if categories and any(
        i >= len(categories) or p["label"] != categories[i] for i, p in zip(indices, ranked, strict=True)
    ):
        raise InvalidEntry("a label is not its class index's name")
    scores = [p["score"] for p in ranked]
    if any(a < b for a, b in itertools.pairwise(scores)) or sum(scores) > 1.0 + 1e-3:  # float rounding
        raise InvalidEntry("top_k scores are not a ranked softmax")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no index


def _is_probability(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0  # NaN fails


def _is_prediction(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.keys() == PREDICTION_KEYS
        and isinstance(value["label"], str)
        and _is_int(value["index"])
        and value["index"] >= 0
        and _is_probability(value["score"])
    )


@dataclass
class CacheStats:
    mode: str
    since: float = field(default_factory=time.time)
    hits: int = 0
    misses: int = 0
    errors: int = 0
    invalid: int = 0  # bad entries read (also counted in misses)
    bypasses: int = 0
    degraded: str | None = None  # why the cache is not working right now

    def as_dict(self, keys: int | None) -> dict[str, Any]:
        lookups = self.hits + self.misses
        return {
            "mode": self.mode,
            "healthy": self.degraded is None,
            "degraded": self.degraded,
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "invalid": self.invalid,
            "bypasses": self.bypasses,
            "hit_rate": round(self.hits / lookups, 4) if lookups else 0.0,
            "keys": keys,
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
        }


class ResponseCache:
    """Fail-open lookups and stores around a backend's ``_get``/``_set`` (which may raise).

    An error is counted, logged at most once per 30 s, and opens a circuit breaker: for
    ``retry_after_s`` the cache is skipped (an "error" lookup, no waiting), then tried again.
    The base class itself is the ``off`` cache: every lookup misses.
    """

    mode = "off"

    def __init__(self, retry_after_s: float = 1.0) -> None:
        self.stats = CacheStats(self.mode)
        self.retry_after_s = retry_after_s
        self._open_until = 0.0
        self._last_log = 0.0
        self._last_invalid_log = 0.0

    async def lookup(self, key: str, expected: Expected) -> tuple[dict[str, Any] | None, str]:
        """The cached body (or None) and the event: ``hit``, ``miss``, ``invalid`` or ``error``.

        ``expected`` is what ``key`` was made from: the entry must match it.
        """
        if time.monotonic() < self._open_until:
            self.stats.errors += 1
            return None, "error"
        try:
            raw = await self._get(key)
        except InvalidEntry as exc:  # readable, but not a value of ours (e.g. a list under the key)
            self._recovered()
            self._invalid(key, exc)
            return None, "invalid"
        except Exception as exc:
            self._failed("GET", exc)
            return None, "error"
        self._recovered()
        if raw is None:
            self.stats.misses += 1
            return None, "miss"
        try:
            body = decode_entry(raw, expected)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
            self._invalid(key, exc)
            return None, "invalid"
        self.stats.hits += 1
        return body, "hit"

    async def store(self, key: str, value: dict[str, Any]) -> None:
        if time.monotonic() < self._open_until:
            return
        try:
            await self._set(key, encode_entry(value))
        except Exception as exc:
            self._failed("SET", exc)
            return
        self._recovered()

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
        self.stats.errors += 1
        self.stats.degraded = f"{self.mode} {op} failed: {type(exc).__name__}: {exc}"[:300]
        now = time.monotonic()
        self._open_until = now + self.retry_after_s
        if now - self._last_log > 30:  # one line per 30 s, however many requests fail
            self._last_log = now
            logger.warning("cache degraded, serving without it (retry every %.1fs): %s", self.retry_after_s, exc)

    def _invalid(self, key: str, exc: BaseException) -> None:
        # The store answered: a bad entry is the entry's fault, not an outage (no breaker).
        self.stats.misses += 1
        self.stats.invalid += 1
        now = time.monotonic()
        if now - self._last_invalid_log > 30:
            self._last_invalid_log = now
            logger.warning("cache entry %s ignored (%s): %s", key, type(exc).__name__, exc)

    def _recovered(self) -> None:
        if self.stats.degraded is not None:
            logger.warning("cache recovered: %s answers again", self.mode)
            self.stats.degraded = None

    async def _get(self, key: str) -> str | bytes | None:
        return None

    async def _set(self, key: str, raw: str | bytes) -> None:
        return None

    async def _key_count(self) -> int | None:
        return 0

    async def close(self) -> None:
        return None


class MemoryCache(ResponseCache):
    """A bounded LRU in this process (not shared between workers or servers).

    It keeps the encoded entry, as Redis does, so both are read through the same validation and
    a hit hands out a fresh dict, never one another request could change.
    """

    mode = "memory"

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        super().__init__()
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


class RedisCache(ResponseCache):
    """Redis shared by every worker and server; each call bounded by ``timeout_s``."""

    mode = "redis"

    def __init__(self, url: str, ttl_s: float, timeout_s: float) -> None:
        super().__init__()
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
            return await asyncio.wait_for(self.client.get(key), self.timeout_s)
        except ResponseError as exc:
            # WRONGTYPE: a list, hash or set under our key. Redis answered: no outage, just a bad
            # entry, which the SET after inference replaces (SET overwrites any type).
            if "WRONGTYPE" in str(exc):
                raise InvalidEntry(f"not a string value: {exc}") from exc
            raise

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
            raise results[0]
        # An index command failing (say, a foreign value under INDEX_KEY) only skews the count.

    async def _key_count(self) -> int:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(INDEX_KEY, "-inf", time.time())
            pipe.zcard(INDEX_KEY)
            _, count = await asyncio.wait_for(pipe.execute(), self.timeout_s)
        return int(count)

    async def close(self) -> None:
        await self.client.aclose()


async def open_cache(mode: str, redis_url: str, ttl_s: float, timeout_s: float, max_entries: int) -> ResponseCache:
    """``redis`` | ``memory`` | ``off`` | ``auto`` (Redis when it answers now, else memory)."""
    if mode == "off":
        cache: ResponseCache = ResponseCache()
    elif mode == "memory":
        cache = MemoryCache(max_entries, ttl_s)
    elif mode in ("redis", "auto"):
        redis_cache = RedisCache(redis_url, ttl_s, timeout_s)
        if await redis_cache.ping() or mode == "redis":
            cache = redis_cache  # in "redis" mode an absent Redis is "degraded", not a fallback
        else:
            await redis_cache.close()
            cache = MemoryCache(max_entries, ttl_s)
            cache.stats.mode = "memory (auto: redis unreachable at start-up)"
    else:
        raise ValueError(f"FASTINFER_CACHE must be redis, memory, off or auto, not {mode!r}")
    if cache.mode == "redis":
        cache.stats.mode = f"redis ({redis_url.split('@')[-1]})"  # never the password
    logger.warning("response cache: %s", cache.stats.mode)
    return cache
