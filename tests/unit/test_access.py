"""API keys and the /analyze guard (fastinfer/front/access.py), alone and in the front's middleware."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from fastinfer.catalog import config
from fastinfer.front.access import Access, ApiKeys, RateGuard, Refusal, analyze_guard, rate_limited, share, spend
from fastinfer.front.http import FrontMiddleware
from fastinfer.front.paths import is_open
from tests.asgi import Recorder, raw
from tests.settings import settings_with as settings

KEYS = ("k1-0123456789abcdef", "k2-fedcba9876543210")


def request(path: str = "/classify", method: str = "POST", **headers: str | bytes) -> dict[str, Any]:
    raw = [(k.replace("_", "-").encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers.items()]
    return {"type": "http", "path": path, "method": method, "headers": raw, "client": ("10.0.0.7", 5555)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- keys ----


@pytest.mark.parametrize(
    ("authorization", "accepted"),
    [
        (f"Bearer {KEYS[0]}", "key-1"),
        (f"bearer {KEYS[1]}", "key-2"),  # the scheme is case-insensitive (RFC 7235)
        (f"Bearer   {KEYS[0]}  ", "key-1"),
        (f"Bearer {KEYS[0]}x", None),  # a key with more on it
        (f"Bearer {KEYS[0][:-1]}", None),  # a prefix of a key
        (KEYS[0], None),  # no scheme
        (f"Basic {KEYS[0]}", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (f"Bearer {KEYS[0]} {KEYS[1]}", None),
        ("Bearer " + "x" * 100_000, None),
    ],
)
def test_only_an_exact_bearer_key_is_accepted(authorization: str, accepted: str | None) -> None:
    result = ApiKeys(KEYS).client(request(authorization=authorization))
    if accepted is None:
        assert isinstance(result, Refusal) and result.status == 401
        assert result.body["error"]["code"] == "unauthorized"
        assert any(name == b"www-authenticate" for name, _ in result.headers)
    else:
        assert result == accepted


def test_undecodable_and_repeated_headers_are_refused_not_a_crash() -> None:
    keys = ApiKeys(KEYS)
    assert isinstance(keys.client(request(authorization=b"Bearer \xff\xfe\x00")), Refusal)
    twice = request()
    twice["headers"] = [(b"authorization", f"Bearer {KEYS[0]}".encode())] * 2
    assert isinstance(keys.client(twice), Refusal)


def test_no_answer_hints_at_the_keys() -> None:
    """The refusal says what to send, never which keys exist or how close a guess came."""
    keys = ApiKeys(KEYS)
    near = keys.client(request(authorization=f"Bearer {KEYS[0][:-1]}"))
    far = keys.client(request(authorization="Bearer zzzzzzzzzzzzzzzzzzzzzzz"))
    assert isinstance(near, Refusal) and near == far
    for refusal in (near, keys.client(request())):
        assert isinstance(refusal, Refusal)
        text = json.dumps(refusal.body) + repr(refusal.headers)
        assert not any(key in text or key[:6] in text for key in KEYS)


@pytest.mark.parametrize(
    "path",
    ["/classify", "/classify/batch", "/predict", "/predict/onnx", "/compare", "/analyze", "/backends",
     "/cache/stats", "/stats/live", "/unknown", "/classify/", "/dashboard-stats", "/Dashboard/", "//classify",
     "/assets/x.js"],
)  # fmt: skip
def test_data_routes_and_unknown_paths_need_a_key(path: str) -> None:
    assert not is_open(path)
    refusal = Access(ApiKeys(KEYS)).check(request(path))
    assert refusal is not None and refusal.status == 401


@pytest.mark.parametrize(
    "path",
    ["/livez", "/readyz", "/healthz", "/metrics", "/", "/docs.json", "/schema.json", "/dashboard", "/dashboard/",
     "/dashboard/app.js", "/static_content/swagger-ui.css"],
)  # fmt: skip
def test_probes_metrics_the_api_page_and_the_dashboards_files_stay_open(path: str) -> None:
    assert Access(ApiKeys(KEYS)).check(request(path, "GET")) is None


def test_without_keys_everything_is_open() -> None:
    assert Access(ApiKeys(())).check(request("/classify")) is None


# ---- the settings ----


SECRETS = ("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE", "GROQ_API_KEY", "GROQ_API_KEY_FILE")


def settings_with(monkeypatch, **env: str) -> config.Settings:
    return settings(monkeypatch, *SECRETS, **env)


def with_files(tmp_path: Path, env: dict[str, str | bytes]) -> dict[str, str]:
    """``env``, each bytes value written to a secret file that its variable names instead."""
    for name, value in env.items():
        if isinstance(value, bytes):
            (tmp_path / name).write_bytes(value)
    return {name: str(tmp_path / name) if isinstance(value, bytes) else value for name, value in env.items()}


@pytest.mark.parametrize(
    ("env", "keys", "groq"),
    [
        ({"FASTINFER_API_KEYS": f" {KEYS[0]} ,, {KEYS[1]},"}, KEYS, ""),
        ({"FASTINFER_API_KEYS_FILE": f"{KEYS[0]}\n{KEYS[1]}\n".encode()}, KEYS, ""),
        ({"FASTINFER_API_KEYS_FILE": b"\xef\xbb\xbf" + KEYS[0].encode() + b"\r\n"}, KEYS[:1], ""),  # a BOM: no key's
        ({"GROQ_API_KEY_FILE": b"gsk-secret\n"}, (), "gsk-secret"),
        ({}, (), ""),
        ({"FASTINFER_API_KEYS_FILE": "", "GROQ_API_KEY_FILE": ""}, (), ""),  # Compose's when no secret is given
    ],
)
def test_keys_come_from_the_variable_or_a_secret_file(monkeypatch, tmp_path: Path, env, keys, groq: str) -> None:
    settings = settings_with(monkeypatch, **with_files(tmp_path, env))
    assert (settings.api_keys, settings.groq.api_key) == (keys, groq)
    if keys:
        assert settings.api_keys_from == next(iter(env))


def test_a_fifo_or_socket_as_secret_file_is_refused_unopened(monkeypatch, tmp_path: Path) -> None:
    """Never opened: open() on a FIFO would wait for a writer (or release one that waits), a device may act."""
    import socket

    from fastinfer.common import files

    fifo, sock = tmp_path / "fifo", tmp_path / "sock"
    os.mkfifo(fifo)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(sock))
        opened = []
        monkeypatch.setattr(files.os, "open", lambda *args: opened.append(args))
        for path in (fifo, sock, "/dev/zero", tmp_path):
            with pytest.raises(ValueError, match=f"{str(path)!r} is not a regular file$"):
                settings_with(monkeypatch, FASTINFER_API_KEYS_FILE=str(path))
    assert opened == []


def test_keys_are_never_printed(monkeypatch) -> None:
    settings = settings_with(monkeypatch, FASTINFER_API_KEYS=KEYS[0], GROQ_API_KEY="gsk-secret-value")
    assert KEYS[0] not in repr(settings) and "gsk-secret-value" not in repr(settings)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FASTINFER_API_KEYS": "short"}, "shorter than 16"),
        ({"FASTINFER_API_KEYS": "has a space in it, 0123456789"}, "characters a Bearer token cannot carry"),
        ({"FASTINFER_API_KEYS": "ключ-0123456789abcdef"}, "characters a Bearer token cannot carry"),
        ({"FASTINFER_API_KEYS_FILE": "/nonexistent/keys"}, "cannot read"),
        ({"FASTINFER_API_KEYS": " , ,\n, "}, "set but holds no key"),
        ({"FASTINFER_API_KEYS": ""}, "set but holds no key"),  # e.g. a Secret's empty value: not open
        ({"GROQ_API_KEY": "gsk-one\ngsk-two"}, "one line of printable ASCII"),
        ({"FASTINFER_API_KEYS": KEYS[0], "FASTINFER_API_KEYS_FILE": "/etc/hostname"}, "not both"),
        *(
            ({name: content}, says)  # bytes: a secret file holding them
            for name in ("FASTINFER_API_KEYS_FILE", "GROQ_API_KEY_FILE")
            for content, says in [
                (b" \n", "is empty; unset"),
                (b"k" * 70_000, "larger than 65536 bytes: not a secret file"),
                (b"\xff\xfe" + b"k" * 20, "not UTF-8"),
            ]
        ),
    ],
)
def test_bad_keys_stop_the_service_without_echoing_them(monkeypatch, tmp_path: Path, env: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says) as raised:
        settings_with(monkeypatch, **with_files(tmp_path, env))
    assert "0123456789" not in str(raised.value)


# ---- the guard ----


def admitted(result: float | None) -> bool:
    return result is None


def test_the_guard_limits_each_client_and_all_of_them() -> None:
    clock = Clock()
    guard = RateGuard(per_client=2, total=3, clock=clock)
    assert admitted(guard.admit("a")) and admitted(guard.admit("a"))
    assert guard.admit("a") == pytest.approx(60.0)  # a's first call leaves the window in 60 s
    assert admitted(guard.admit("b"))  # b has its own allowance...
    clock.now += 10
    assert guard.admit("c") == pytest.approx(50.0)  # ...but the total (3) is spent
    clock.now += 50  # a's two calls and b's leave the window
    assert admitted(guard.admit("a")) and admitted(guard.admit("c"))


def test_a_refused_call_does_not_count() -> None:
    clock = Clock()
    guard = RateGuard(per_client=1, total=10, clock=clock)
    assert admitted(guard.admit("a"))
    for _ in range(100):
        clock.now += 0.5
        assert not admitted(guard.admit("a"))
    clock.now = 1060.0
    assert admitted(guard.admit("a"))  # 60 s after its one admitted call, not after its last attempt


def test_the_guards_memory_is_bounded_by_its_total() -> None:
    """200,000 clients (rotated addresses) leave at most `total` remembered: only admitted calls are kept."""
    clock = Clock()
    guard = RateGuard(per_client=5, total=50, clock=clock)
    for n in range(200_000):
        clock.now += 0.001
        guard.admit(f"client-{n}")
        assert len(guard.clients) <= 50 and len(guard.calls) <= 50
    clock.now += 61
    guard.admit("late")
    assert list(guard.clients) == ["late"]


@pytest.mark.parametrize(("total", "workers", "each"), [(30, 1, 30), (30, 2, 15), (30, 4, 7), (1, 2, 1), (5, 0, 5)])
def test_the_total_is_shared_out_among_the_front_workers(total: int, workers: int, each: int) -> None:
    assert share(total, workers) == each


def test_the_analyze_guard_follows_the_settings(monkeypatch) -> None:
    limits = {"FASTINFER_ANALYZE_PER_MINUTE": "4", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE": "12"}
    guard = analyze_guard(settings_with(monkeypatch, FASTINFER_FRONT_WORKERS="2", **limits))
    assert (guard.per_client, guard.total) == (4, 6)
    assert "FASTINFER_ANALYZE_PER_MINUTE" in rate_limited(guard, "/analyze", 5).body["error"]["message"]


def guarded(clock: Clock, keys: tuple[str, ...] = KEYS) -> Access:
    return Access(ApiKeys(keys), {"/analyze": RateGuard(1, 10, "FASTINFER_ANALYZE_PER_MINUTE", clock=clock)})


def checked_and_spent(access: Access, scope: dict[str, Any]) -> Refusal | None:
    """What the front and then the handler do: check at the headers, record when spending."""
    return access.check(scope) or spend(scope)


def test_the_guard_applies_to_posts_on_its_route_by_client() -> None:
    clock = Clock()
    access = guarded(clock)
    assert checked_and_spent(access, request("/analyze", authorization=f"Bearer {KEYS[0]}")) is None
    refusal = access.check(request("/analyze", authorization=f"Bearer {KEYS[0]}"))
    assert refusal is not None and refusal.status == 429 and refusal.body["error"]["code"] == "rate_limited"
    assert (b"retry-after", b"60") in refusal.headers
    assert "FASTINFER_ANALYZE_PER_MINUTE" in refusal.body["error"]["message"]
    other = request("/analyze", authorization=f"Bearer {KEYS[1]}")
    assert checked_and_spent(access, other) is None  # another key: another client
    assert access.check(request("/classify", authorization=f"Bearer {KEYS[0]}")) is None  # other routes: no guard
    # Without keys the client is the peer's address.
    open_access = guarded(clock, keys=())
    assert checked_and_spent(open_access, request("/analyze")) is None
    assert open_access.check(request("/analyze")) is not None
    assert open_access.check({**request("/analyze"), "client": ("10.0.0.8", 1)}) is None


def test_a_call_is_counted_when_it_spends_not_when_it_arrived() -> None:
    """A body that takes 30 s to arrive is counted at 30 s: the window holds calls as Groq saw them, so
    no more than the total reach Groq in any 60 s (slow bodies must not let 2x the total through)."""
    clock = Clock()
    guard = RateGuard(per_client=5, total=5, clock=clock)
    access = Access(ApiKeys(()), {"/analyze": guard})
    slow = [request("/analyze") for _ in range(5)]
    assert all(access.check(scope) is None for scope in slow)
    clock.now += 30
    assert all(spend(scope) is None for scope in slow)
    assert list(guard.calls) == [1030.0] * 5
    clock.now += 31  # 61 s after the headers, 31 s after those calls reached Groq
    assert access.check(request("/analyze")) is not None


def test_more_spenders_than_the_window_holds_are_refused_at_spending() -> None:
    """Checked together while the window had room; the ones past the total are refused when they spend."""
    access = Access(ApiKeys(()), {"/analyze": RateGuard(10, 2, clock=Clock())})
    scopes = [{**request("/analyze"), "client": (f"10.0.0.{n}", 1)} for n in range(4)]
    assert all(access.check(scope) is None for scope in scopes)
    results = [spend(scope) for scope in scopes]
    assert results[:2] == [None, None]
    assert all(r is not None and r.status == 429 for r in results[2:])


def test_an_in_process_call_has_no_guard() -> None:
    assert spend({"type": "http", "path": "/analyze"}) is None


def test_the_guard_never_breaks_and_stays_bounded() -> None:
    """Random calls, checks and waits: no exception (an emptied client entry included), at most the total in
    the window, at most the total's worth of clients."""
    rng = random.Random(7)
    for _ in range(300):
        clock = Clock()
        guard = RateGuard(per_client=rng.randint(1, 3), total=rng.randint(1, 5), clock=clock)
        for _ in range(200):
            clock.now += rng.choice([0.0, 0.5, 5, 20, 61])
            client = rng.choice("ABCDEFG")
            if rng.random() < 0.3:
                guard.wait(client)
            else:
                guard.admit(client)
            assert len(guard.calls) <= guard.total and len(guard.clients) <= guard.total
            assert all(guard.clients.values())


