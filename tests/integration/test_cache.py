"""The response cache through a real server and a real redis-server."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from fastinfer import photos
from fastinfer.cache import BODY_KEYS, CACHE_FORMAT, cache_key
from tests.servers import NO_CACHE

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


def model_tag(client: httpx.Client, backend: str) -> str:
    return next(b["model"] for b in client.get("/backends").json()["backends"] if b["name"] == backend)


def prediction(answer: dict) -> dict:
    """What the model said, but the scores (compared with a tolerance)."""
    ranked = [(p["label"], p["index"]) for p in answer["top_k"]]
    return {"ranked": ranked, **{k: answer[k] for k in ("class", "class_index", "backend", "model", "weights")}}


def scores(answer: dict) -> list[float]:
    return [p["score"] for p in answer["top_k"]]


def entry(body: dict) -> str:
    return json.dumps({"v": CACHE_FORMAT, "body": body})


# A few kinds of bad entry, each built from the true body; tests/unit/test_cache.py tries them all.
GARBAGE = {
    "not JSON": lambda body: b"\x00{not json",
    "bare body (another version's shape)": lambda body: json.dumps(body),
    "top_k shorter than asked": lambda body: entry({**body, "top_k": body["top_k"][:3]}),
    "another backend than the key": lambda body: entry({**body, "backend": "pytorch"}),
    "a wrong type": lambda body: entry({**body, "class_index": "seven"}),
}


@pytest.mark.parametrize("kind", GARBAGE)
def test_a_bad_entry_in_redis_is_recomputed_and_overwritten(client, redis_server, kind: str) -> None:
    data = unique_jpeg()
    truth = client.post(
        "/classify", files={"image": ("p.jpg", data, "image/jpeg")}, data={"backend": "onnx"}, headers=NO_CACHE
    ).json()
    body = {k: v for k, v in truth.items() if k in BODY_KEYS}
    key = cache_key(data, "onnx", model_tag(client, "onnx"), 5)  # the key the next request reads
    with redis.Redis.from_url(redis_server.url) as r:
        r.set(key, GARBAGE[kind](body), ex=600)
    before = client.get("/cache/stats").json()

    first = classify(client, data, backend="onnx", top_k="5")
    after = client.get("/cache/stats").json()
    assert first["cached"] is False and first["timings_ms"]["inference"] > 0
    assert prediction(first) == prediction(truth)  # the model's answer, not the entry's
    assert scores(first) == pytest.approx(scores(truth), abs=1e-4)
    assert after["errors"] == before["errors"] and after["healthy"] is True  # no breaker trip
    assert after["invalid"] == before["invalid"] + 1 and after["misses"] == before["misses"] + 1

    second = classify(client, data, backend="onnx", top_k="5")
    assert second["cached"] is True  # the entry was overwritten
    assert prediction(second) == prediction(first) and scores(second) == scores(first)
    assert 'fastinfer_cache_events_total{event="invalid"}' in client.get("/metrics").text


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
