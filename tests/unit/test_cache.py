"""The response cache without a BentoML server: keys, the memory bound, Redis failing open, entries
validated (and signed) on read, refused writes that leave reads on, the key count, and the cache's
settings. The Redis tests use a real redis-server (database 1: the integration tests' servers use 0;
a test that changes the server's configuration starts its own)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from fastinfer.catalog import config
from fastinfer.front.api_models import CacheStatsResponse
from fastinfer.serving.cache import (
    CACHE_FORMAT,
    INDEX_KEY,
    MAX_ENTRY_BYTES,
    Expected,
    InvalidEntry,
    MemoryCache,
    RedisCache,
    ResponseCache,
    WriteRefused,
    _refusal,
    cache_key,
    decode_entry,
    encode_entry,
    entry_mac,
    open_cache,
    redact_url,
)
from tests.servers import RedisServer
from tests.settings import settings_with as settings

pytestmark = pytest.mark.anyio
TAG = "resnet50-onnx:abc"
ENGINE = "ONNX Runtime 1.32.0 on CPUExecutionProvider; CPU instructions avx2"
KEY = cache_key(b"image", "onnx", TAG, 5, ENGINE)


def body(k: int = 5, backend: str = "onnx", model: str = TAG, first: int = 0) -> dict[str, Any]:
    """A response body as fastinfer.serving.pipeline.Pipeline._body makes it (classes first, first + 1, ...)."""
    ranked = [{"label": f"class {first + i}", "index": first + i, "score": round(0.4 / 2**i, 4)} for i in range(k)]
    return {
        "class": ranked[0]["label"],
        "class_index": ranked[0]["index"],
        "confidence": ranked[0]["score"],
        "top_k": ranked,
        "backend": backend,
        "model": model,
        "weights": "random-init",
        "engine": ENGINE,
        "cached": False,
    }


CATEGORIES = [f"class {i}" for i in range(1000)]
EXPECTED = Expected("onnx", TAG, 5, "random-init", ENGINE, CATEGORIES)


async def lookup(cache: ResponseCache, key: str = KEY) -> tuple[dict[str, Any] | None, str]:
    return await cache.lookup(key, EXPECTED)


def test_key_changes_with_every_input() -> None:
    base = cache_key(b"image", "onnx", "resnet50-onnx:abc", 5, ENGINE)
    assert base.startswith("fastinfer:v")
    assert cache_key(b"image", "onnx", "resnet50-onnx:abc", 5, ENGINE) == base
    others = [
        cache_key(b"imagE", "onnx", "resnet50-onnx:abc", 5, ENGINE),
        cache_key(b"image", "pytorch", "resnet50-onnx:abc", 5, ENGINE),
        cache_key(b"image", "onnx", "resnet50-onnx:def", 5, ENGINE),  # another model version → another key
        cache_key(b"image", "onnx", "resnet50-onnx:abc", 3, ENGINE),
        # the same model at another precision, or on another runtime, computes other numbers
        cache_key(b"image", "onnx", "resnet50-onnx:abc", 5, ENGINE.replace("1.32.0", "1.33.0")),
        cache_key(b"image", "onnx", "resnet50-onnx:abc", 5, "OpenVINO 2026.4 on CPU at f32; CPU instructions avx2"),
    ]
    assert len({base, *others}) == 7


async def test_memory_cache_stays_within_its_bound() -> None:
    cache = MemoryCache(max_entries=100, ttl_s=60)
    for i in range(1000):
        await cache.store(f"k{i}", body())
    assert (await lookup(cache, "k999"))[1] == "hit"
    assert (await lookup(cache, "k0"))[1] == "miss"  # evicted, least recently used first
    assert len(cache._data) == 100
    stats = await cache.describe()
    assert stats["keys"] == 100 and stats["hits"] == 1 and stats["misses"] == 1


async def test_memory_cache_expires_entries() -> None:
    cache = MemoryCache(max_entries=10, ttl_s=0.01)
    await cache.store(KEY, body())
    await asyncio.sleep(0.02)
    assert (await lookup(cache))[1] == "miss"


async def test_memory_hit_is_the_stored_body_and_a_copy() -> None:
    cache = MemoryCache(max_entries=10, ttl_s=60)
    await cache.store(KEY, body())
    first, event = await lookup(cache)
    assert event == "hit" and first == body()
    first["class"] = "changed by a caller"  # must not reach the next request
    assert (await lookup(cache))[0] == body()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


async def test_redis_down_fails_open_fast_and_is_counted() -> None:
    cache = RedisCache(f"redis://127.0.0.1:{closed_port()}/0", ttl_s=60, timeout_s=0.05)
    t0 = time.perf_counter()
    events = [(await lookup(cache, f"k{i}"))[1] for i in range(50)]
    await cache.store("k", body())  # must not raise
    elapsed = time.perf_counter() - t0
    stats = await cache.describe()
    await cache.close()
    assert events == ["error"] * 50
    assert elapsed < 2.0  # the breaker skips Redis after the first failure instead of waiting 50 times
    assert stats["healthy"] is False and "redis" in stats["degraded"] and stats["errors"] >= 50
    assert stats["keys"] is None


async def test_auto_falls_back_to_memory_off_never_hits_and_another_mode_is_an_error() -> None:
    cache = await open_cache("auto", f"redis://127.0.0.1:{closed_port()}/0", 60, 0.05, 10)
    assert isinstance(cache, MemoryCache) and "redis unreachable" in cache.stats.mode
    cache = await open_cache("off", "redis://unused", 60, 0.05, 10)
    assert type(cache) is ResponseCache
    await cache.store(KEY, body())
    assert (await lookup(cache))[1] == "miss"
    with pytest.raises(ValueError, match="FASTINFER_CACHE"):
        await open_cache("disk", "redis://unused", 60, 0.05, 10)


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
    """An unsigned entry of this format."""
    return json.dumps({"v": CACHE_FORMAT, "mac": None, "body": value})


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
    "another format": json.dumps({"v": "1", "mac": None, "body": body()}),
    "format 2 ({v, body})": json.dumps({"v": "2", "body": body()}),
    "format 3, its body as this format's": json.dumps({"v": "3", "mac": None, "body": body()}),
    "this format without its mac field": json.dumps({"v": CACHE_FORMAT, "body": body()}),
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
    "computed by another engine than the key's": changed(engine=ENGINE.replace("avx2", "avx2+avx512f")),
    "engine missing": entry({k: v for k, v in body().items() if k != "engine"}),
    "a label not its index's name": entry(
        {**body(), "class": "hacked", "top_k": [{**body()["top_k"][0], "label": "hacked"}, *body()["top_k"][1:]]}
    ),
    "an index beyond the classes": entry(
        {**body(), "class_index": 999999, "top_k": [{**body()["top_k"][0], "index": 999999}, *body()["top_k"][1:]]}
    ),
    "a class twice": changed(top_k=[*body()["top_k"][:4], {"label": "class 3", "index": 3, "score": 0.025}]),
    "an index below 0, labelled as Python would index it": changed(
        top_k=[*body()["top_k"][:4], {"label": CATEGORIES[-1], "index": -1, "score": 0.025}]
    ),
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
async def test_a_bad_entry_is_an_invalid_miss_never_an_error(kind: str, bad: str, request) -> None:
    # Redis is read with GETRANGE (bounded), which answers "" for a missing key and an empty value
    # alike: an empty value is a plain miss there, overwritten all the same.
    event = "miss" if (kind, bad) == ("redis", "empty") else "invalid"
    if kind == "memory":
        cache: ResponseCache = MemoryCache(max_entries=10, ttl_s=60)
        cache._data[KEY] = (time.monotonic() + 60, BAD_ENTRIES[bad])
    else:
        cache = RedisCache(request.getfixturevalue("redis_url"), ttl_s=60, timeout_s=1)
        await cache.client.set(KEY, BAD_ENTRIES[bad])  # as another version, or a person, would
    try:
        assert await lookup(cache) == (None, event)
        await cache.store(KEY, body())  # what the request does after inference: overwrites it
        assert await lookup(cache) == (body(), "hit")  # the breaker stayed closed
        stats = await cache.describe()
    finally:
        await cache.close()
    assert stats["invalid"] == (event == "invalid") and stats["misses"] == 1 and stats["hits"] == 1
    assert stats["errors"] == 0 and stats["healthy"] is True


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(json.dumps({"v": "3", "body": {"class": 1}}), "format '3', this version reads '" + CACHE_FORMAT + "'"),
     (changed(score="https://x"), "not an entry of ours: body.score: Extra inputs are not permitted"),
     (changed(**{"api_key=hunter2\nERROR forged": 1}), "not an entry of ours: body.?: Extra inputs are not permitted"),
     (json.dumps({"v": "SECRET" * 1000, "mac": None}), "format of no version of ours, this version reads '4'"),
     (changed_prediction(score="0.5"), "not an entry of ours: body.top_k.0.score: Input should be a valid number")],
)  # fmt: skip
def test_an_invalid_entry_is_said_by_where_and_what_never_by_its_text(raw: str, reason: str) -> None:
    with pytest.raises(InvalidEntry) as refused:
        decode_entry(raw, EXPECTED)
    assert str(refused.value) == reason


def test_a_signed_entry_s_fault_is_placed_in_its_body() -> None:
    signed = encode_entry({**body(), "leak": 1}, KEY, HMAC_KEY.encode())
    with pytest.raises(InvalidEntry, match=r"^not an entry of ours: body\.\?: Extra inputs are not permitted$"):
        decode_entry(signed, EXPECTED, KEY, HMAC_KEY.encode())


async def test_an_invalid_entry_is_logged_on_one_bounded_line(caplog: pytest.LogCaptureFixture) -> None:
    """What an entry says (its backend here) is anyone's text who can write to the cache."""
    cache = MemoryCache(max_entries=10, ttl_s=60)
    cache._data[KEY] = (time.monotonic() + 60, changed(backend="x\nERROR forged line " + "b" * 20_000))
    with caplog.at_level(logging.WARNING, logger="fastinfer.cache"):
        assert await lookup(cache) == (None, "invalid")
    (line,) = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert "\n" not in line and len(line) < 500, line


