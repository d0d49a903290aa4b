"""The response cache through a real server and a real redis-server: hits, bad entries, Redis dying,
Redis full (writes refused, reads on), the request's cache directives, and a Redis behind a password
with signed entries."""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from fastinfer.measure import photos
from fastinfer.serving.cache import BODY_KEYS, CACHE_FORMAT, cache_key, encode_entry, entry_mac
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


def model_tag(client: httpx.Client, backend: str) -> str:
    return next(b["model"] for b in client.get("/backends").json()["backends"] if b["name"] == backend)


def prediction(answer: dict) -> dict:
    """What the model said, but the scores (compared with a tolerance)."""
    ranked = [(p["label"], p["index"]) for p in answer["top_k"]]
    return {"ranked": ranked, **{k: answer[k] for k in ("class", "class_index", "backend", "model", "weights")}}


def scores(answer: dict) -> list[float]:
    return [p["score"] for p in answer["top_k"]]


def entry(body: dict) -> str:
    return json.dumps({"v": CACHE_FORMAT, "mac": None, "body": body})


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
    key = cache_key(data, "onnx", model_tag(client, "onnx"), 5, truth["engine"])  # the key the next request reads
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


# --- the request's cache directives ------------------------------------------------------------


def post(client: httpx.Client, data: bytes, headers: dict[str, str] | None = None, path: str = "/classify") -> dict:
    r = client.post(path, files={"image": ("p.jpg", data, "image/jpeg")}, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.json()


def test_no_store_is_answered_from_the_cache_but_never_stored(client) -> None:
    """RFC 9111 §5.2.1.5: no-store forbids storing the answer; reading a stored one is allowed."""
    held = unique_jpeg()
    post(client, held)
    assert post(client, held, {"Cache-Control": "no-store"})["cached"] is True

    fresh = unique_jpeg()
    first = post(client, fresh, {"Cache-Control": "no-store"})
    assert first["cached"] is False and first["timings_ms"]["inference"] > 0
    assert post(client, fresh)["cached"] is False  # the no-store answer was not kept
    assert post(client, fresh)["cached"] is True

    batch = [unique_jpeg(), unique_jpeg()]
    files = [("images", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(batch)]
    r = client.post("/classify/batch", files=files, headers={"Cache-Control": "no-store"})
    assert r.status_code == 200 and [a["cached"] for a in r.json()["results"]] == [False, False]
    r = client.post("/classify/batch", files=files)
    assert [a["cached"] for a in r.json()["results"]] == [False, False]  # nothing was stored

    original = unique_jpeg()  # a route of the original API
    post(client, original, {"Cache-Control": "no-store"}, path="/predict/onnx")
    assert post(client, original, path="/predict/onnx")["cached"] is False


def test_pragma_no_cache_bypasses_unless_cache_control_is_there(client) -> None:
    """Pragma: no-cache is HTTP/1.0's no-cache; with a Cache-Control header it is ignored (§5.4)."""
    data = unique_jpeg()
    post(client, data)
    before = client.get("/cache/stats").json()["bypasses"]
    for path in ("/classify", "/predict/onnx"):
        answer = post(client, data, {"Pragma": "no-cache"}, path=path)
        assert answer["cached"] is False and answer["timings_ms"]["inference"] > 0, path
    assert client.get("/cache/stats").json()["bypasses"] == before + 2
    assert post(client, data, {"Pragma": "no-cache", "Cache-Control": "max-age=60"})["cached"] is True


# --- Redis full: writes refused, reads on --------------------------------------------------------


def fill_to_the_brim(admin: redis.Redis) -> list[str]:
    """Redis full the way production fills it: maxmemory with noeviction, written until it refuses
    (tests/unit/test_cache.py does the same). Returns the keys written."""
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 2_000_000)
    written = []
    for i in itertools.count():
        try:
            admin.set(f"otherapp:blob:{i}", b"x" * 20_000)
        except redis.exceptions.OutOfMemoryError:
            break
        written.append(f"otherapp:blob:{i}")
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 100_000)  # no room for a small write
    return written


def test_a_full_redis_still_answers_what_it_holds(client, redis_server) -> None:
    """With maxmemory + noeviction every SET fails with OOM. That used to open the breaker, which
    skipped the GETs too: a repeated photo was answered from the cache 0 of 656 times, while
    /cache/stats said hit_rate 0.9995. Now the repeated photo is a hit every time, new answers are
    computed and not stored, and /cache/stats says why."""
    held = unique_jpeg()
    post(client, held)
    assert post(client, held)["cached"] is True
    admin = redis.Redis.from_url(redis_server.url)
    saved = {name: admin.config_get(name)[name] for name in ("maxmemory", "maxmemory-policy")}
    before = client.get("/cache/stats").json()
    fillers: list[str] = []
    try:
        fillers = fill_to_the_brim(admin)
        held_cached, new_cached = [], []
        for _ in range(12):
            new_cached.append(post(client, unique_jpeg())["cached"])  # computed; its SET refused
            held_cached.append(post(client, held)["cached"])
        during = client.get("/cache/stats").json()
    finally:
        admin.config_set("maxmemory", saved["maxmemory"])
        admin.config_set("maxmemory-policy", saved["maxmemory-policy"])
        if fillers:
            admin.delete(*fillers)
        admin.close()
    assert held_cached == [True] * 12, held_cached
    assert new_cached == [False] * 12
    assert during["healthy"] is False and during["degraded"].startswith("writes refused: OOM "), during
    assert during["errors"] == before["errors"] and during["write_errors"] == before["write_errors"]
    assert during["writes_refused"] == before["writes_refused"] + 12
    lookups = during["hits"] + during["misses"] + during["errors"]
    assert during["hit_rate"] == round(during["hits"] / lookups, 4)

    # Room again: after the back-off (about a second) a new answer is stored and the cache is healthy.
    data = unique_jpeg()
    deadline = time.monotonic() + 10
    while post(client, data)["cached"] is False and time.monotonic() < deadline:
        time.sleep(0.3)
    assert post(client, data)["cached"] is True
    assert client.get("/cache/stats").json()["healthy"] is True


# --- Redis behind a password, entries signed ------------------------------------------------------


def test_a_signed_cache_behind_a_password(locked_server, locked_redis) -> None:
    """On the server as deploy/k8s runs it (tests/servers.py): the Redis password and the signing key from
    secret files."""
    admin = redis.Redis.from_url(locked_redis.url, password=REDIS_PASSWORD)
    key_header = {"Authorization": f"Bearer {API_KEYS[0]}"}
    with httpx.Client(base_url=locked_server.url, timeout=60, headers=key_header) as c:
        data, other = unique_jpeg(), unique_jpeg()
        truth = post(c, data)
        assert truth["cached"] is False and post(c, data)["cached"] is True  # through the password
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
        forged = {k: v for k, v in post(c, other).items() if k in BODY_KEYS}
        for value in (encode_entry(forged, key), encode_entry(forged, key, b"a key that is not the server's key")):
            admin.set(key, value, ex=600)
            again = post(c, data)
            assert again["cached"] is False and prediction(again) == prediction(truth)
            assert post(c, data)["cached"] is True
        stats = c.get("/cache/stats").json()
        assert stats["invalid"] == 2 and stats["errors"] == 0 and stats["healthy"] is True
    admin.close()
    shown = json.dumps(stats) + locked_server.log.read_text(errors="replace")
    assert REDIS_PASSWORD not in shown and HMAC_KEY not in shown
    assert "entries signed" in shown  # the log says the cache is signed (the key itself never)