# ---- in the front ----


async def never_read() -> dict[str, Any]:
    """A receive for raw calls (tests/asgi.py): a refusal must not read the body its headers announce."""
    raise AssertionError("the body of a refused request was read")


def front(app, access: Access, **options: Any) -> FrontMiddleware:
    limits = {"max_bytes": 10**9, "max_concurrency": 4, "timeout_s": 1, "max_uploads": 4, "body_idle_s": 1}
    return FrontMiddleware(app, access=access, **{"route_backends": {}, **limits, **options})


@pytest.mark.parametrize(
    ("headers", "closes"),
    [
        ({"content_length": "2000"}, False),
        ({"content_length": "5000000"}, True),
        ({"transfer_encoding": "chunked"}, True),
        ({"content_length": "2000", "expect": "100-continue"}, True),  # the client waits: it is not asked
    ],
)
def test_the_front_answers_401_before_reading_the_body_and_counts_it(headers: dict, closes: bool) -> None:
    """A client still sending a small body reads its 401 rather than a reset connection; a large one is not
    left on the connection."""
    from fastinfer.serving.metrics import REQUESTS

    app = Recorder()
    counted = REQUESTS.labels(route="/classify", backend="onnx", status="401")
    before = counted._value.get()
    sent = raw(front(app, Access(ApiKeys(KEYS)), route_backends={"/classify": "onnx"}), request(**headers), never_read)
    assert sent[0]["status"] == 401 and app.paths == []
    assert json.loads(sent[1]["body"])["error"]["code"] == "unauthorized"
    assert ((b"connection", b"close") in sent[0]["headers"]) is closes
    assert counted._value.get() == before + 1


