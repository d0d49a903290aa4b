"""End to end through a real ``bentoml serve``: typed APIs, the original FastInfer API's routes, /backends,
readiness, docs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import bentoml

from fastinfer.catalog.config import BACKENDS
from fastinfer.common import hardware
from fastinfer.measure import photos
from tests.servers import NO_CACHE

HERE = [b for b in BACKENDS if hardware.is_macos() or not b.startswith("coreml")]
ELSEWHERE = [b for b in BACKENDS if b not in HERE]

# The keys the original FastInfer API answered with (its FastAPI release): its clients read them.
ORIGINAL_KEYS = {"class", "confidence", "latency_ms", "model"}
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
        assert body.keys() >= ORIGINAL_KEYS
        assert body["backend"] == backend and body["model"].startswith(f"resnet50-{backend}:")
        assert body["cached"] is False
        assert set(body["timings_ms"]) == STAGES | {"cache"}
        t = body["timings_ms"]
        assert 0 < t["inference"] < t["total"]
        assert t["read"] + t["decode"] + t["preprocess"] + t["inference"] <= t["total"] + 0.01
        assert len(body["top_k"]) == 5
        scores = [p["score"] for p in body["top_k"]]
        assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


def test_the_original_routes_agree_on_top1(client) -> None:
    files = {"image": ("m.jpg", photos.benchmark_photo(), "image/jpeg")}
    torch_answer = client.post("/predict", files=files, headers=NO_CACHE).json()
    onnx_answer = client.post("/predict/onnx", files=files, headers=NO_CACHE).json()
    assert torch_answer.keys() >= ORIGINAL_KEYS and onnx_answer.keys() >= ORIGINAL_KEYS
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


# The original FastInfer API's routes, kept so its clients work unchanged, and our /predict/openvino
# beside them in the same form.
PREDICT_ROUTES = {
    "/predict": "pytorch",
    "/predict/onnx": "onnx",
    "/predict/quantized": "onnx-int8",
    "/predict/openvino": "openvino",
    "/predict/batched": "pytorch",
    "/predict/coreml": "coreml",
    "/predict/batched/coreml": "coreml-batched",
}


def test_readiness_and_swagger(client) -> None:
    assert client.get("/readyz").status_code == 200
    assert client.get("/livez").status_code == 200
    assert "swagger" in client.get("/").text.lower()
    spec = client.get("/docs.json").json()
    for route in ("/classify", "/predict/openvino", *PREDICT_ROUTES):
        assert "post" in spec["paths"][route], route
    schema = spec["components"]["schemas"]
    assert any("top_k" in s.get("properties", {}) for s in schema.values())
    assert all(f'"{name}"' in json.dumps(spec) for name in BACKENDS)  # the typed backend enum


def test_the_original_apis_curl_examples_work_unchanged(client, tmp_path) -> None:
    """`curl -F "file=@image.jpg" .../predict/coreml`, from the original FastInfer README: the field
    is `file`, and the answer carries its keys; a backend that cannot run here is a clear 503."""
    photo = photo_file(tmp_path)
    for route, backend in PREDICT_ROUTES.items():
        done = subprocess.run(
            ["curl", "-s", "-w", "\\n%{http_code}", "-F", f"file=@{photo}", f"{client.base_url}{route}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        body, status = done.stdout.rsplit("\n", 1)
        if backend in HERE:
            assert status == "200", (route, body)
            answer = json.loads(body)
            assert answer.keys() >= ORIGINAL_KEYS and answer["backend"] == backend
        else:
            error = json.loads(body)["error"]
            assert status == "503" and error["code"] == "backend_unavailable" and "needs macOS" in error["message"]


def test_a_raw_image_body_with_query_parameters(client) -> None:
    data = photos.benchmark_photo()
    raw = client.post(
        "/classify",
        content=data,
        params={"backend": "onnx-int8", "top_k": "2"},
        headers={"Content-Type": "image/jpeg", **NO_CACHE},
    )
    form = client.post(
        "/classify", files={"image": ("m.jpg", data, "image/jpeg")}, data={"backend": "onnx-int8"}, headers=NO_CACHE
    )
    assert raw.status_code == 200 and form.status_code == 200, (raw.text, form.text)
    assert raw.json()["backend"] == "onnx-int8" and len(raw.json()["top_k"]) == 2
    assert raw.json()["top_k"] == form.json()["top_k"][:2]  # same image, same answer, whatever the form
    original = client.post("/predict/quantized", content=data, headers={"Content-Type": "image/jpeg"})
    assert original.status_code == 200 and original.json()["backend"] == "onnx-int8"


def test_a_batch_is_answered_in_order_with_an_error_in_the_bad_images_slot(client) -> None:
    pool = [data for _, data in photos.benchmark_pool()[:6]]
    files = [("images", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(pool[:3])]
    files.insert(1, ("images", ("notes.txt", b"not an image", "text/plain")))
    r = client.post("/classify/batch", files=files, data={"backend": "onnx-int8", "top_k": "3"}, headers=NO_CACHE)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 4 and results[1]["error"]["code"] == "invalid_image"
    singles = [
        client.post("/classify", files={"image": ("x.jpg", d, "image/jpeg")}, data={"backend": "onnx-int8"},
                    headers=NO_CACHE).json()
        for d in pool[:3]
    ]  # fmt: skip
    for got, single in zip([results[0], results[2], results[3]], singles, strict=True):
        assert got["backend"] == "onnx-int8" and got["cached"] is False
        assert [p["index"] for p in got["top_k"]] == [p["index"] for p in single["top_k"][:3]]
        assert abs(got["confidence"] - single["confidence"]) < 1e-3  # one batch = the same answers
    # All bad: still 200, each slot says why (documented). Too many: 400 at this server's default limit (the
    # setting's wiring into the front's lane; the parsing itself: tests/unit/test_image_api.py::test_batch_limits).
    bad = client.post("/classify/batch", files=[("images", ("a", b"x")), ("images", ("b", b""))])
    assert bad.status_code == 200 and [x["error"]["code"] for x in bad.json()["results"]] == ["invalid_image"] * 2
    many = [("images", (f"{i}.jpg", b"x", "image/jpeg")) for i in range(33)]
    assert (
        client.post("/classify/batch", files=many)
        .json()["error"]["message"]
        .endswith("the limit is 32 (FASTINFER_MAX_BATCH_IMAGES).")
    )


def test_a_batch_uses_the_cache_per_image_and_the_python_client(server, client, tmp_path) -> None:
    first, second = (tmp_path / "a.jpg", tmp_path / "b.jpg")
    first.write_bytes(photos.benchmark_pool()[7][1])
    second.write_bytes(photos.benchmark_pool()[8][1])
    single = {"backend": "onnx", "top_k": "1"}  # the cache key covers backend, model, top_k and the bytes
    client.post("/classify", files={"image": ("a.jpg", first.read_bytes(), "image/jpeg")}, data=single)
    bad = tmp_path / "notes.jpg"
    bad.write_bytes(b"not an image")
    with bentoml.SyncHTTPClient(server.url) as python_client:
        answer = python_client.classify_batch(images=[first, second, bad], backend="onnx", top_k=1)
    results = answer["results"]
    assert [r.get("cached") for r in results] == [True, False, None]
    assert all(r["backend"] == "onnx" and len(r["top_k"]) == 1 for r in results[:2])
    assert results[2]["error"]["code"] == "invalid_image"  # the client hands the per-image error through
