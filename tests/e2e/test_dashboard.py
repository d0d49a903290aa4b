"""The dashboard in a real browser: Debian's Chromium driven by Playwright (no browser download).

Upload a photo, see top-5 and timings, switch backend, compare all, press Analyze against the fake Groq and see
its text, all under the page's Content-Security-Policy with no console error; values the server sends that hold
markup are shown as text, never run. The screenshot also keeps README's picture current (dashboard_picture.py).
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

from fastinfer.common import hardware
from fastinfer.front.dashboard_page import CONTENT_SECURITY_POLICY
from fastinfer.measure import photos
from tests.e2e import dashboard_picture
from tests.e2e.conftest import CHROMIUM
from tests.fake_groq import ANSWER
from tests.servers import API_KEYS

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

# Every Content-Security-Policy violation, whether or not Chromium also logs it to the console.
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
"""


def wait_until(page: Any, expression: str, arg: Any = None, timeout_s: float = 30.0) -> None:
    """``page.wait_for_function`` that the page's policy allows: Playwright builds that one's predicate
    with ``new Function`` inside the page, which a policy without 'unsafe-eval' refuses (the dashboard's
    does); ``page.evaluate`` goes through DevTools, which no policy restricts."""
    deadline = time.monotonic() + timeout_s
    while not evaluated(page, expression, arg):
        if time.monotonic() > deadline:
            raise AssertionError(f"still not true after {timeout_s:g} s: {expression}")
        page.wait_for_timeout(100)


def evaluated(page: Any, expression: str, arg: Any) -> Any:
    try:
        return page.evaluate(expression, arg)
    except Exception as exc:  # the page navigated meanwhile (a reload): not yet, as wait_for_function has it
        if "Execution context was destroyed" in str(exc):
            return False
        raise


def watched_page(browser: Any, **options: Any) -> tuple[Any, list[str]]:
    """A new page that records CSP violations (``window.__violations``), and console errors and failed
    loads (returned)."""
    page = browser.new_page(**options)
    page.add_init_script(RECORD_VIOLATIONS)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return page, errors


def test_dashboard_end_to_end(server, fake_groq, browser, tmp_path) -> None:
    photo = tmp_path / "motorcycle.jpg"
    photo.write_bytes(photos.benchmark_photo())
    page, errors = watched_page(browser, viewport={"width": 1400, "height": 950})
    response = page.goto(f"{server.url}/dashboard/")
    assert response is not None and response.headers.get("content-security-policy") == CONTENT_SECURITY_POLICY

    # Backends: available ones enabled, CoreML greyed with its reason off macOS; the random-init banner shows.
    page.wait_for_selector("#backend-onnx-int8")
    assert page.is_visible("#weights-banner")
    if not hardware.is_macos():
        assert page.is_disabled("#backend-coreml")
        assert "needs macOS" in page.inner_text("#backends")

    # The server's default (FASTINFER_DEFAULT_BACKEND=auto: this machine's choice) is preselected and named.
    info = httpx.get(f"{server.url}/backends", timeout=30).json()
    default = info["default_choice"]
    assert page.is_checked(f"#backend-{default['backend']}")
    assert f"default: {default['backend']} ({default['source']})" in page.inner_text("#machine")
    # The model family served: its name, class count and weights; top-k goes no higher than its classes.
    family = info["family"]
    said = f"model family {family['name']} · {family['num_classes']} classes · weights: {family['weights']}"
    assert said in page.inner_text("#family")
    assert page.get_attribute("#top-k", "max") == str(min(20, family["num_classes"]))

    # Upload: top-5 with confidence bars and per-stage timings.
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    assert page.locator("#top5 li").count() == 5
    for stage in ("decode", "preprocess", "inference"):
        assert stage in page.inner_text("#timings")
    assert default["backend"] in page.inner_text("#result")

    # Switch backend: the page classifies again on the new one.
    page.check("#backend-onnx-int8")
    wait_until(page, "document.querySelector('#result').innerText.includes('onnx-int8')")

    # OpenVINO (the x86 backends) is offered because /backends lists it; it classifies too.
    page.check("#backend-openvino-int8")
    wait_until(page, "document.querySelector('#result').innerText.includes('openvino-int8')")
    page.check("#backend-onnx-int8")
    wait_until(page, "document.querySelector('#result').innerText.includes('onnx-int8')")

    # The same photo again on the same backend comes from the cache, with its badge.
    page.click("#classify-btn")
    page.wait_for_selector("#cached-badge")

    # Compare all: one row per available backend and a summary.
    page.check("#backend-compare")
    page.wait_for_selector("#compare-table")
    assert page.locator("#compare-table tr[data-backend]").count() >= 6
    assert page.locator("#compare-table tr[data-backend='openvino']").count() == 1
    assert "fastest" in page.inner_text("#compare-summary")

    # Analyze: the fake Groq's text appears.
    page.click("#analyze-btn")
    wait_until(page, f"document.querySelector('#analysis').innerText.includes({ANSWER[:20]!r})")

    # The live panel has counted what we did.
    wait_until(page, "Number(document.querySelector('#live-served')?.innerText || 0) >= 3")

    # All of it under the page's Content-Security-Policy: nothing refused, nothing logged as an error.
    assert page.evaluate("window.__violations") == []
    assert errors == [], errors

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    page.close()

    # README's picture: retaken only when the page's sources changed since it was taken (or asked for);
    # in CI a stale picture fails instead, since a throwaway clone's retake would be lost.
    what, reason = dashboard_picture.decide()
    if what == dashboard_picture.FAIL:
        pytest.fail(dashboard_picture.stale_message(reason), pytrace=False)
    if what == dashboard_picture.RETAKE_IT:
        dashboard_picture.save(screenshot)
        assert not dashboard_picture.is_stale()
        warnings.warn(f"docs/dashboard.png was retaken ({reason}): it must be committed", stacklevel=1)