async def test_redis_stores_what_it_reads(redis_url: str) -> None:
    async with redis_cache(redis_url) as cache:
        await cache.store(KEY, body())
        assert json.loads(await cache.client.get(KEY)) == {"v": CACHE_FORMAT, "mac": None, "body": body()}
        assert await lookup(cache) == (body(), "hit")


# --- the key count: maintained, not scanned ----------------------------------------------------


async def calls(client: Any, command: str) -> int:
    """How often ``command`` reached Redis: run, failed, or rejected (e.g. OOM) before it ran."""
    stats = (await client.info("commandstats")).get(f"cmdstat_{command}", {})
    return sum(stats.get(n, 0) for n in ("calls", "rejected_calls"))


async def test_redis_key_count_is_exact_and_never_scans(redis_url: str) -> None:
    async with redis_cache(redis_url) as cache:
        async with cache.client.pipeline(transaction=False) as pipe:  # another app's keys, and v1's
            for i in range(5000):
                pipe.set(f"otherapp:session:{i}" if i % 2 else f"fastinfer:v1:old:onnx:5:{i}", "x")
            await pipe.execute()
        for i in range(30):
            await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5, ENGINE), body())
        for i in range(10):  # stored again: still 30 entries
            await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5, ENGINE), body())
        before = {c: await calls(cache.client, c) for c in ("scan", "keys", "dbsize")}
        stats = await cache.describe()
        after = {c: await calls(cache.client, c) for c in before}
    assert {c: after[c] - before[c] for c in before} == {"scan": 0, "keys": 0, "dbsize": 0}
    assert stats["keys"] == 30


