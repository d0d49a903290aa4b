"""The response cache through a real server and a real redis-server: hits and what makes another key,
the bypass header, Redis dying under load and coming back, and a Redis behind a password with signed
entries (a forged entry recomputed, counted invalid and overwritten)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from fastinfer.measure import photos
from fastinfer.serving.cache import BODY_KEYS, cache_key, encode_entry, entry_mac
from tests.servers import API_KEYS, HMAC_KEY, NO_CACHE, REDIS_PASSWORD

_unique = itertools.count(1)


def unique_jpeg() -> bytes:
    """A real photo whose bytes no other test sent (different quality/size → different sha256)."""
    n = next(_unique)
    return photos.photo_jpeg(photos.PHOTOS[n % len(photos.PHOTOS)], width=300 + n, quality=80)


def classify(client: httpx.Client, data: bytes, **form: str) -> dict:
    r = client.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")}, data=form)
    assert r.status_code == 200, r.text
    return r.json()


def test_miss_then_hit_and_what_makes_another_key(client) -> None:
    data = unique_jpeg()
    first = classify(client, data, backend="onnx", top_k="5")
    second = classify(client, data, backend="onnx", top_k="5")
    assert first["cached"] is False and second["cached"] is True
    assert {k: v for k, v in second.items() if k not in ("cached", "timings_ms", "latency_ms")} == {
        k: v for k, v in first.items() if k not in ("cached", "timings_ms", "latency_ms")
    }
    hit = second["timings_ms"]
    assert hit["decode"] == hit["inference"] == 0 and hit["total"] > 0  # no decode, no inference
    assert classify(client, data, backend="pytorch", top_k="5")["cached"] is False  # another backend
    assert classify(client, data, backend="onnx", top_k="3")["cached"] is False  # another top_k
    assert classify(client, data, backend="onnx", top_k="3")["cached"] is True


def test_bypass_header_measures_inference_not_hits(client) -> None:
    data = unique_jpeg()
    classify(client, data)
    r = client.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")}, headers=NO_CACHE)
    assert r.json()["cached"] is False and r.json()["timings_ms"]["inference"] > 0
    assert client.get("/cache/stats").json()["bypasses"] >= 1


def scans(r: redis.Redis) -> int:
    return r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)


def test_cache_stats(client, redis_server) -> None:
    with redis.Redis.from_url(redis_server.url) as r:
        before = scans(r)
        stats = client.get("/cache/stats").json()
        live = client.get("/stats/live").json()["cache"]
        assert scans(r) == before  # the key count is maintained on SET, not counted by a SCAN per poll
    assert stats["mode"].startswith("redis") and stats["healthy"] is True
    assert {"hits", "misses", "errors", "invalid", "bypasses", "hit_rate", "keys", "since"} <= stats.keys()
    assert stats["keys"] >= 1 and 0 <= stats["hit_rate"] <= 1
    assert live["keys"] == stats["keys"]


def prediction(answer: dict) -> dict:
    """What the model said, but the scores (compared with a tolerance)."""
    ranked = [(p["label"], p["index"]) for p in answer["top_k"]]
    return {"ranked": ranked, **{k: answer[k] for k in ("class", "class_index", "backend", "model", "weights")}}


def test_redis_dies_under_load_and_comes_back(server, redis_server, client) -> None:
    pool = [unique_jpeg() for _ in range(6)]
    statuses: list[int] = []
    stop = threading.Event()

    def load(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            while not stop.is_set():
                data = pool[(i + len(statuses)) % len(pool)]
                r = c.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")}, data={"backend": "onnx-int8"})
                statuses.append(r.status_code)

    with ThreadPoolExecutor(10) as clients:
        for i in range(10):
            clients.submit(load, i)
        time.sleep(3)
        redis_server.stop()  # killed, mid-load
        time.sleep(4)
        stop.set()
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    stats = client.get("/cache/stats").json()
    assert stats["healthy"] is False and stats["errors"] > 0 and "redis" in stats["degraded"]

    redis_server.start()  # back, empty
    data = unique_jpeg()
    deadline = time.monotonic() + 10
    while classify(client, data)["cached"] is False and time.monotonic() < deadline:
        time.sleep(0.3)  # the breaker retries Redis about once a second
    assert classify(client, data)["cached"] is True
    assert client.get("/cache/stats").json()["healthy"] is True


# --- Redis behind a password, entries signed ------------------------------------------------------


def test_a_signed_cache_behind_a_password(locked_server, locked_redis) -> None:
    """On the server as deploy/k8s runs it (tests/servers.py): the Redis password and the signing key from
    secret files."""
    admin = redis.Redis.from_url(locked_redis.url, password=REDIS_PASSWORD)
    key_header = {"Authorization": f"Bearer {API_KEYS[0]}"}
    with httpx.Client(base_url=locked_server.url, timeout=60, headers=key_header) as c:
        # The session's server: other tests' traffic is in its counters (the bench's 10 clients, timed-out lookups).
        start = c.get("/cache/stats").json()
        data, other = unique_jpeg(), unique_jpeg()
        truth = classify(c, data)
        assert truth["cached"] is False and classify(c, data)["cached"] is True  # through the password
        stats = c.get("/cache/stats").json()
        assert stats["signed"] is True and stats["healthy"] is True and stats["keys"] >= 1
        key = cache_key(data, "onnx", truth["model"], 5, truth["engine"])
        stored = admin.get(key)
        body = json.loads(stored)["body"]
        assert stored.decode() == encode_entry(body, key, HMAC_KEY.encode())  # signed with the server's key
        assert json.loads(stored)["mac"] == entry_mac(HMAC_KEY.encode(), key, json.dumps(body))

        # Anyone who can write to Redis writes another photo's answer under this photo's key: a
        # consistent entry (same model, labels that fit their classes), unsigned or signed with
        # another key. It is never served: recomputed, and overwritten.
        forged = {k: v for k, v in classify(c, other).items() if k in BODY_KEYS}
        for value in (encode_entry(forged, key), encode_entry(forged, key, b"a key that is not the server's key")):
            admin.set(key, value, ex=600)
            again = classify(c, data)
            assert again["cached"] is False and prediction(again) == prediction(truth)
            assert classify(c, data)["cached"] is True
        stats = c.get("/cache/stats").json()
        assert stats["invalid"] - start["invalid"] == 2 and stats["errors"] == start["errors"], (start, stats)
        assert stats["healthy"] is True
        assert 'fastinfer_cache_events_total{event="invalid"}' in c.get("/metrics").text
    admin.close()
    shown = json.dumps(stats) + locked_server.log.read_text(errors="replace")
    assert REDIS_PASSWORD not in shown and HMAC_KEY not in shown
    assert "entries signed" in shown  # the log says the cache is signed (the key itself never)