HOSTILE = '"><img src=x onerror="window.__pwned=1">'
"""Markup that breaks out of an attribute or a text node and runs a script if it is ever parsed as HTML."""


def timings(total: float) -> dict[str, float]:
    return {"read": 0.1, "cache": 0.2, "decode": 3.0, "preprocess": 1.0, "inference": total - 4.5, "total": total}


def hostile_answer(backend: str, total: float) -> dict[str, Any]:
    """A /classify answer in ClassifyResponse's shape whose every text is ``HOSTILE``."""
    return {
        "class": HOSTILE,
        "class_index": 1,
        "confidence": 0.5,
        "top_k": [{"label": HOSTILE, "index": i, "score": 0.5 / (i + 1)} for i in range(5)],
        "backend": backend,
        "model": HOSTILE,
        "weights": HOSTILE,
        "latency_ms": total,
        "timings_ms": timings(total),
        "cached": True,
    }


def with_hostile_backends(info: dict[str, Any]) -> dict[str, Any]:
    onnx = next(b for b in info["backends"] if b["name"] == "onnx")
    info["backends"] += [
        {**onnx, "name": HOSTILE, "description": HOSTILE},
        {**onnx, "name": HOSTILE + "2", "available": False, "reason": HOSTILE},
    ]
    info["hardware"]["cpu"] = HOSTILE
    info["recommended"]["backend"] = HOSTILE
    info["family"] |= {"name": HOSTILE, "weights_description": HOSTILE, "num_classes": 3}  # a small family too
    return info


def with_hostile_live(live: dict[str, Any]) -> dict[str, Any]:
    live["p50_ms"] = {HOSTILE: 12.5, "onnx": 20.0}
    live["window"] = HOSTILE
    live["cache"] |= {"mode": HOSTILE, "healthy": False, "degraded": HOSTILE}
    return live


def test_values_from_the_server_are_shown_as_text_never_run(server, browser, tmp_path) -> None:
    """Backend names, labels, p50 keys, the cache's state, error messages: every text the page shows
    comes from the server, which validates it today. The page must not rely on that: a value holding
    markup is shown as written, makes no element, runs nothing, and breaks no policy."""
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    page, errors = watched_page(browser)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))

    def real_then(change):  # the server's own answer, with hostile values put in
        def handle(route: Any) -> None:
            response = route.fetch()
            route.fulfill(response=response, json=change(response.json()))

        return handle

    page.route("**/backends", real_then(with_hostile_backends))
    page.route("**/stats/live", real_then(with_hostile_live))
    page.route("**/classify", lambda route: route.fulfill(json=hostile_answer("onnx", 20.0)))
    compare = {
        "results": [hostile_answer(HOSTILE, 20.0), hostile_answer("onnx", 30.0)],
        "summary": {
            "fastest": HOSTILE,
            "slowest": "onnx",
            "all_agree_top1": False,
            "top1": {},
            "unavailable": [HOSTILE],
        },
        "total_ms": 50.0,
    }
    page.route("**/compare", lambda route: route.fulfill(json=compare))
    page.goto(f"{server.url}/dashboard/")

    def shown_as_text(selector: str, times: int = 1) -> None:  # once rendered: at least `times` as written
        text = page.inner_text(selector)
        assert text.count(HOSTILE) >= times, text
        assert page.locator(f"{selector} img").count() == 0, page.inner_html(selector)

    page.wait_for_selector("#backend-onnx")
    shown_as_text("#backends", 3)  # a name, a description, a reason
    shown_as_text("#machine")
    shown_as_text("#family", 2)  # its name and its weights' description
    assert page.get_attribute("#top-k", "max") == "3" and page.input_value("#top-k") == "3"  # at most its classes
    values = page.eval_on_selector_all("#backends input", "inputs => inputs.map((i) => i.value)")
    assert HOSTILE in values  # the radio button's value is the name as sent, not cut at its quote
    page.wait_for_selector("#live-served")
    shown_as_text("#live", 3)  # a p50 key, the cache's mode and why it is degraded

    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    shown_as_text("#result", 8)  # top-1, model, weights, five labels
    assert page.locator("#top5 li").count() == 5

    page.check("#backend-compare")
    page.wait_for_selector("#compare-table")
    shown_as_text("#result", 4)  # a row's backend and class, the fastest, the unavailable
    rows = page.eval_on_selector_all("#compare-table tr[data-backend]", "rows => rows.map((r) => r.dataset.backend)")
    assert rows == [HOSTILE, "onnx"]

    error = {"error": {"code": HOSTILE, "message": HOSTILE}}
    page.unroute("**/classify")
    page.route("**/classify", lambda route: route.fulfill(status=503, body=json.dumps(error)))
    page.check("#backend-onnx")
    page.wait_for_selector("#compare-table", state="detached")  # the error has replaced the comparison
    shown_as_text("#result", 2)  # the error's message and code

    assert page.evaluate("window.__pwned") is None
    assert not [url for url in requested if url.endswith("/x")], "an <img src=x> was made from a value"
    assert page.evaluate("window.__violations") == []
    # The 503 above is the only failed load; nothing else is refused or logged.
    assert [e for e in errors if "503" not in e] == [], errors
    page.close()