async def test_redis_key_count_and_index_follow_expiry_and_stay_bounded(redis_url: str) -> None:
    """The count goes down as entries expire; a SET trims the index with nobody counting (no describe), and
    the index expires when writes stop."""
    async with redis_cache(redis_url, ttl_s=1.0) as cache:  # long enough for 50 SETs on a busy machine
        for i in range(50):
            await cache.store(cache_key(f"image {i}".encode(), "onnx", TAG, 5, ENGINE), body())
        assert await cache.client.zcard(INDEX_KEY) == 50
        assert (await cache.describe())["keys"] == 50
        await asyncio.sleep(1.2)
        await cache.store(cache_key(b"a later image", "onnx", TAG, 5, ENGINE), body())  # a SET trims, no describe
        assert await cache.client.zcard(INDEX_KEY) == 1
        assert 0 < await cache.client.pttl(INDEX_KEY) <= 1000
        assert (await cache.describe())["keys"] == 1
        await asyncio.sleep(1.2)
        assert await cache.client.exists(INDEX_KEY) == 0  # writes stopped: the index is gone too
        assert (await cache.describe())["keys"] == 0


async def test_a_foreign_value_under_the_index_costs_the_count_only(redis_url: str) -> None:
    async with redis_cache(redis_url) as cache:
        await cache.client.set(INDEX_KEY, "not a sorted set")  # every index command fails: WRONGTYPE
        await cache.store(KEY, body())
        assert await lookup(cache) == (body(), "hit")
        stats = await cache.describe()
    assert stats["keys"] is None and stats["errors"] == 0 and stats["healthy"] is True