def test_the_front_and_the_handler_count_only_calls_that_spend() -> None:
    """Three junk /analyze answered 400 and one client that leaves before its body: none spends; the
    valid call does (its handler calls spend(), as service.py's analyze does before calling Groq)."""

    async def app(scope, receive, send) -> None:
        body = (await receive())["body"]
        refusal = spend(scope) if body == b"valid" else None
        status = 400 if body != b"valid" else refusal.status if refusal else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    guarded_front = front(app, Access(ApiKeys(()), {"/analyze": RateGuard(1, 10, "X", clock=Clock())}))

    def post(body: bytes | None) -> int | None:
        async def receive() -> dict[str, Any]:  # raw: None is a client that leaves before its body
            if body is None:
                return {"type": "http.disconnect"}
            return {"type": "http.request", "body": body, "more_body": False}

        sent = raw(guarded_front, request("/analyze", content_length=str(len(body or b"x"))), receive)
        return sent[0]["status"] if sent else None

    # 499: the client that left (a response nobody reads, so that BentoML's timeout middleware lets go).
    assert [post(b"junk"), post(None), post(b"junk"), post(b"junk")] == [400, 499, 400, 400]
    assert post(b"valid") == 200  # one per client per minute, and still free
    assert post(b"valid") == 429  # the valid one was counted (refused at the headers)


def test_a_websocket_without_a_key_is_refused() -> None:
    """No WebSocket route exists today; one added later must not be open."""
    app = Recorder()
    locked = front(app, Access(ApiKeys(KEYS)))
    sent = raw(locked, {**request("/ws", "GET"), "type": "websocket"}, never_read)  # raw: httpx has no WebSocket
    assert sent == [{"type": "websocket.close", "code": 1008}] and app.paths == []
    raw(locked, {**request("/ws", "GET", authorization=f"Bearer {KEYS[0]}"), "type": "websocket"}, never_read)
    assert app.paths == ["/ws"]
