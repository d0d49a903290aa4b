"""A public deploy's protections on a real server: API keys on every data route, the open routes,
the /analyze spending guard against the fake Groq, and keys never written to the log."""

from __future__ import annotations

import json
import subprocess
import sys

import bentoml
import httpx
import pytest

from fastinfer.measure import photos
from load_tests.service import ROOT
from tests.fake_groq import ANSWER
from tests.servers import API_KEYS, GROQ_KEY, LOCKED_OFF, NO_CACHE, service_pids

GOOD = {"Authorization": f"Bearer {API_KEYS[0]}"}
OTHER = {"Authorization": f"Bearer {API_KEYS[1]}"}
BAD_HEADERS: list[dict[str, str | bytes]] = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": f"Basic {API_KEYS[0]}"},
    {"Authorization": API_KEYS[0]},
    {"Authorization": f"Bearer {API_KEYS[0]}0"},
    {"Authorization": "Bearer wrong-key-0123456789abcdef"},
    {"Authorization": "Bearer " + "x" * 6000},
    {"Authorization": "Bearer \u00e9\u00e9\u00e9".encode()},  # not ASCII: bytes, as a raw client sends them
]


@pytest.fixture(scope="module")
def locked(locked_server) -> httpx.Client:
    with httpx.Client(base_url=locked_server.url, timeout=120) as c:
        yield c


def image_requests(photo: bytes) -> list[tuple[str, str, dict]]:
    """(method, path, httpx kwargs) for every route that serves data or work."""
    return [
        ("GET", "/backends", {}),
        ("GET", "/cache/stats", {}),
        ("GET", "/stats/live", {}),
        ("POST", "/classify", {"files": {"image": ("p.jpg", photo, "image/jpeg")}, "data": {"backend": "onnx-int8"}}),
        ("POST", "/classify?backend=onnx-int8", {"content": photo, "headers": {"Content-Type": "image/jpeg"}}),
        ("POST", "/classify/batch", {"files": [("images", ("a.jpg", photo, "image/jpeg"))] * 2}),
        ("POST", "/predict/quantized", {"files": {"file": ("p.jpg", photo, "image/jpeg")}}),
        ("POST", "/compare", {"files": {"image": ("p.jpg", photo, "image/jpeg")}, "data": {"top_k": "1"}}),
    ]


def send(client: httpx.Client, method: str, path: str, kwargs: dict, auth: dict[str, str | bytes]) -> httpx.Response:
    headers = {**NO_CACHE, **kwargs.get("headers", {}), **auth}
    return client.request(method, path, **{**kwargs, "headers": headers})


