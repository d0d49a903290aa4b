"""The response cache without a server: keys, the memory bound, and Redis failing open."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from fastinfer.cache import MemoryCache, RedisCache, ResponseCache, cache_key, open_cache


def test_key_changes_with_every_input() -> None:
    base = cache_key(b"image", "onnx", "resnet50-onnx:abc", 5)
    assert base.startswith("fastinfer:v")
    assert cache_key(b"image", "onnx", "resnet50-onnx:abc", 5) == base
    others = [
        cache_key(b"imagE", "onnx", "resnet50-onnx:abc", 5),
        cache_key(b"image", "pytorch", "resnet50-onnx:abc", 5),
        cache_key(b"image", "onnx", "resnet50-onnx:def", 5),  # another model version → another key
        cache_key(b"image", "onnx", "resnet50-onnx:abc", 3),
    ]
    assert len({base, *others}) == 5


def test_memory_cache_stays_within_its_bound() -> None:
    async def main() -> MemoryCache:
        cache = MemoryCache(max_entries=100, ttl_s=60)
        for i in range(1000):
            await cache.store(f"k{i}", {"i": i})
        assert (await cache.lookup("k999"))[1] == "hit"
        assert (await cache.lookup("k0"))[1] == "miss"  # evicted, least recently used first
        return cache

    cache = asyncio.run(main())
    assert len(cache._data) == 100
    stats = asyncio.run(cache.describe())
    assert stats["keys"] == 100 and stats["hits"] == 1 and stats["misses"] == 1


def test_memory_cache_expires_entries() -> None:
    async def main() -> str:
        cache = MemoryCache(max_entries=10, ttl_s=0.01)
        await cache.store("k", {"v": 1})
        await asyncio.sleep(0.02)
        return (await cache.lookup("k"))[1]

    assert asyncio.run(main()) == "miss"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_redis_down_fails_open_fast_and_is_counted() -> None:
    async def main() -> tuple[list[str], float, dict]:
        cache = RedisCache(f"redis://127.0.0.1:{closed_port()}/0", ttl_s=60, timeout_s=0.05)
        t0 = time.perf_counter()
        events = [(await cache.lookup(f"k{i}"))[1] for i in range(50)]
        await cache.store("k", {"v": 1})  # must not raise
        elapsed = time.perf_counter() - t0
        stats = await cache.describe()
        await cache.close()
        return events, elapsed, stats

    events, elapsed, stats = asyncio.run(main())
    assert events == ["error"] * 50
    assert elapsed < 2.0  # the breaker skips Redis after the first failure instead of waiting 50 times
    assert stats["healthy"] is False and "redis" in stats["degraded"] and stats["errors"] >= 50


def test_auto_falls_back_to_memory_and_says_so() -> None:
    cache = asyncio.run(open_cache("auto", f"redis://127.0.0.1:{closed_port()}/0", 60, 0.05, 10))
    assert isinstance(cache, MemoryCache) and "redis unreachable" in cache.stats.mode


def test_off_never_hits() -> None:
    async def main() -> str:
        cache = await open_cache("off", "redis://unused", 60, 0.05, 10)
        assert type(cache) is ResponseCache
        await cache.store("k", {"v": 1})
        return (await cache.lookup("k"))[1]

    assert asyncio.run(main()) == "miss"


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="FASTINFER_CACHE"):
        asyncio.run(open_cache("disk", "redis://unused", 60, 0.05, 10))
