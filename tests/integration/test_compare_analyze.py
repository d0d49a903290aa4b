"""/compare through every backend, and /analyze against a fake Groq on loopback."""

from __future__ import annotations

import time

from fastinfer.catalog.config import BACKENDS
from fastinfer.common import hardware
from fastinfer.measure import photos
from tests.fake_groq import ANSWER
from tests.servers import GROQ_KEY

HERE = [b for b in BACKENDS if hardware.is_macos() or not b.startswith("coreml")]


def test_compare_runs_every_available_backend(client) -> None:
    r = client.post("/compare", files={"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}, data={"top_k": "3"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["backend"] for x in body["results"]] == HERE
    assert all(x["cached"] is False and len(x["top_k"]) == 3 for x in body["results"])
    decodes = {x["timings_ms"]["decode"] for x in body["results"]}
    assert len(decodes) == 1  # decoded once, shared
    summary = body["summary"]
    fastest = min(body["results"], key=lambda x: x["timings_ms"]["total"])["backend"]
    assert summary["fastest"] == fastest
    assert summary["all_agree_top1"] == (len({x["class"] for x in body["results"]}) == 1)
    assert set(summary["unavailable"]) == set(BACKENDS) - set(HERE)


def test_compare_rejects_bad_input(client) -> None:
    r = client.post("/compare", files={"image": ("x.jpg", b"nope", "image/jpeg")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"


def results(client) -> list[dict]:
    r = client.post("/classify", files={"image": ("m.jpg", photos.photo_jpeg("chelsea.png"), "image/jpeg")})
    return [r.json()]


def test_analyze_sends_results_not_images(client, fake_groq, server) -> None:
    sent = results(client)
    sent[0]["image_base64"] = "QUJD" * 1000  # a client may send junk along: it must not travel
    fake_groq.requests.clear()
    r = client.post("/analyze", json={"results": sent, "question": "Which backend should I use?"})
    assert r.status_code == 200, r.text
    assert r.json() == {"text": ANSWER, "model": "llama-3.1-8b-instant"}
    (request,) = fake_groq.requests
    assert request["path"] == "/openai/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {GROQ_KEY}"
    payload = request["json"]
    assert payload["model"] == "llama-3.1-8b-instant"
    user = payload["messages"][-1]["content"]
    assert sent[0]["class"] in user and sent[0]["backend"] in user and "Which backend" in user
    assert "QUJD" not in str(payload) and "image_base64" not in str(payload)
    assert GROQ_KEY not in r.text and GROQ_KEY not in server.log.read_text(errors="replace")


def test_analyze_groq_error_is_502(client, fake_groq) -> None:
    fake_groq.mode = "error"
    r = client.post("/analyze", json={"results": results(client)})
    assert r.status_code == 502 and r.json()["error"]["code"] == "analysis_failed"
    assert GROQ_KEY not in r.text


def test_analyze_groq_timeout_is_504_within_bounded_time(client, fake_groq) -> None:
    fake_groq.mode = "slow"
    t0 = time.perf_counter()
    r = client.post("/analyze", json={"results": results(client)})
    assert r.status_code == 504 and r.json()["error"]["code"] == "analysis_timeout"
    assert time.perf_counter() - t0 < 4  # FASTINFER_GROQ_TIMEOUT_S=2 for the test server