def test_every_data_route_needs_a_key_and_works_with_one(locked) -> None:
    photo = photos.benchmark_photo()
    for method, path, kwargs in image_requests(photo):
        for bad in BAD_HEADERS:
            r = send(locked, method, path, kwargs, bad)
            assert r.status_code == 401, (path, str(bad)[:60], r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == "unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert not any(key in r.text for key in API_KEYS)
        r = send(locked, method, path, kwargs, GOOD if path != "/compare" else OTHER)
        assert r.status_code == 200, (path, r.text[:300])


def test_a_backend_switched_off_is_a_503_saying_so_behind_the_key(locked, locked_server) -> None:
    """FASTINFER_BACKENDS leaves LOCKED_OFF out (tests/servers.py): no runner process for it; a request naming
    it is refused 401 without a key like any other, and with one answered 503 saying it is switched off,
    as /backends says too; the backends served answer."""
    photo = {"files": {"image": ("p.jpg", photos.benchmark_photo(), "image/jpeg")}, "data": {"backend": LOCKED_OFF}}
    assert send(locked, "POST", "/classify", photo, {}).status_code == 401
    refused = send(locked, "POST", "/classify", photo, GOOD)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "backend_unavailable" and "switched off: FASTINFER_BACKENDS=" in error["message"], error
    listed = {b["name"]: b for b in send(locked, "GET", "/backends", {}, GOOD).json()["backends"]}
    assert listed[LOCKED_OFF]["available"] is False and listed[LOCKED_OFF]["reason"] == error["message"]
    assert listed[LOCKED_OFF]["reason"].startswith("switched off: FASTINFER_BACKENDS="), listed[LOCKED_OFF]
    assert not service_pids(locked_server, f"runner-{LOCKED_OFF}")
    assert service_pids(locked_server, "runner-onnx-int8") and listed["onnx-int8"]["available"] is True


def test_the_probes_metrics_api_page_and_dashboard_files_stay_open(locked) -> None:
    for path in ("/livez", "/readyz", "/healthz", "/metrics", "/", "/docs.json", "/dashboard/", "/dashboard/app.js"):
        assert locked.get(path).status_code == 200, path


def test_a_key_in_the_query_string_is_not_accepted(locked) -> None:
    for name in ("api_key", "key", "token", "access_token"):
        assert locked.get(f"/backends?{name}={API_KEYS[0]}").status_code == 401


def test_the_open_paths_take_no_body_from_anyone(locked) -> None:
    """Else a caller without a key could hold the upload slots with 20 MB bodies nobody reads (review)."""
    for path in ("/dashboard/x", "/dashboard/", "/", "/docs.json"):
        r = locked.post(path, content=b"x" * 1_000_000, headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", (path, r.text[:200])


def test_a_content_type_that_is_not_utf8_gets_a_whole_answer(locked, locked_server) -> None:
    """BentoML's access log decoded it as UTF-8 just before the body went out: the answer was cut short."""
    r = locked.get("/backends", headers={"Content-Type": b"\xff"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    photo = photos.benchmark_photo()
    r = locked.post("/classify", content=photo, headers={**GOOD, **NO_CACHE, "Content-Type": b"image/x-\xff"})
    body = r.json()  # whole: it parses
    assert "error" in body or "top_k" in body, r.text[:200]
    assert "Exception in ASGI application" not in locked_server.log.read_text(errors="replace")


def test_unknown_paths_and_methods_say_401_not_which_routes_exist(locked) -> None:
    for method, path in [("GET", "/admin"), ("POST", "/nothing"), ("DELETE", "/classify"), ("GET", "/classify")]:
        r = locked.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (method, path)


def test_the_spec_offers_the_key_to_swagger(locked) -> None:
    spec = locked.get("/docs.json").json()
    assert spec["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    classify = spec["paths"]["/classify"]["post"]
    assert classify["security"] == [{"apiKey": []}] and "401" in classify["responses"]
    assert "security" not in spec["paths"]["/livez"]["get"]


def test_bentomls_client_and_the_example_take_the_key(locked_server, tmp_path) -> None:
    photo = tmp_path / "moto.jpg"
    photo.write_bytes(photos.benchmark_photo())
    with bentoml.SyncHTTPClient(locked_server.url, timeout=120, token=API_KEYS[1]) as client:
        assert client.classify(image=photo, backend="onnx-int8", top_k=1)["backend"] == "onnx-int8"
    example = [sys.executable, str(ROOT / "examples" / "client.py"), str(photo), "--url", locked_server.url]
    ran = subprocess.run([*example, "--api-key", API_KEYS[0]], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "classify:" in ran.stdout, ran.stderr[-2000:]
    refused = subprocess.run(example, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2 and "--api-key" in refused.stderr, refused.stderr[-2000:]


def test_analyze_is_limited_per_client_and_in_all_before_groq_is_called(locked, fake_groq) -> None:
    """2 per client, 3 in all per minute (tests.servers.ANALYZE_LIMITS): refusals never reach Groq."""
    photo = photos.benchmark_photo()
    result = send(locked, *image_requests(photo)[3], GOOD).json()
    body = {"results": [result], "question": ""}
    fake_groq.requests.clear()
    for junk in (b"not json", b"{}", b'{"results": []}'):  # answered 400 before Groq: they spend nothing
        r = locked.post("/analyze", content=junk, headers={**GOOD, "Content-Type": "application/json"})
        assert r.status_code == 400, r.text
    first = [locked.post("/analyze", json=body, headers=GOOD) for _ in range(2)]
    assert [r.status_code for r in first] == [200, 200] and first[0].json()["text"] == ANSWER
    third = locked.post("/analyze", json=body, headers=GOOD)  # this key's 3rd within the minute
    assert third.status_code == 429 and third.json()["error"]["code"] == "rate_limited", third.text
    assert 1 <= int(third.headers["retry-after"]) <= 60
    assert locked.post("/analyze", json=body, headers=OTHER).status_code == 200  # another client: the 3rd in all
    total = locked.post("/analyze", json=body, headers=OTHER)  # within its own 2, but over the total
    assert total.status_code == 429 and "3 in all" in total.json()["error"]["message"]
    unauthorised = locked.post("/analyze", json=body)
    assert unauthorised.status_code == 401  # the key is checked first: a stranger cannot spend the allowance
    assert len(fake_groq.requests) == 3  # refused calls never reached Groq


def test_keys_never_reach_the_log(locked, locked_server) -> None:
    locked.get("/backends", headers=GOOD)
    locked.get("/backends", headers={"Authorization": "Bearer wrong-but-long-0123456789"})
    log = locked_server.log.read_text(errors="replace")
    for secret in (*API_KEYS, "wrong-but-long-0123456789", GROQ_KEY):
        assert secret not in log
    assert "API keys: on (2 accepted, from FASTINFER_API_KEYS_FILE)" in log


def test_the_load_tests_send_the_key_from_the_environment(locked_server, tmp_path) -> None:
    out = tmp_path / "bench"
    bench = [sys.executable, "-m", "load_tests", "--url", locked_server.url, "--backends", "onnx-int8"]
    bench += ["--users", "1", "--duration", "1", "--sequential", "1", "--no-profile", "--no-bare"]
    bench += ["--out", str(out), "--markdown", str(out / "BENCHMARKS.md"), "--plots", str(out)]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(bench, capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**env, "FASTINFER_API_KEY": API_KEYS[0]})  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    (measured,) = [r for r in json.loads((out / "results.json").read_text())["runs"] if r["scenario"] == "inference"]
    assert measured["failures"] == 0 and measured["requests"] > 0, measured
    refused = subprocess.run(bench, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert refused.returncode != 0 and "401" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