@pytest.mark.parametrize("kind", ["list", "hash", "set"])
async def test_another_redis_type_under_the_key_is_invalid_not_an_outage(kind: str, redis_url: str) -> None:
    """WRONGTYPE is an invalid entry, not a Redis failure that would open the breaker (and skip the SET that
    replaces the value)."""
    async with redis_cache(redis_url) as cache:
        other = cache_key(b"another image", "onnx", TAG, 5, ENGINE)
        await cache.store(other, body())
        writes = {"list": cache.client.rpush, "hash": cache.client.hset, "set": cache.client.sadd}
        await (writes[kind](KEY, "x", "y") if kind == "hash" else writes[kind](KEY, "x"))
        assert await lookup(cache) == (None, "invalid")
        assert await lookup(cache, other) == (body(), "hit")  # everyone else still served
        await cache.store(KEY, body())
        assert await lookup(cache) == (body(), "hit")
        stats = await cache.describe()
    assert stats["errors"] == 0 and stats["healthy"] is True and stats["invalid"] == 1


# --- what /cache/stats says ---------------------------------------------------------------------


async def test_stats_have_the_documented_shape() -> None:
    """describe() and the response model of /cache/stats (the OpenAPI spec) name the same fields."""
    stats = await MemoryCache(max_entries=10, ttl_s=60).describe()
    assert set(stats) == set(CacheStatsResponse.model_fields)
    CacheStatsResponse.model_validate(stats)


class FlakyMemory(MemoryCache):
    """A memory cache whose store stops answering when told to."""

    down = False

    async def _get(self, key: str) -> str | bytes | None:
        if self.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return await super()._get(key)


async def test_the_hit_rate_counts_lookups_that_failed() -> None:
    """Failed lookups count in the hit rate (left out, a cache whose reads all failed reported 0.9995)."""
    cache = FlakyMemory(max_entries=10, ttl_s=60)
    await cache.store(KEY, body())
    assert (await lookup(cache))[1] == "hit"
    assert (await lookup(cache, "absent"))[1] == "miss"
    cache.down = True
    assert [(await lookup(cache))[1] for _ in range(6)] == ["error"] * 6  # one failed, five skipped
    cache.bypassed()  # no lookup: the client asked for none
    stats = await cache.describe()
    assert (stats["hits"], stats["misses"], stats["errors"], stats["bypasses"]) == (1, 1, 6, 1)
    assert stats["hit_rate"] == 0.125  # 1 / (1 + 1 + 6)
    assert stats["healthy"] is False and "Connection refused" in stats["degraded"]


class SlowStore(ResponseCache):
    """A store whose calls run past their limit the way RedisCache's do (asyncio.wait_for)."""

    mode = "redis"
    timeout_s = 0.05

    async def _get(self, key: str) -> str | bytes | None:
        return await asyncio.wait_for(asyncio.sleep(1), self.timeout_s)

    async def _set(self, key: str, raw: str | bytes) -> None:
        await asyncio.wait_for(asyncio.sleep(1), self.timeout_s)


@pytest.mark.parametrize("op", ["GET", "SET"])
async def test_a_timeout_is_said_in_words(op: str) -> None:
    """asyncio's TimeoutError has no message: the reason must not end in nothing."""
    cache = SlowStore()
    await (lookup(cache) if op == "GET" else cache.store(KEY, body()))
    stats = await cache.describe()
    assert stats["degraded"] == f"redis {op} failed: timed out after 50 ms"
    assert (stats["errors"], stats["write_errors"]) == ((1, 0) if op == "GET" else (0, 1))


@pytest.mark.parametrize(
    "exc", [ConnectionError(), RuntimeError("   "), OSError(), asyncio.CancelledError()], ids=lambda e: type(e).__name__
)
def test_every_degraded_message_says_something(exc: BaseException) -> None:
    cache = ResponseCache()
    cache._failed("GET", exc)
    reason = cache.stats.degraded.split("failed: ", 1)[1]
    assert reason.strip() and not reason.rstrip().endswith(":"), cache.stats.degraded
    assert type(exc).__name__ in reason


async def test_a_silent_redis_times_out_in_words() -> None:
    """A Redis that accepts connections and never answers (a hung server, a black-holed route)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepted by the kernel, never read
        cache = RedisCache(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", ttl_s=60, timeout_s=0.05)
        try:
            await cache.store(KEY, body())
            stats = await cache.describe()
        finally:
            await cache.close()
    degraded = stats["degraded"]
    assert degraded.startswith("redis SET failed: ") and "time" in degraded.lower(), degraded
    assert not degraded.rstrip().endswith(":"), degraded


# --- a Redis that answers but refuses writes ----------------------------------------------------


@pytest.fixture()
def own_redis(tmp_path) -> RedisServer:
    """A redis-server of this test's own, whose configuration it may change."""
    srv = RedisServer(tmp_path)
    srv.start()
    yield srv
    srv.stop()


