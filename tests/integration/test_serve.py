"""End to end through a real ``bentoml serve``: typed APIs, seed routes, /backends, readiness, docs."""

from __future__ import annotations

from pathlib import Path

import bentoml
import httpx

from fastinfer import hardware, photos
from fastinfer.config import BACKENDS
from tests.servers import NO_CACHE

HERE = [b for b in BACKENDS if hardware.is_macos() or not b.startswith("coreml")]
ELSEWHERE = [b for b in BACKENDS if b not in HERE]

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
    for backend in HERE:
        r = client.post(
            "/classify",
            files={"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")},
            data={"backend": backend},
            headers=NO_CACHE,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body.keys() >= SEED_KEYS
        assert body["backend"] == backend and body["model"].startswith(f"resnet50-{backend}:")
        assert body["cached"] is False
        assert set(body["timings_ms"]) == STAGES | {"cache"}
        t = body["timings_ms"]
        assert 0 < t["inference"] < t["total"]
        assert t["read"] + t["decode"] + t["preprocess"] + t["inference"] <= t["total"] + 0.01
        assert len(body["top_k"]) == 5
        scores = [p["score"] for p in body["top_k"]]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


def test_seed_routes_agree_on_top1(client) -> None:
    files = {"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}
    torch_answer = client.post("/predict", files=files, headers=NO_CACHE).json()
    onnx_answer = client.post("/predict/onnx", files=files, headers=NO_CACHE).json()
    assert torch_answer.keys() >= SEED_KEYS and onnx_answer.keys() >= SEED_KEYS
    assert torch_answer["backend"] == "pytorch" and onnx_answer["backend"] == "onnx"
    assert torch_answer["class"] == onnx_answer["class"]
    assert abs(torch_answer["confidence"] - onnx_answer["confidence"]) < 1e-3


def test_backends_describes_each_backend(client) -> None:
    body = client.get("/backends").json()
    assert body["default"] in BACKENDS
    assert body["recommended"]["backend"] in HERE and body["recommended"]["why"]
    assert body["hardware"]["cores"] >= 1 and isinstance(body["hardware"]["isa"], list)
    by_name = {b["name"]: b for b in body["backends"]}
    assert set(by_name) == set(BACKENDS)
    for name in HERE:
        info = by_name[name]
        assert info["available"] is True and info["reason"] is None, info
        assert info["model"].startswith("resnet50-") and info["weights"] == "random-init"
        assert info["batching"]["max_batch_size"] >= 1
    for name in ELSEWHERE:
        info = by_name[name]
        assert info["available"] is False and "needs macOS" in info["reason"]
        assert info["model"].startswith("resnet50-coreml-b1:")  # built and stored all the same
    assert by_name["pytorch"]["runs_on"]["device"] == "cpu"
    onnx = by_name["onnx"]["runs_on"]
    assert onnx["execution_providers"] == ["CPUExecutionProvider"] and onnx["fallbacks"] == []
    total = onnx["node_placement"]["CPUExecutionProvider"]
    assert total.endswith("nodes") and total.split("/")[0] == total.split("/")[1].split()[0]
    # OpenVINO: the precision actually used, and every convolution counted at it (no silent FP32).
    openvino = by_name["openvino"]["runs_on"]
    bf16 = "avx512_bf16" in body["hardware"]["isa"] or "amx_bf16" in body["hardware"]["isa"]
    assert openvino["precision_requested"] == "auto" and openvino["precision"] == ("bf16" if bf16 else "f32")
    assert openvino["layer_precision"]["Convolution"] == f"{openvino['precision']} 53/53", openvino
    assert openvino["fallbacks"] == [] and openvino["cache_dir"]
    int8 = by_name["openvino-int8"]["runs_on"]
    (placed,) = [int8["layer_precision"]["Convolution"]]
    assert placed.split()[0] in ("u8", "i8") and placed.endswith(" 53/53") and int8["fallbacks"] == [], int8


SEED_ROUTES = {
    "/predict": "pytorch",
    "/predict/onnx": "onnx",
    "/predict/quantized": "onnx-int8",
    "/predict/batched": "pytorch",
    "/predict/coreml": "coreml",
    "/predict/batched/coreml": "coreml-batched",
}


def test_every_seed_route_answers_a_prediction_or_a_clear_503(client) -> None:
    files = {"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}
    for route, backend in SEED_ROUTES.items():
        r = client.post(route, files=files)
        if backend in HERE:
            assert r.status_code == 200, (route, r.text)
            assert r.json()["backend"] == backend
        else:
            assert r.status_code == 503, (route, r.text)
            assert r.json()["error"]["code"] == "backend_unavailable"
            assert "needs macOS" in r.json()["error"]["message"]


def test_readiness_and_swagger(client) -> None:
    assert client.get("/readyz").status_code == 200
    assert client.get("/livez").status_code == 200
    assert "swagger" in client.get("/").text.lower()
    spec = client.get("/docs.json").json()
    for route in ("/classify", "/predict/openvino", *SEED_ROUTES):
        assert "post" in spec["paths"][route], route
    schema = spec["components"]["schemas"]
    assert any("top_k" in s.get("properties", {}) for s in schema.values())


def test_typed_backend_enum_in_schema(client) -> None:
    spec = client.get("/docs.json").json()
    text = httpx.Response(200, json=spec).text
    for name in BACKENDS:
        assert f'"{name}"' in text
