"""Concurrent clients through front and runner: every request answered, none lost.

More than 100 requests on purpose: BentoML's runner client recycles its HTTP session every
100 requests by default and kills what is in flight ("Server disconnected"); runners.base
configures it not to (runner_connection).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests import images
from tests.servers import NO_CACHE

CLIENTS, PER_CLIENT = 10, 15


def test_ten_clients_lose_nothing(server) -> None:
    """150 requests through one runner client, 10 at a time."""
    data = images.photo_jpeg(width=1500)

    def client_run(i: int) -> list[int]:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return [
                client.post(
                    "/classify",
                    files={"image": ("p.jpg", data, "image/jpeg")},
                    data={"backend": "onnx"},
                    headers=NO_CACHE,
                ).status_code
                for _ in range(PER_CLIENT)
            ]

    with ThreadPoolExecutor(CLIENTS) as pool:
        statuses = [s for batch in pool.map(client_run, range(CLIENTS)) for s in batch]
    assert statuses.count(200) == CLIENTS * PER_CLIENT, {s: statuses.count(s) for s in set(statuses)}
    log = server.log.read_text(errors="replace")
    assert "Server disconnected" not in log
    # The front logs each request; the runners' hop is not logged again (docs/metrics.md#runner-telemetry).
    assert "path=/classify," in log and "path=/infer" not in log
    assert "BentoML's configuration adds them: docs/metrics.md#runner-telemetry" in log  # and the operator is told