def fill_to_the_brim(admin: redis.Redis) -> None:
    """Redis full the way production fills it: maxmemory with noeviction, written until it refuses."""
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 2_000_000)
    for i in itertools.count():
        try:
            admin.set(f"otherapp:blob:{i}", b"x" * 20_000)
        except redis.exceptions.OutOfMemoryError:
            break
    # The refused blob's request buffer is freed after it, which leaves room for a small write or two:
    # a margin, so that every write of the test is refused.
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 100_000)


@pytest.mark.parametrize("refusal", ["OOM", "READONLY"])
async def test_a_refused_write_leaves_reads_on(refusal: str, own_redis: RedisServer) -> None:
    """A full Redis (maxmemory + noeviction: OOM) or a replica (READONLY) still serves what it holds: a
    refused SET must not open the breaker, which would skip the GETs too."""
    admin = redis.Redis.from_url(own_redis.url)
    try:
        async with redis_cache(own_redis.url) as cache:
            cache.retry_after_s = 0.2
            await cache.store(KEY, body())  # a photo stored while there was room
            if refusal == "OOM":
                fill_to_the_brim(admin)
            else:
                admin.replicaof("127.0.0.1", closed_port())  # a master that never answers: stale reads allowed
            events = []
            for i in range(20):  # new photos (not stored) and the repeated one, in turn
                await cache.store(cache_key(f"new photo {i}".encode(), "onnx", TAG, 5, ENGINE), body())
                events.append((await lookup(cache))[1])
            during = await cache.describe()
            if refusal == "OOM":
                admin.config_set("maxmemory", 0)  # room again
            else:
                admin.replicaof("no", "one")
            await asyncio.sleep(0.25)  # the write back-off ends
            await cache.store(cache_key(b"a later photo", "onnx", TAG, 5, ENGINE), body())
            assert (await lookup(cache, cache_key(b"a later photo", "onnx", TAG, 5, ENGINE)))[1] == "hit"
            after = await cache.describe()
    finally:
        admin.close()
    assert events == ["hit"] * 20
    assert during["healthy"] is False and during["degraded"].startswith(f"writes refused: {refusal} ")
    assert "reads still served" in during["degraded"]
    assert during["errors"] == 0 and during["write_errors"] == 0
    assert during["writes_refused"] == 20  # each answer not stored is counted, tried or backed off from
    assert during["hit_rate"] == 1.0 and during["keys"] is not None
    assert after["healthy"] is True and after["degraded"] is None and after["writes_refused"] == 20


async def test_writes_back_off_while_refused(own_redis: RedisServer) -> None:
    """One SET a back-off interval is tried while Redis refuses, not one per request."""
    admin = redis.Redis.from_url(own_redis.url)
    try:
        async with redis_cache(own_redis.url) as cache:
            cache.retry_after_s = 60
            fill_to_the_brim(admin)
            before = await calls(cache.client, "set")
            for i in range(50):
                await cache.store(cache_key(f"photo {i}".encode(), "onnx", TAG, 5, ENGINE), body())
            assert await calls(cache.client, "set") - before == 1
    finally:
        admin.close()


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", True),
        ("READONLY You can't write against a read only replica.", True),
        ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", True),
        ("NOREPLICAS Not enough good replicas to write.", True),
        ("ERR unknown command 'SET'", False),
        ("NOPERM this user has no permissions to run the 'set' command", False),
        ("OOMKILLER a reply code of another name", False),
    ],
)
def test_which_replies_are_refusals(error: str, refused: bool) -> None:
    from redis._parsers.base import BaseParser

    exc = BaseParser.parse_error(error)  # the exception redis-py raises for that reply
    assert isinstance(_refusal(exc), WriteRefused) is refused
    if refused:
        assert str(_refusal(exc)).startswith(error.split()[0])
    assert _refusal(redis.exceptions.ConnectionError("Connection refused")) is None


# --- a value too large to be ours ---------------------------------------------------------------


def net_output_bytes(admin: redis.Redis) -> int:
    return admin.info("stats")["total_net_output_bytes"]