def test_analyze_unavailable_is_shown(server, fake_groq, browser, tmp_path) -> None:
    fake_groq.mode = "error"
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    page = browser.new_page()
    page.goto(f"{server.url}/dashboard/")
    page.wait_for_selector("#backend-onnx")
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    page.click("#analyze-btn")
    wait_until(page, "document.querySelector('#analysis').innerText.includes('Analysis unavailable')")
    assert "analysis_failed" in page.inner_text("#analysis")
    page.close()


def test_the_dashboard_asks_for_a_key_and_keeps_it_for_the_tab(locked_server, browser, tmp_path) -> None:
    """On a server with FASTINFER_API_KEYS: the page asks on its first 401, refuses a wrong key, works
    with a right one, keeps it across a reload of the tab and forgets it in a new tab (sessionStorage)."""
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    context = browser.new_context()
    page = context.new_page()
    sent_keys: list[str] = []
    page.on("request", lambda r: sent_keys.append(r.headers.get("authorization", "")))
    page.goto(f"{locked_server.url}/dashboard/")
    page.wait_for_selector("#key-form", state="visible")
    assert "needs an API key" in page.inner_text("#key-why")

    page.fill("#key-input", "not a key")  # a space: refused by the page before it is sent
    page.click("#key-form button[type=submit]")
    assert "no spaces" in page.inner_text("#key-why") and page.is_visible("#key-form")
    page.fill("#key-input", "wrong-key-0123456789abcdef")
    page.click("#key-form button[type=submit]")
    wait_until(page, "document.querySelector('#key-why').innerText.includes('not accepted')")

    page.fill("#key-input", API_KEYS[1])
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#backend-onnx-int8")
    assert page.is_hidden("#key-form") and page.is_visible("#key-state")
    page.check("#backend-onnx-int8")
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    wait_until(page, "Number(document.querySelector('#live-served')?.innerText || 0) >= 1")
    assert f"Bearer {API_KEYS[1]}" in sent_keys

    page.reload()  # the same tab: the key is still there, nothing is asked
    page.wait_for_selector("#backend-onnx-int8")
    assert page.is_hidden("#key-form")

    other = context.new_page()  # a new tab: sessionStorage is per tab, so it asks again
    other.goto(f"{locked_server.url}/dashboard/")
    other.wait_for_selector("#key-form", state="visible")

    page.click("#forget-key")  # forgotten: the next request asks again
    page.reload()
    page.wait_for_selector("#key-form", state="visible")
    context.close()


DELAY_FIRST_LIVE = """
const realFetch = window.fetch;
let delayed = false;
window.fetch = async (...args) => {
  const response = await realFetch(...args);
  if (!delayed && String(args[0]).includes("/stats/live")) {
    delayed = true;
    await new Promise((resolve) => setTimeout(resolve, 2500));
  }
  return response;
};
"""


def test_a_late_401_does_not_throw_away_the_key_just_entered(locked_server, browser) -> None:
    """The first /stats/live 401 arrives after the user entered the right key (a slow network): the page
    retries it with that key instead of forgetting it and asking again."""
    context = browser.new_context()
    context.add_init_script(DELAY_FIRST_LIVE)
    page = context.new_page()
    page.goto(f"{locked_server.url}/dashboard/")
    page.wait_for_selector("#key-form", state="visible")
    page.fill("#key-input", API_KEYS[0])
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#backend-onnx-int8")
    page.wait_for_timeout(3500)  # the delayed 401 has arrived and been handled
    assert page.is_hidden("#key-form")
    assert page.evaluate("sessionStorage.getItem('fastinfer-api-key')") == API_KEYS[0]
    wait_until(page, "Number(document.querySelector('#live-served')?.innerText ?? -1) >= 0")
    context.close()


def test_chromium_is_debians(browser) -> None:
    assert shutil.which("chromium") == CHROMIUM or Path(CHROMIUM).exists()
