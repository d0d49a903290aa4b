"""Overload answers 429 at once (never 5xx), and the Prometheus counters move by exactly N."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from tests import images
from tests.servers import NO_CACHE, SERVER_ENV


def test_far_more_clients_than_max_concurrency(server, client) -> None:
    limit = int(SERVER_ENV["FASTINFER_MAX_CONCURRENCY"])
    data = images.photo_jpeg(width=800)

    async def one(c: httpx.AsyncClient) -> tuple[int, float, dict]:
        t0 = time.perf_counter()
        r = await c.post(
            "/classify", files={"image": ("p.jpg", data, "image/jpeg")}, data={"backend": "pytorch"}, headers=NO_CACHE
        )
        return r.status_code, time.perf_counter() - t0, r.json()

    async def burst() -> list[tuple[int, float, dict]]:
        limits = httpx.Limits(max_connections=limit * 6)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as c:
            return await asyncio.gather(*(one(c) for _ in range(limit * 6)))

    results = asyncio.run(burst())
    statuses = [s for s, _, _ in results]
    assert set(statuses) <= {200, 429}, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) > 0 and statuses.count(200) >= limit
    refused = [(t, body) for s, t, body in results if s == 429]
    assert all(body["error"]["code"] == "overloaded" for _, body in refused)
    assert max(t for t, _ in refused) < 5  # refused at once, not after queueing
    latencies = sorted(t for _, t, _ in results)
    assert latencies[int(0.99 * (len(latencies) - 1))] < 30  # bounded by the request timeout
    assert client.get("/readyz").status_code == 200
    assert client.post("/classify", files={"image": ("p.jpg", data, "image/jpeg")}).status_code == 200


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{") : line.index("}")]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_counters_move_by_exactly_n(client) -> None:
    n = 5
    before = client.get("/metrics").text
    for _ in range(n):
        r = client.post(
            "/classify",
            files={"image": ("p.jpg", images.photo_jpeg(), "image/jpeg")},
            data={"backend": "onnx-int8"},
            headers=NO_CACHE,
        )
        assert r.status_code == 200
    bad = client.post("/classify", files={"image": ("p.jpg", b"junk", "image/jpeg")}, data={"backend": "onnx-int8"})
    assert bad.status_code == 400
    after = client.get("/metrics").text

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    route = {"route": "/classify", "backend": "onnx-int8"}
    assert delta("fastinfer_requests_total", **route, status="200") == n
    assert delta("fastinfer_requests_total", **route, status="400") == 1
    for stage in ("read", "decode", "preprocess", "inference", "total"):
        assert delta("fastinfer_stage_seconds_count", stage=stage, backend="onnx-int8") == n, stage
    assert delta("fastinfer_cache_events_total", event="bypass") == n
    assert delta("fastinfer_batch_size_count", backend="onnx-int8") == n
    # BentoML counts the front's requests; the runners' calls only where its configuration says (per runner).
    requests = [line for line in after.splitlines() if line.startswith("bentoml_service_request_total{")]
    assert any('service_name="fastinfer"' in line for line in requests), requests[:5]
    assert not [line for line in requests if 'service_name="runner-' in line]