async def test_a_huge_value_is_refused_without_being_read_whole(redis_url: str) -> None:
    """Redis sends at most MAX_ENTRY_BYTES + 1 bytes of a huge value under our key (read whole, one of ~200 MB
    timed out and opened the breaker); it is an invalid entry, recomputed and overwritten."""
    admin = redis.Redis.from_url(redis_url)
    admin.set(KEY, entry(body()) + " " * 64_000_000)
    cache = RedisCache(redis_url, ttl_s=60, timeout_s=0.05)  # the production limit
    try:
        before = net_output_bytes(admin)
        event = (await lookup(cache))[1]
        sent = net_output_bytes(admin) - before
        await cache.store(KEY, body())
        assert await lookup(cache) == (body(), "hit")
        stats = await cache.describe()
    finally:
        await cache.close()
        admin.close()
    assert event == "invalid"
    assert sent < MAX_ENTRY_BYTES + 8_000, f"Redis sent {sent:,} bytes for one lookup"  # + INFO's own reply
    assert stats["healthy"] is True and stats["errors"] == 0 and stats["invalid"] == 1


# --- signed entries -----------------------------------------------------------------------------

HMAC_KEY = "a-cache-signing-key-of-32-chars-or-more-0123"
FORGED = body(first=500)  # a consistent answer, but another photo's: without a key, validation alone serves it


def signed_cache(kind: str, request, hmac_key: str = HMAC_KEY) -> ResponseCache:
    if kind == "memory":
        return MemoryCache(max_entries=10, ttl_s=60, hmac_key=hmac_key)
    return RedisCache(request.getfixturevalue("redis_url"), ttl_s=60, timeout_s=1, hmac_key=hmac_key)


async def put(cache: ResponseCache, key: str, raw: str | bytes) -> None:
    """Writes ``raw`` under ``key`` as anyone with access to the store could."""
    if isinstance(cache, MemoryCache):
        cache._data[key] = (time.monotonic() + 60, raw)
    else:
        await cache.client.set(key, raw)


def signed(body_text: str, mac: str) -> str:
    """An entry laid out as encode_entry lays one out, with any body text and MAC."""
    return f'{{"v":"{CACHE_FORMAT}","mac":"{mac}","body":{body_text}}}'


TRUE_MAC = entry_mac(HMAC_KEY.encode(), KEY, json.dumps(body()))
FORGERIES = {
    "unsigned": lambda: encode_entry(FORGED, KEY),
    "signed with another key": lambda: encode_entry(FORGED, KEY, b"another key, of 32 characters or more"),
    "the MAC of the true answer, the forged body": lambda: signed(json.dumps(FORGED), TRUE_MAC),
    "the true answer, one score changed after signing": lambda: signed(
        json.dumps(body()).replace('"score": 0.4', '"score": 0.5'), TRUE_MAC
    ),
    "the true answer, the MAC in capitals": lambda: signed(json.dumps(body()), TRUE_MAC.upper()),
    "the true answer, laid out another way": lambda: json.dumps(
        {"v": CACHE_FORMAT, "mac": TRUE_MAC, "body": body()}, indent=1
    ),
    "a valid entry of another key, copied": lambda: encode_entry(
        FORGED, cache_key(b"another photo", "onnx", TAG, 5, ENGINE), HMAC_KEY.encode()
    ),
    "a MAC that is not a string": lambda: json.dumps({"v": CACHE_FORMAT, "mac": 7, "body": FORGED}),
    "another format, signed": lambda: encode_entry(FORGED, KEY, HMAC_KEY.encode()).replace(
        f'"v":"{CACHE_FORMAT}"', '"v":"2"'
    ),
}


@pytest.mark.parametrize("kind", ["memory", "redis"])
@pytest.mark.parametrize("forgery", FORGERIES, ids=list(FORGERIES))
async def test_with_a_key_only_entries_it_signed_are_served(kind: str, forgery: str, request) -> None:
    cache = signed_cache(kind, request)
    try:
        await put(cache, KEY, FORGERIES[forgery]())
        assert await lookup(cache) == (None, "invalid")  # never served, and no outage
        await cache.store(KEY, body())  # the request's answer overwrites it
        assert await lookup(cache) == (body(), "hit")
        stats = await cache.describe()
    finally:
        await cache.close()
    assert stats["signed"] is True and stats["healthy"] is True and stats["invalid"] == 1 and stats["errors"] == 0


async def test_a_signed_entry_covers_key_and_body(redis_url: str) -> None:
    """Stored in the layout the forgeries above are written in (signed()): they are refused for what they
    change, not for their layout."""
    async with redis_cache(redis_url) as cache:
        cache.hmac_key = HMAC_KEY.encode()
        await cache.store(KEY, body())
        stored = await cache.client.get(KEY)
    mac = entry_mac(HMAC_KEY.encode(), KEY, json.dumps(body()))
    assert json.loads(stored) == {"v": CACHE_FORMAT, "mac": mac, "body": body()}  # JSON, as before
    assert stored.decode() == signed(json.dumps(body()), mac) and len(mac) == 64


