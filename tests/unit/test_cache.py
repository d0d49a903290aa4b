"""The response cache without a BentoML server: keys, the memory bound, Redis failing open, entries
validated on read, and the key count. The Redis tests use a real redis-server (database 1: the
integration tests' servers use 0)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from fastinfer.cache import (
    CACHE_FORMAT,
    INDEX_KEY,
    Expected,
    MemoryCache,
    RedisCache,
    ResponseCache,
    cache_key,
    open_cache,
)

TAG = "resnet50-onnx:abc"
KEY = cache_key(b"image", "onnx", TAG, 5)


def body(k: int = 5, backend: str = "onnx", model: str = TAG) -> dict[str, Any]:
    """A response body as fastinfer.pipeline.Pipeline._body makes it."""
    ranked = [{"label": f"class {i}", "index": i, "score": round(0.4 / 2**i, 4)} for i in range(k)]
    return {
        "class": ranked[0]["label"],
        "class_index": ranked[0]["index"],
        "confidence": ranked[0]["score"],
        "top_k": ranked,
        "backend": backend,
        "model": model,
        "weights": "random-init",
        "cached": False,
    }


CATEGORIES = [f"class {i}" for i in range(1000)]
EXPECTED = Expected("onnx", TAG, 5, "random-init", CATEGORIES)


async def lookup(cache: ResponseCache, key: str = KEY) -> tuple[dict[str, Any] | None, str]:
    return await cache.lookup(key, EXPECTED)


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
            await cache.store(f"k{i}", body())
        assert (await lookup(cache, "k999"))[1] == "hit"
        assert (await lookup(cache, "k0"))[1] == "miss"  # evicted, least recently used first
        return cache

    cache = asyncio.run(main())
    assert len(cache._data) == 100
    stats = asyncio.run(cache.describe())
    assert stats["keys"] == 100 and stats["hits"] == 1 and stats["misses"] == 1


def test_memory_cache_expires_entries() -> None:
    async def main() -> str:
        cache = MemoryCache(max_entries=10, ttl_s=0.01)
        await cache.store(KEY, body())
        await asyncio.sleep(0.02)
        return (await lookup(cache))[1]

    assert asyncio.run(main()) == "miss"


def test_memory_hit_is_the_stored_body_and_a_copy() -> None:
    async def main() -> None:
        cache = MemoryCache(max_entries=10, ttl_s=60)
        await cache.store(KEY, body())
        first, event = await lookup(cache)
        assert event == "hit" and first == body()
        first["class"] = "changed by a caller"  # must not reach the next request
        assert (await lookup(cache))[0] == body()

    asyncio.run(main())


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_redis_down_fails_open_fast_and_is_counted() -> None:
    async def main() -> tuple[list[str], float, dict]:
        cache = RedisCache(f"redis://127.0.0.1:{closed_port()}/0", ttl_s=60, timeout_s=0.05)
        t0 = time.perf_counter()
        events = [(await lookup(cache, f"k{i}"))[1] for i in range(50)]
        await cache.store("k", body())  # must not raise
        elapsed = time.perf_counter() - t0
        stats = await cache.describe()
        await cache.close()
        return events, elapsed, stats

    events, elapsed, stats = asyncio.run(main())
    assert events == ["error"] * 50
    assert elapsed < 2.0  # the breaker skips Redis after the first failure instead of waiting 50 times
    assert stats["healthy"] is False and "redis" in stats["degraded"] and stats["errors"] >= 50
    assert stats["keys"] is None


def test_auto_falls_back_to_memory_and_says_so() -> None:
    cache = asyncio.run(open_cache("auto", f"redis://127.0.0.1:{closed_port()}/0", 60, 0.05, 10))
    assert isinstance(cache, MemoryCache) and "redis unreachable" in cache.stats.mode


def test_off_never_hits() -> None:
    async def main() -> str:
        cache = await open_cache("off", "redis://unused", 60, 0.05, 10)
        assert type(cache) is ResponseCache
        await cache.store(KEY, body())
        return (await lookup(cache))[1]

    assert asyncio.run(main()) == "miss"


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="FASTINFER_CACHE"):
        asyncio.run(open_cache("disk", "redis://unused", 60, 0.05, 10))


# --- entries validated on read ----------------------------------------------------------------


@pytest.fixture()
def redis_url(redis_server) -> str:
    url = redis_server.url.rsplit("/", 1)[0] + "/1"
    with redis.Redis.from_url(url) as r:
        r.flushdb()
    return url


@contextlib.asynccontextmanager
async def redis_cache(url: str, ttl_s: float = 60) -> AsyncIterator[RedisCache]:
    cache = RedisCache(url, ttl_s=ttl_s, timeout_s=1)
    try:
        yield cache
    finally:
        await cache.close()


def entry(value: Any) -> str:
    return json.dumps({"v": CACHE_FORMAT, "body": value})


def changed(**fields: Any) -> str:
    """A good entry with some body fields replaced."""
    return entry({**body(), **fields})


def changed_prediction(**fields: Any) -> str:
    """A good entry whose top_k[0] has some fields replaced."""
    good = body()
    return entry({**good, "top_k": [{**good["top_k"][0], **fields}, *good["top_k"][1:]]})


BAD_ENTRIES: dict[str, str | bytes] = {
    "not JSON": b"{not json",
    "not UTF-8": b"\xff\xfe\x00garbage",
    "empty": b"",
    "JSON array": b"[1, 2, 3]",
    "JSON null": b"null",
    "bare body (format 1)": json.dumps(body()),
    "another format": json.dumps({"v": "1", "body": body()}),
    "body not an object": entry("a string"),
    "missing field": entry({k: v for k, v in body().items() if k != "weights"}),
    "extra field": changed(extra=1),
    "top_k shorter than the key's": changed(top_k=body()["top_k"][:3]),
    "top_k longer than the key's": changed(top_k=body(k=6)["top_k"]),
    "top_k empty": changed(top_k=[]),
    "top_k not a list": changed(top_k="class 0"),
    "prediction not an object": changed(top_k=[*body()["top_k"][:4], "class 4"]),
    "prediction without score": entry({**body(), "top_k": [*body()["top_k"][:4], {"label": "x", "index": 4}]}),
    "score a string": changed_prediction(score="0.5"),
    "score above 1": changed_prediction(score=1.5),
    "index a bool": changed_prediction(index=True),
    "label a number": changed_prediction(label=7),
    "class_index a string": changed(class_index="0"),
    "confidence NaN": changed(confidence=float("nan")),
    "cached a string": changed(cached="no"),
    "weights null": changed(weights=None),
    "class disagrees with top_k": changed(**{"class": "class 1"}),
    "another backend than the key": changed(backend="pytorch"),
    "another model than the key": changed(model="resnet50-onnx:def"),
    "weights relabelled": changed(weights="imagenet"),
    "a label not its index's name": entry(
        {**body(), "class": "hacked", "top_k": [{**body()["top_k"][0], "label": "hacked"}, *body()["top_k"][1:]]}
    ),
    "an index beyond the classes": entry(
        {**body(), "class_index": 999999, "top_k": [{**body()["top_k"][0], "index": 999999}, *body()["top_k"][1:]]}
    ),
    "a class twice": changed(top_k=[*body()["top_k"][:4], body()["top_k"][0]]),
    "scores rising": changed(
        top_k=body()["top_k"][::-1], **{"class": "class 4", "class_index": 4, "confidence": 0.025}
    ),
    "a valid entry padded to 5 MB (parsing it would hold the event loop)": entry(body()) + " " * 5_000_000,
    "scores summing above 1": entry(
        {**body(), "confidence": 0.95, "top_k": [{**body()["top_k"][0], "score": 0.95}, *body()["top_k"][1:]]}
    ),
}


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.parametrize("bad", BAD_ENTRIES, ids=list(BAD_ENTRIES))
def test_a_bad_entry_is_an_invalid_miss_never_an_error(kind: str, bad: str, request) -> None:
    async def main() -> dict:
        if kind == "memory":
            cache: ResponseCache = MemoryCache(max_entries=10, ttl_s=60)
            cache._data[KEY] = (time.monotonic() + 60, BAD_ENTRIES[bad])
        else:
            cache = RedisCache(request.getfixturevalue("redis_url"), ttl_s=60, timeout_s=1)
            await cache.client.set(KEY, BAD_ENTRIES[bad])  # as another version, or a person, would
        try:
            assert await lookup(cache) == (None, "invalid")
            await cache.store(KEY, body())  # what the request does after inference: overwrites it
            assert await lookup(cache) == (body(), "hit")  # the breaker stayed closed
            return await cache.describe()
        finally:
            await cache.close()

    stats = asyncio.run(main())
    assert stats["invalid"] == 1 and stats["misses"] == 1 and stats["hits"] == 1
    assert stats["errors"] == 0 and stats["healthy"] is True


def test_redis_stores_what_it_reads(redis_url: str) -> None:
    async def main() -> None:
        async with redis_cache(redis_url) as cache:
            await cache.store(KEY, body())
            assert json.loads(await cache.client.get(KEY)) == {"v": CACHE_FORMAT, "body": body()}
            assert await lookup(cache) == (body(), "hit")
            # the same entry read for another top_k, backend or model than it holds is not served
            assert (await cache.lookup(KEY, replace(EXPECTED, top_k=3)))[1] == "invalid"
            assert (await cache.lookup(KEY, replace(EXPECTED, backend="pytorch")))[1] == "invalid"
            assert (await cache.lookup(KEY, replace(EXPECTED, model_tag="resnet50-onnx:def")))[1] == "invalid"
            assert (await cache.lookup(KEY, replace(EXPECTED, weights="imagenet")))[1] == "invalid"

    asyncio.run(main())


# --- the key count: maintained, not scanned ----------------------------------------------------


async def calls(client: Any, command: str) -> int:
    return (await client.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0)


def test_redis_key_count_is_exact_and_never_scans(redis_url: str) -> None:
    async def main() -> tuple[dict, dict[str, int]]:
        async with redis_cache(redis_url) as cache:
            async with cache.client.pipeline(transaction=False) as pipe:  # another app's keys, and v1's
                for i in range(5000):
                    pipe.set(f"otherapp:session:{i}" if i % 2 else f"fastinfer:v1:old:onnx:5:{i}", "x")
                await pipe.execute()
            for i in range(30):
                await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5), body())
            for i in range(10):  # stored again: still 30 entries
                await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5), body())
            before = {c: await calls(cache.client, c) for c in ("scan", "keys", "dbsize")}
            stats = await cache.describe()
            after = {c: await calls(cache.client, c) for c in before}
            return stats, {c: after[c] - before[c] for c in before}

    stats, issued = asyncio.run(main())
    assert issued == {"scan": 0, "keys": 0, "dbsize": 0}
    assert stats["keys"] == 30


def test_redis_key_count_goes_down_as_entries_expire(redis_url: str) -> None:
    async def main() -> list[int]:
        async with redis_cache(redis_url, ttl_s=1.0) as cache:
            counts = []
            for i in range(12):
                await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5), body())
            counts.append((await cache.describe())["keys"])
            await asyncio.sleep(1.2)
            await cache.store(cache_key(b"a later image", "onnx", TAG, 5), body())
            counts.append((await cache.describe())["keys"])
            await asyncio.sleep(1.2)
            counts.append((await cache.describe())["keys"])
            return counts

    assert asyncio.run(main()) == [12, 1, 0]


def test_redis_index_stays_bounded_when_nobody_counts(redis_url: str) -> None:
    async def main() -> None:
        async with redis_cache(redis_url, ttl_s=1.0) as cache:  # long enough for 50 SETs on a busy machine
            for i in range(50):
                await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5), body())
            assert await cache.client.zcard(INDEX_KEY) == 50
            await asyncio.sleep(1.2)
            await cache.store(cache_key(b"a later image", "onnx", TAG, 5), body())  # a SET trims, no describe
            assert await cache.client.zcard(INDEX_KEY) == 1
            assert 0 < await cache.client.pttl(INDEX_KEY) <= 1000
            await asyncio.sleep(1.2)
            assert await cache.client.exists(INDEX_KEY) == 0  # writes stopped: the index is gone too

    asyncio.run(main())


def test_a_foreign_value_under_the_index_costs_the_count_only(redis_url: str) -> None:
    async def main() -> dict:
        async with redis_cache(redis_url) as cache:
            await cache.client.set(INDEX_KEY, "not a sorted set")  # every index command fails: WRONGTYPE
            await cache.store(KEY, body())
            assert await lookup(cache) == (body(), "hit")
            return await cache.describe()

    stats = asyncio.run(main())
    assert stats["keys"] is None and stats["errors"] == 0 and stats["healthy"] is True


@pytest.mark.parametrize("kind", ["list", "hash", "set"])
def test_another_redis_type_under_the_key_is_invalid_not_an_outage(kind: str, redis_url: str) -> None:
    """WRONGTYPE once counted as a Redis failure: the breaker opened for every request, and the SET
    that would replace the value was skipped while it was open, so one key kept the cache off."""

    async def main() -> dict:
        async with redis_cache(redis_url) as cache:
            other = cache_key(b"another image", "onnx", TAG, 5)
            await cache.store(other, body())
            writes = {"list": cache.client.rpush, "hash": cache.client.hset, "set": cache.client.sadd}
            await (writes[kind](KEY, "x", "y") if kind == "hash" else writes[kind](KEY, "x"))
            assert await lookup(cache) == (None, "invalid")
            assert await lookup(cache, other) == (body(), "hit")  # everyone else still served
            await cache.store(KEY, body())
            assert await lookup(cache) == (body(), "hit")
            return await cache.describe()

    stats = asyncio.run(main())
    assert stats["errors"] == 0 and stats["healthy"] is True and stats["invalid"] == 1
