"""End to end through a real ``bentoml serve``: typed APIs, seed routes, /backends, readiness, docs."""

from __future__ import annotations

from pathlib import Path

import bentoml
import httpx

from fastinfer import photos
from fastinfer.config import BACKENDS

SEED_KEYS = {"class", "confidence", "latency_ms", "model"}
STAGES = {"read", "decode", "preprocess", "inference", "total"}


def photo_file(tmp_path: Path) -> Path:
    path = tmp_path / "motorcycle.jpg"
    path.write_bytes(photos.benchmark_photo())
    return path


def test_classify_through_the_python_client(server, tmp_path) -> None:
    with bentoml.SyncHTTPClient(server.url) as client:
        result = client.classify(image=photo_file(tmp_path), backend="onnx", top_k=3)
    result = result if isinstance(result, dict) else result.model_dump(by_alias=True)
    assert result["backend"] == "onnx"
    assert result["weights"] == "random-init"
    assert len(result["top_k"]) == 3
    assert result["class"] == result["top_k"][0]["label"]


def test_classify_raw_multipart_every_backend(client, tmp_path) -> None:
    for backend in BACKENDS:
        r = client.post(
            "/classify", files={"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}, data={"backend": backend}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body.keys() >= SEED_KEYS
        assert body["backend"] == backend and body["model"].startswith(f"resnet50-{backend}:")
        assert body["cached"] is False
        assert set(body["timings_ms"]) == STAGES
        t = body["timings_ms"]
        assert 0 < t["inference"] < t["total"]
        assert t["read"] + t["decode"] + t["preprocess"] + t["inference"] <= t["total"] + 0.01
        assert len(body["top_k"]) == 5
        scores = [p["score"] for p in body["top_k"]]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


def test_seed_routes_agree_on_top1(client) -> None:
    files = {"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}
    torch_answer = client.post("/predict", files=files).json()
    onnx_answer = client.post("/predict/onnx", files=files).json()
    assert torch_answer.keys() >= SEED_KEYS and onnx_answer.keys() >= SEED_KEYS
    assert torch_answer["backend"] == "pytorch" and onnx_answer["backend"] == "onnx"
    assert torch_answer["class"] == onnx_answer["class"]
    assert abs(torch_answer["confidence"] - onnx_answer["confidence"]) < 1e-3


def test_backends_describes_each_backend(client) -> None:
    body = client.get("/backends").json()
    assert body["default"] in BACKENDS
    by_name = {b["name"]: b for b in body["backends"]}
    assert set(by_name) == set(BACKENDS)
    for name, info in by_name.items():
        assert info["available"] is True and info["reason"] is None
        assert info["model"].startswith(f"resnet50-{name}:") and info["weights"] == "random-init"
        assert info["batching"]["max_batch_size"] >= 1
    assert by_name["pytorch"]["runs_on"]["device"] == "cpu"
    assert by_name["onnx"]["runs_on"]["execution_providers"] == ["CPUExecutionProvider"]


def test_readiness_and_swagger(client) -> None:
    assert client.get("/readyz").status_code == 200
    assert client.get("/livez").status_code == 200
    assert "swagger" in client.get("/").text.lower()
    spec = client.get("/docs.json").json()
    for route in ("/classify", "/predict", "/predict/onnx"):
        assert "post" in spec["paths"][route], route
    schema = spec["components"]["schemas"]
    assert any("top_k" in s.get("properties", {}) for s in schema.values())


def test_typed_backend_enum_in_schema(client) -> None:
    spec = client.get("/docs.json").json()
    text = httpx.Response(200, json=spec).text
    for name in BACKENDS:
        assert f'"{name}"' in text