async def test_the_signing_key_reaches_every_mode_and_is_said() -> None:
    port = closed_port()
    caches = [
        await open_cache("memory", "redis://unused", 60, 0.05, 10, hmac_key=HMAC_KEY),
        await open_cache("auto", f"redis://127.0.0.1:{port}/0", 60, 0.05, 10, hmac_key=HMAC_KEY),
        await open_cache("redis", f"redis://127.0.0.1:{port}/0", 60, 0.05, 10, hmac_key=HMAC_KEY),
    ]
    assert [c.hmac_key for c in caches] == [HMAC_KEY.encode()] * 3
    described = [await c.describe() for c in caches]
    assert all(d["signed"] is True for d in described)
    assert (await ResponseCache().describe())["signed"] is False


# --- every valid family's entries fit what a read accepts ---------------------------------------

LONG_TAG = f"{'f' * 40}-onnx-int8:abcdefghijklmnop"  # the longest family name a build accepts


def family_body(labels: list[str], k: int) -> dict[str, Any]:
    """A response body naming ``labels``' first ``k`` classes, for a model of LONG_TAG."""
    ranked = [{**p, "label": labels[p["index"]]} for p in body(k)["top_k"]]
    return {**body(k, model=LONG_TAG), "class": ranked[0]["label"], "top_k": ranked}


@pytest.mark.parametrize("signed_with", ["", HMAC_KEY], ids=["unsigned", "signed"])
@pytest.mark.parametrize("char", ["中", "\U00020000"], ids=["CJK (3 UTF-8 bytes)", "CJK extension B (4 bytes)"])
@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_the_largest_labels_a_build_accepts_are_cached_at_every_top_k(kind, char, signed_with, request) -> None:
    """20 labels of the longest a build accepts, in 3- and 4-byte UTF-8, hit at every top_k on the second
    request (an entry beyond the read limit would miss every time, and be written again each request)."""
    from build_models.labels import MAX_LABEL
    from fastinfer.common.schemas import TOP_K_MAX

    labels = [f"{i:02d}" + char * (MAX_LABEL - 2) for i in range(TOP_K_MAX)]
    cache = signed_cache(kind, request, hmac_key=signed_with)
    events = []
    try:
        for k in range(1, TOP_K_MAX + 1):
            key = cache_key(b"image", "onnx-int8", LONG_TAG, k, ENGINE)
            expected = Expected("onnx", LONG_TAG, k, "random-init", ENGINE, labels)
            for _ in range(2):  # a request: looked up, then stored on a miss
                found, event = await cache.lookup(key, expected)
                right = found in (None, family_body(labels, k))
                events.append(f"top_k {k}: {event}" if right else f"top_k {k}: another body")
                if found is None:
                    await cache.store(key, family_body(labels, k))
        stats = await cache.describe()
    finally:
        await cache.close()
    assert events == [f"top_k {k}: {event}" for k in range(1, TOP_K_MAX + 1) for event in ("miss", "hit")]
    assert stats["invalid"] == 0 and stats["hits"] == TOP_K_MAX and stats["misses"] == TOP_K_MAX


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_an_entry_larger_than_a_read_accepts_is_never_written(kind: str, request, caplog) -> None:
    """A model stored outside the build's bounds (labels of 1,000 characters): its answers are not stored, as a
    read would refuse them, and the cache says so: counted in too_large, logged once."""
    labels = [f"{i:02d}" + "中" * 998 for i in range(20)]
    expected = Expected("onnx", LONG_TAG, 20, "random-init", ENGINE, labels)
    cache = signed_cache(kind, request, hmac_key="")
    try:
        with caplog.at_level("WARNING", logger="fastinfer.cache"):
            events = []
            for _ in range(3):
                events.append((await cache.lookup(KEY, expected))[1])
                await cache.store(KEY, family_body(labels, 20))
        written = KEY in cache._data if isinstance(cache, MemoryCache) else bool(await cache.client.exists(KEY))
        stats = await cache.describe()
    finally:
        await cache.close()
    assert events == ["miss"] * 3 and not written
    assert stats["too_large"] == 3 and stats["invalid"] == 0 and stats["healthy"] is True
    told = [r.getMessage() for r in caplog.records if "not stored" in r.getMessage()]
    assert len(told) == 1 and f"{MAX_ENTRY_BYTES:,} bytes a read accepts" in told[0], told


