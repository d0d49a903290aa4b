"""The HTTP forms of the image APIs, parsed from bodies built the way clients build them (httpx's
multipart encoder, raw bodies), without a server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from fastinfer.common.errors import ApiError
from fastinfer.front.image_api import FormRules, answer, cache_use, parse, top_k
from fastinfer.front.image_routes import ROUTES, CacheUse

RULES = FormRules(default_backend="onnx", max_batch_images=4)
JPEG = b"\xff\xd8\xff\xe0 pretend this is a photo"


def request(path: str = "/classify", query: str = "", **kwargs: Any) -> tuple[dict[str, Any], bytes]:
    """The ASGI scope and body httpx would send for ``client.post(path, **kwargs)``."""
    built = httpx.Request("POST", f"http://test{path}?{query}" if query else f"http://test{path}", **kwargs)
    body = built.read()
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in built.headers.items()]
    scope = {"type": "http", "method": "POST", "path": path, "query_string": query.encode(), "headers": headers}
    return scope, body


def parsed(path: str = "/classify", query: str = "", **kwargs: Any):
    scope, body = request(path, query, **kwargs)
    return parse(scope, body, ROUTES[path], RULES)


def refused(path: str = "/classify", query: str = "", **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parsed(path, query, **kwargs)
    assert 400 <= caught.value.status < 500
    return caught.value


@pytest.mark.parametrize(
    ("path", "query", "kwargs", "fields"),
    [
        ("/predict/onnx", "", {"files": {"image": ("a.jpg", JPEG)}, "data": {"top_k": "3"}}, {"top_k": "3"}),
        # ``file``: the original API's field name
        ("/predict/onnx", "", {"files": {"file": ("a.jpg", JPEG)}, "data": {"top_k": "3"}}, {"top_k": "3"}),
        # bentoml.SyncHTTPClient sends its text fields JSON-encoded
        ("/classify", "", {"files": {"image": ("a.jpg", JPEG)}, "data": {"backend": '"onnx-int8"', "top_k": "2"}},
         {"backend": "onnx-int8", "top_k": "2"}),
        ("/classify", "backend=pytorch&top_k=7", {"content": JPEG, "headers": {"content-type": "image/jpeg"}},
         {"backend": "pytorch", "top_k": "7"}),
        ("/predict", "", {"content": JPEG, "headers": {"content-type": "application/octet-stream"}}, {}),
        ("/classify", "", {"content": JPEG, "headers": {"content-type": "IMAGE/WEBP; charset=x"}}, {}),
    ],
)  # fmt: skip
def test_an_image_as_multipart_image_or_file_or_as_the_raw_body(path, query, kwargs, fields) -> None:
    form = parsed(path, query, **kwargs)
    assert [i.data for i in form.images] == [JPEG] and form.fields == fields
    assert form.images[0].filename == ("a.jpg" if "files" in kwargs else "")
    if "top_k" in fields:
        assert top_k(form) == int(fields["top_k"])


def test_a_batch_keeps_the_order_of_its_parts() -> None:
    files = [("images", (f"{i}.jpg", JPEG + bytes([i]), "image/jpeg")) for i in range(4)]
    form = parsed("/classify/batch", files=files, data={"top_k": "1"})
    assert [i.data[-1] for i in form.images] == [0, 1, 2, 3]


BOUNDARY = {"content-type": "multipart/form-data; boundary=b0undary"}
PART = b'--b0undary\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n'
RAW = {"content": JPEG, "headers": {"content-type": "image/png"}}
BATCH_OF_5 = {"files": [("images", (f"{i}.jpg", JPEG, "image/jpeg")) for i in range(5)]}


# (case, path, query, the request, its status, "code: words of its message" or None)
@pytest.mark.parametrize(
    ("case", "path", "query", "kwargs", "status", "code"),
    [
        ("no image part", "/classify", "", {"data": {"top_k": "3"}, "files": {"top_k": (None, "3")}}, 400, None),
        ("unknown form field", "/classify", "", {"files": {"picture": ("a.jpg", JPEG)}}, 400, "invalid_request: "),
        # A URL where the file belongs is never fetched: it is refused as not a file.
        ("image as text (a URL)", "/classify", "", {"data": {"image": "http://127.0.0.1/x.jpg"},
         "files": {"top_k": (None, "3")}}, 400, "invalid_image: must be a file upload"),
        ("two images on a one-image route", "/classify", "", {"files": [("image", ("a", JPEG)), ("file", ("b", JPEG))]},
         400, None),
        ("backend on an original-API route", "/predict", "", {"files": {"image": ("a", JPEG)},
         "data": {"backend": "onnx"}}, 400, None),
        ("empty body", "/classify", "", {"content": b""}, 400, None),
        ("json", "/classify", "", {"json": {"image": "abc"}}, 400, None),
        ("a media type not taken", "/classify", "", {"content": b"x", "headers": {"content-type": "application/pdf"}},
         415, None),
        ("raw, not exactly a raw type", "/classify", "", {"content": JPEG,
         "headers": {"content-type": "application/octet-streamjunk"}}, 415, None),
        ("a field twice", "/classify", "", {"files": [("image", ("a", JPEG)), ("top_k", (None, "1")),
         ("top_k", (None, "2"))]}, 400, None),
        ("no closing boundary", "/classify", "", {"content": PART + JPEG, "headers": BOUNDARY}, 400, None),
        ("a cut boundary", "/classify", "", {"content": PART + JPEG + b"\r\n--b0und", "headers": BOUNDARY}, 400, None),
        ("garbage", "/classify", "", {"content": b"garbage", "headers": BOUNDARY}, 400, None),
        ("a cut part header", "/classify", "", {"content": PART[:20], "headers": BOUNDARY}, 400, None),
        ("no boundary", "/classify", "", {"content": b"x", "headers": {"content-type": "multipart/form-data"}}, 400,
         None),
        ("a part without a name", "/classify", "", {"headers": BOUNDARY,
         "content": b"--b0undary\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b0undary--\r\n"}, 400, None),
        ("too many images", "/classify/batch", "", BATCH_OF_5, 400, "invalid_request: limit is 4"),
        ("no images", "/classify/batch", "", {"data": {"top_k": "1"}, "files": {"x": (None, "")}}, 400, None),
        ("a raw batch", "/classify/batch", "", {"content": JPEG, "headers": {"content-type": "image/jpeg"}}, 400,
         "invalid_request: multipart"),
        ("an unknown query parameter", "/classify", "api_key=1", RAW, 400,
         "invalid_request: Unknown query parameter 'api_key'"),
        ("a query parameter twice", "/classify", "top_k=1&top_k=2", RAW, 400, None),
        ("a form field and a query parameter", "/classify", "top_k=1", {"files": {"image": ("a", JPEG)},
         "data": {"top_k": "2"}}, 400, "invalid_request: both"),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value else "",
)  # fmt: skip
def test_bad_forms_get_a_4xx(case: str, path: str, query: str, kwargs: dict, status: int, code: str | None) -> None:
    error = refused(path, query, **kwargs)
    assert error.status == status and error.message, case
    if code:
        code, _, said = code.partition(": ")
        assert error.code == code and said in error.message


@pytest.mark.parametrize("value", ["0", "21", "five", "2.5", "", "-1", "9" * 50, "1_0", "٥", "+5", "0x5"])
def test_top_k_out_of_range_or_not_a_number(value: str) -> None:
    form = parsed(files={"image": ("a", JPEG)}, data={"top_k": value})
    with pytest.raises(ApiError) as caught:
        top_k(form)
    assert caught.value.code == "invalid_top_k" and caught.value.status == 400


class RecordingPipeline:
    def __init__(self) -> None:
        self.backends = ["onnx", "pytorch"]
        self.calls: list[tuple] = []
        self.stores: list[bool] = []  # whether each call may store its answer in the cache

    async def classify(self, image, backend, k, *, bypass=False, store=True, batched=None):
        self.calls.append(("classify", backend, k, bypass, batched))
        self.stores.append(store)
        if backend not in self.backends:
            raise ApiError(f"Unknown backend {backend!r}", code="unknown_backend")
        return {"backend": backend}

    async def classify_many(self, images, backend, k, *, bypass=False, store=True):
        self.calls.append(("classify_many", backend, k, bypass, None))
        self.stores.append(store)
        return [{"backend": backend} for _ in images]

    async def compare(self, image, k, backends):
        self.calls.append(("compare", tuple(backends), k, None, None))
        raise ApiError("a stand-in compares nothing")


def answered(path: str = "/classify", query: str = "", **kwargs: Any) -> tuple[int, dict, dict, RecordingPipeline]:
    pipeline = RecordingPipeline()
    scope, body = request(path, query, **kwargs)
    status, payload = asyncio.run(answer(pipeline, ROUTES[path], scope, body, RULES))  # type: ignore[arg-type]
    return status, payload, scope.get("state", {}), pipeline


def test_a_made_up_backend_never_becomes_a_metric_label() -> None:
    """Each label value is a time series kept for ever: a client must not be able to mint them."""
    status, payload, state, _ = answered(
        query="backend=" + "x" * 900, content=JPEG, headers={"content-type": "image/png"}
    )
    assert status == 400 and payload["error"]["code"] == "unknown_backend"
    assert state["fastinfer_backend"] == "unknown"
    _, _, state, _ = answered(query="backend=pytorch", content=JPEG, headers={"content-type": "image/png"})
    assert state["fastinfer_backend"] == "pytorch"
    # An empty backend is not quietly the default.
    status, payload, _, _ = answered(query="backend=", content=JPEG, headers={"content-type": "image/png"})
    assert status == 400 and payload["error"]["code"] == "unknown_backend"


def test_defaults_bypass_and_fixed_backends_reach_the_pipeline() -> None:
    _, _, _, pipeline = answered(content=JPEG, headers={"content-type": "image/jpeg"})
    # The default backend, top_k not asked (the pipeline ranks 5, or every class of a smaller family), cached.
    assert pipeline.calls == [("classify", "onnx", None, False, None)]
    _, _, _, pipeline = answered(
        "/predict/batched", content=JPEG, headers={"content-type": "image/jpeg", "cache-control": "no-cache"}
    )
    assert pipeline.calls == [("classify", "pytorch", None, True, True)]  # the route's backend, forced batching


def test_every_image_route_is_a_declared_api_and_the_reverse() -> None:
    """The lane answers exactly the routes BentoML declares as image APIs (the spec and the client see
    those): a route added to one and not the other fails here."""
    import service

    declared = {api.route for api in service.FastInfer.apis.values()} - {"/analyze"}
    assert declared == set(ROUTES)


def test_echoed_names_are_cut_short() -> None:
    long = "k" * 60_000
    assert len(refused(query=f"{long}=1", content=JPEG, headers={"content-type": "image/png"}).message) < 300
    assert len(refused(files={"image": ("a", JPEG), long: (None, "1")}).message) < 300


# ---- the request's cache directives ----


def use_for(*headers: tuple[str, str]) -> CacheUse:
    scope = {"headers": [(name.lower().encode(), value.encode()) for name, value in headers]}
    return cache_use(scope)


READ_AND_STORE, NEITHER, READ_ONLY = CacheUse(True, True), CacheUse(False, False), CacheUse(True, False)


@pytest.mark.parametrize(
    ("headers", "use"),
    [
        ((), READ_AND_STORE),
        ((("Cache-Control", "no-cache"),), NEITHER),
        ((("Cache-Control", "NO-CACHE"),), NEITHER),  # directive names are case-insensitive
        ((("Cache-Control", "no-store"),), READ_ONLY),  # RFC 9111 §5.2.1.5: do not store; reading is allowed
        ((("Cache-Control", "max-age=60, No-Store"),), READ_ONLY),
        ((("Cache-Control", "no-store, no-cache"),), NEITHER),
        ((("Cache-Control", "max-age=60"), ("Cache-Control", "no-store")), READ_ONLY),  # every header line counts
        ((("Pragma", "no-cache"),), NEITHER),  # HTTP/1.0's no-cache (RFC 9111 §5.4)
        ((("Pragma", "no-cache"), ("Cache-Control", "max-age=60")), READ_AND_STORE),  # Cache-Control wins
        ((("Pragma", "no-cache"), ("Cache-Control", "no-store")), READ_ONLY),
        ((("Cache-Control", 'private="no-cache, no-store", max-age=5'),), READ_AND_STORE),  # quoted: no directives
        ((("Cache-Control", "no-cache-please"),), READ_AND_STORE),  # another token, not no-cache
        ((("Cache-Control", "x-no-store"),), READ_AND_STORE),
        ((("Pragma", "x-no-cache"),), READ_AND_STORE),
    ],
)
def test_cache_directives_of_a_request(headers: tuple[tuple[str, str], ...], use: CacheUse) -> None:
    assert use_for(*headers) == use


@pytest.mark.parametrize("path", sorted(set(ROUTES) - {"/compare"}))
@pytest.mark.parametrize(
    ("headers", "read", "stored"),
    [
        ({}, True, True),
        ({"cache-control": "no-store"}, True, False),
        ({"pragma": "no-cache"}, False, False),
        ({"cache-control": "no-cache"}, False, False),
    ],
    ids=["none", "no-store", "pragma", "no-cache"],
)
def test_every_image_route_passes_the_directives_on(path: str, headers: dict, read: bool, stored: bool) -> None:
    """What the pipeline is told: whether to read the cache (not ``bypass``), and whether the answer
    may be stored (``store``; a bypass stores nothing either)."""
    pipeline = RecordingPipeline()
    pipeline.backends = ["onnx", "pytorch", "onnx-int8", "coreml", "openvino", "coreml-batched"]
    if ROUTES[path].kind == "batch":
        kwargs: dict[str, Any] = {"files": [("images", ("a.jpg", JPEG, "image/jpeg"))]}
    else:
        kwargs = {"content": JPEG}
        headers = {"content-type": "image/jpeg", **headers}
    scope, body = request(path, headers=headers, **kwargs)
    status, _ = asyncio.run(answer(pipeline, ROUTES[path], scope, body, RULES))  # type: ignore[arg-type]
    assert status == 200
    ((_, _, _, bypass, _),) = pipeline.calls
    (store,) = pipeline.stores
    assert (not bypass, store and not bypass) == (read, stored)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_the_api_and_its_http_form_run_the_same_declaration(path: str, tmp_path) -> None:
    """Each route is declared once (fastinfer/front/image_routes.py): its BentoML API (what the spec,
    Swagger, the Python client and in-process callers get) asks the pipeline what its HTTP form asks,
    called by keyword or, as the methods once written by hand were, by position."""
    import contextlib
    from types import SimpleNamespace

    import pydantic

    import service

    route = ROUTES[path]
    api = service.FastInfer.apis[route.name]
    assert (api.route, api.input_spec) == (path, route.input_spec)
    photo = tmp_path / "a.jpg"
    photo.write_bytes(JPEG)
    named = "backend" in route.text_fields
    inputs: dict[str, Any] = {"images": [photo]} if route.kind == "batch" else {"image": photo}
    inputs |= {"backend": "pytorch"} if named else {}
    inputs |= {"top_k": 3}
    by_name, by_position = RecordingPipeline(), RecordingPipeline()
    with contextlib.suppress(pydantic.ValidationError, ApiError):  # the stand-in answers no whole response
        asyncio.run(api.func(SimpleNamespace(pipeline=by_name), **inputs))
    with contextlib.suppress(pydantic.ValidationError, ApiError):
        asyncio.run(api.func(SimpleNamespace(pipeline=by_position), *inputs.values()))
    query = "top_k=3" + ("&backend=pytorch" if named else "")
    if route.kind == "batch":
        sent: dict[str, Any] = {"files": [("images", ("a.jpg", JPEG, "image/jpeg"))]}
    else:
        sent = {"content": JPEG, "headers": {"content-type": "image/jpeg"}}
    _, _, _, over_http = answered(path, query, **sent)
    assert by_name.calls == by_position.calls == over_http.calls != []


def test_an_in_process_call_with_wrong_arguments_names_its_api(tmp_path) -> None:
    from types import SimpleNamespace

    import service

    stub = SimpleNamespace(pipeline=RecordingPipeline())
    with pytest.raises(TypeError, match=r"^classify\(\): missing a required argument: 'top_k'"):
        asyncio.run(service.FastInfer.apis["classify"].func(stub, tmp_path / "a.jpg", "onnx"))
    with pytest.raises(TypeError, match=r"^classify_batch\(\): images is a list of paths, not str"):
        asyncio.run(service.FastInfer.apis["classify_batch"].func(stub, "/tmp/a.jpg", "onnx", 3))
    assert stub.pipeline.calls == []
