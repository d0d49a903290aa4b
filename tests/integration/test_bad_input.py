"""Bad input through a real server gets its 4xx in one JSON shape (each form's parsing:
tests/unit/test_image_api.py), odd-but-valid and extreme images get a prediction within bounded memory,
and the server is ready afterwards. Nothing a client sends may produce a 5xx."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests import images
from tests.servers import SERVER_ENV, service_pids

LIMIT = int(SERVER_ENV["FASTINFER_MAX_BYTES"])


def image_post(client: httpx.Client, data: bytes, name: str = "x.jpg", ctype: str = "image/jpeg", **form: str):
    return client.post("/classify", files={"image": (name, data, ctype)}, data=form)


BAD = {
    "not an image": (lambda c: image_post(c, b"hello, I am text"), 400, "invalid_image"),
    "truncated jpeg": (lambda c: image_post(c, images.truncated_jpeg()), 400, "invalid_image"),
    "0-byte file": (lambda c: image_post(c, b""), 400, "invalid_image"),
    "decompression bomb": (lambda c: image_post(c, images.bomb_png(), "b.png", "image/png"), 413, "image_too_large"),
    "unknown backend": (lambda c: image_post(c, images.photo_jpeg(), backend="tpu"), 400, "unknown_backend"),
    "binary junk in an unknown field": (
        lambda c: c.post(
            "/classify",
            files={"image": ("x.jpg", images.photo_jpeg(), "image/jpeg"), "junk": ("j", b"\xff\xfe", "x/y")},
        ),
        400,
        None,
    ),
    "body over the limit": (
        lambda c: image_post(c, b"\xff" * (LIMIT + 1024)),
        413,
        "payload_too_large",
    ),
    "chunked body over the limit": (
        lambda c: c.post(
            "/classify",
            content=iter([b"\0" * 1_000_000] * (LIMIT // 1_000_000 + 2)),
            headers={"content-type": "application/octet-stream"},
        ),
        413,
        "payload_too_large",
    ),
    "pickle media type": (
        lambda c: c.post("/classify", content=b"x", headers={"content-type": "application/vnd.bentoml+pickle"}),
        415,
        None,
    ),
    "unknown route": (lambda c: c.get("/no/such/route"), 404, "not_found"),
    # The raw-body form and the batch route: the same contract.
    "empty raw image body": (
        lambda c: c.post("/classify", content=b"", headers={"content-type": "image/jpeg"}),
        400,
        "invalid_image",
    ),
    "raw body, not an image": (
        lambda c: c.post("/predict/onnx", content=b"hello", headers={"content-type": "image/png"}),
        400,
        "invalid_image",
    ),
    "raw body over the limit": (
        lambda c: c.post("/classify", content=b"\xff" * (LIMIT + 1), headers={"content-type": "image/jpeg"}),
        413,
        "payload_too_large",
    ),
    "batch with an unknown backend": (
        lambda c: c.post("/classify/batch", files=[("images", ("a.jpg", images.photo_jpeg()))], data={"backend": "x"}),
        400,
        "unknown_backend",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_gets_a_clear_4xx(client, case: str) -> None:
    send, status, code = BAD[case]
    r = send(client)
    assert r.status_code == status, (case, r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"]
    assert "Traceback" not in r.text
    if code:
        assert body["error"]["code"] == code, body


VALID_ODD = {
    "1x1 png": (images.tiny_png, "image/png"),
    "cmyk jpeg": (images.cmyk_jpeg, "image/jpeg"),
    "16-bit png": (images.png16, "image/png"),
    "rgba png": (images.rgba_png, "image/png"),
    "palette gif": (images.palette_gif, "image/gif"),
    "animated gif": (images.animated_gif, "image/gif"),
    "exif-rotated jpeg": (images.exif_rotated_jpeg, "image/jpeg"),
    "jpeg sent as octet-stream": (images.photo_jpeg, "application/octet-stream"),
}


@pytest.mark.parametrize("case", list(VALID_ODD))
def test_odd_but_valid_images_are_classified(client, case: str) -> None:
    make, ctype = VALID_ODD[case]
    r = image_post(client, make(), "img", ctype)
    assert r.status_code == 200, r.text
    assert len(r.json()["top_k"]) == 5


MALFORMED_ANALYZE = {
    "not JSON": {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
    "results not a list": {"json": {"results": "nope"}},
    "a list, not an object": {"json": [1, 2]},
    "no results": {"content": b"", "headers": {"Content-Type": "application/json"}},
    "too many results": {"json": {"results": [{"backend": "onnx"}] * 21}},
    "an empty list of results": {"json": {"results": []}},
    "results missing": {"json": {"nothing": 1}},
    "multipart without its boundary": {"content": b"x", "headers": {"Content-Type": "multipart/form-data"}},
    "multipart, results not objects": {"files": {"results": (None, "[1]")}},
    "multipart, a part not UTF-8 (a photo)": {"files": {"results": ("p.jpg", b"\xff\xd8abc", "image/jpeg")}},
}


def test_malformed_analyze_bodies_get_a_4xx_and_one_log_line_without_a_traceback(client, server) -> None:
    """A client's mistake is no server fault: no traceback, no ERROR line, no 500 (a multipart body without
    its boundary included)."""
    before = len(server.log.read_text(errors="replace").splitlines())
    for case, request in MALFORMED_ANALYZE.items():
        answer = client.post("/analyze", **request)
        assert answer.status_code == 400, (case, answer.status_code, answer.text)
        body = answer.json()
        assert set(body) == {"error"} and body["error"]["message"], (case, body)
    time.sleep(0.5)  # the server's log lines are written as they happen; let the last one land
    added = server.log.read_text(errors="replace").splitlines()[before:]
    assert not [line for line in added if "Traceback" in line or line.startswith("  File ")], "\n".join(added)
    told = [line for line in added if "/analyze" in line and "(scheme=http" not in line]  # not the access log
    assert len(told) <= len(MALFORMED_ANALYZE), "\n".join(told)
    assert all("[ERROR]" not in line for line in told), "\n".join(told)


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024


def test_front_memory_stays_bounded_on_extreme_shapes(client, server) -> None:
    """A 1×20000 PNG (225 bytes) resized whole would take the front to 4.5 GB; 1×60000 asks for 13 GB."""
    (pid,) = service_pids(server, "fastinfer")  # the front worker
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS := current RSS: this test's peak only
    baseline = peak_rss_mb(pid)
    for _ in range(2):
        for width, height, fmt in images.EXTREME_SHAPES.values():
            data = images.extreme_shape(width, height, fmt)
            assert image_post(client, data, "img", f"image/{fmt.lower()}").status_code == 200
    grew = peak_rss_mb(pid) - baseline
    # The crop-only path needs about 1 MB per image; resizing them whole needed gigabytes.
    assert grew < 256, f"the front's peak RSS grew by {grew:.0f} MB"
    assert client.get("/readyz").status_code == 200  # and still ready, after the bad inputs above