# --- the password never shown -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret-pw@fastinfer-redis:6379/0", "redis://fastinfer-redis:6379/0"),
        ("rediss://user:s3cret-pw@cache.example:6380/2", "rediss://cache.example:6380/2"),
        ("redis://cache.example:6379/0?password=s3cret-pw", "redis://cache.example:6379/0"),
        ("redis://:p%40ss%3As3cret-pw@host:6379/0", "redis://host:6379/0"),
        ("unix://:s3cret-pw@/run/redis.sock?db=1", "unix:///run/redis.sock"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_a_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_the_password_is_in_no_mode_message_or_log(own_redis: RedisServer, caplog) -> None:
    admin = redis.Redis.from_url(own_redis.url)
    admin.config_set("requirepass", "s3cret-pw")
    admin.close()
    host = own_redis.url.split("//")[1]
    described = []
    with caplog.at_level("WARNING", logger="fastinfer.cache"):
        for password in ("wrong-s3cret-pw", "s3cret-pw"):
            cache = await open_cache("redis", f"redis://:{password}@{host}", 60, 0.5, 10)
            await cache.store(KEY, body())
            described.append({**await cache.describe(), "event": (await lookup(cache))[1]})
            await cache.close()
    wrong, right = described
    assert wrong["event"] == "error" and "AuthenticationError" in wrong["degraded"]
    assert right["event"] == "hit" and right["healthy"] is True
    shown = json.dumps([wrong, right]) + caplog.text
    assert "s3cret" not in shown and f"redis (redis://{host})" in shown


# --- the settings -------------------------------------------------------------------------------

CACHE_SECRETS = (
    "REDIS_URL",
    "FASTINFER_REDIS_PASSWORD",
    "FASTINFER_REDIS_PASSWORD_FILE",
    "FASTINFER_CACHE_HMAC_KEY",
    "FASTINFER_CACHE_HMAC_KEY_FILE",
)


def settings_with(monkeypatch, **env: str) -> config.Settings:
    return settings(monkeypatch, *CACHE_SECRETS, **env)


def test_the_redis_password_comes_from_a_secret_into_the_url(monkeypatch, tmp_path) -> None:
    from redis.asyncio.connection import parse_url

    password = "p@ss:w/rd?#%& é"  # anything a secret generator or a person may use
    secret = tmp_path / "redis_password"
    secret.write_text(password + "\n")
    for env in (
        {"FASTINFER_REDIS_PASSWORD": password},
        {"FASTINFER_REDIS_PASSWORD_FILE": str(secret)},
    ):
        settings = settings_with(monkeypatch, REDIS_URL="redis://fastinfer-redis:6379/0", **env)
        assert parse_url(settings.redis_url) == {"host": "fastinfer-redis", "port": 6379, "db": 0, "password": password}
        assert password not in repr(settings) and "fastinfer-redis" not in repr(settings)  # repr=False
    user = settings_with(monkeypatch, REDIS_URL="redis://app@h:6379/1", FASTINFER_REDIS_PASSWORD="pw")
    assert parse_url(user.redis_url)["username"] == "app" and parse_url(user.redis_url)["password"] == "pw"
    unset = config.Settings.model_fields["redis_url"].default
    assert settings_with(monkeypatch).redis_url == unset  # none: the URL as given


@pytest.mark.parametrize("url", ["redis://:inurl@h:6379/0", "redis://h:6379/0?password=inurl"])
def test_a_password_in_two_places_stops_start_up(monkeypatch, url: str) -> None:
    with pytest.raises(ValueError, match="give it in one place") as caught:
        settings_with(monkeypatch, REDIS_URL=url, FASTINFER_REDIS_PASSWORD="other")
    assert "inurl" not in str(caught.value) and "other" not in str(caught.value)


def test_the_signing_key_comes_from_the_variable_or_a_secret_file(monkeypatch, tmp_path) -> None:
    assert settings_with(monkeypatch).cache_hmac_key == ""
    settings = settings_with(monkeypatch, FASTINFER_CACHE_HMAC_KEY=HMAC_KEY)
    assert settings.cache_hmac_key == HMAC_KEY and HMAC_KEY not in repr(settings)
    secret = tmp_path / "hmac"
    secret.write_text(HMAC_KEY + "\n")
    settings = settings_with(monkeypatch, FASTINFER_CACHE_HMAC_KEY_FILE=str(secret))
    assert settings.cache_hmac_key == HMAC_KEY
    with pytest.raises(ValueError, match="shorter than 32") as caught:
        settings_with(monkeypatch, FASTINFER_CACHE_HMAC_KEY="short-key")
    assert "short-key" not in str(caught.value)
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="is empty"):  # set means meant: no silent unsigned cache
        settings_with(monkeypatch, FASTINFER_CACHE_HMAC_KEY_FILE=str(tmp_path / "empty"))
