"""Response cache: Redis (shared by every worker and server) or a bounded in-process LRU.

Keys: ``fastinfer:v<format>:<model tag>:<backend>:<top_k>:<sha256 of the image bytes>``; values
are the response JSON. Redis is fail-open: every call has a short timeout, an error is counted,
logged at most once per interval, and turns the cache off for a moment (a circuit breaker)
instead of failing or slowing the request; the client reconnects by itself when Redis returns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("fastinfer.cache")

CACHE_FORMAT = "1"
"""Bumped when the cached response's shape changes, so old entries are never served."""
NAMESPACE = "fastinfer"


def cache_key(image: bytes, backend: str, model_tag: str, top_k: int) -> str:
    digest = hashlib.sha256(image).hexdigest()
    return f"{NAMESPACE}:v{CACHE_FORMAT}:{model_tag}:{backend}:{top_k}:{digest}"


@dataclass
class CacheStats:
    mode: str
    since: float = field(default_factory=time.time)
    hits: int = 0
    misses: int = 0
    errors: int = 0
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

    async def lookup(self, key: str) -> tuple[dict[str, Any] | None, str]:
        """The cached value (or None) and the event: ``hit``, ``miss`` or ``error``."""
        if time.monotonic() < self._open_until:
            self.stats.errors += 1
            return None, "error"
        try:
            value = await self._get(key)
        except Exception as exc:
            self._failed("GET", exc)
            return None, "error"
        self._recovered()
        if value is None:
            self.stats.misses += 1
            return None, "miss"
        self.stats.hits += 1
        return value, "hit"

    async def store(self, key: str, value: dict[str, Any]) -> None:
        if time.monotonic() < self._open_until:
            return
        try:
            await self._set(key, value)
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

    def _recovered(self) -> None:
        if self.stats.degraded is not None:
            logger.warning("cache recovered: %s answers again", self.mode)
            self.stats.degraded = None

    async def _get(self, key: str) -> dict[str, Any] | None:
        return None

    async def _set(self, key: str, value: dict[str, Any]) -> None:
        return None

    async def _key_count(self) -> int | None:
        return 0

    async def close(self) -> None:
        return None


class MemoryCache(ResponseCache):
    """A bounded LRU in this process (not shared between workers or servers)."""

    mode = "memory"

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        super().__init__()
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._data: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    async def _get(self, key: str) -> dict[str, Any] | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    async def _set(self, key: str, value: dict[str, Any]) -> None:
        self._data[key] = (time.monotonic() + self.ttl_s, value)
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

    async def _get(self, key: str) -> dict[str, Any] | None:
        raw = await asyncio.wait_for(self.client.get(key), self.timeout_s)
        return json.loads(raw) if raw else None

    async def _set(self, key: str, value: dict[str, Any]) -> None:
        await asyncio.wait_for(self.client.set(key, json.dumps(value), ex=int(self.ttl_s)), self.timeout_s)

    async def _key_count(self) -> int:
        count = 0
        async for _ in self.client.scan_iter(match=f"{NAMESPACE}:v{CACHE_FORMAT}:*", count=1000):
            count += 1
        return count

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
