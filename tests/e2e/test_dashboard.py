"""The dashboard in a real browser: Debian's Chromium driven by Playwright (no browser download).

Upload a photo, see top-5 and timings, switch backend, compare all, press Analyze against the
fake Groq and see its text. The screenshot is written to test-artifacts/dashboard.png, and to
docs/dashboard.png (README's picture) when dashboard/ changed since that was taken, or when
FASTINFER_RETAKE_DASHBOARD_PICTURE=1 asks for it; in CI (CI set) a stale picture fails the test
instead, unless FASTINFER_RETAKE_DASHBOARD_PICTURE=1 (tests/e2e/dashboard_picture.py).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from fastinfer import hardware, photos
from tests.e2e import dashboard_picture
from tests.e2e.conftest import CHROMIUM
from tests.fake_groq import ANSWER
from tests.servers import API_KEYS

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_dashboard_end_to_end(server, fake_groq, browser, tmp_path) -> None:
    photo = tmp_path / "motorcycle.jpg"
    photo.write_bytes(photos.benchmark_photo())
    page = browser.new_page(viewport={"width": 1400, "height": 950})
    page.goto(f"{server.url}/dashboard/")

    # Backends: available ones enabled, CoreML greyed with its reason off macOS; the random-init banner shows.
    page.wait_for_selector("#backend-onnx-int8")
    assert page.is_visible("#weights-banner")
    if not hardware.is_macos():
        assert page.is_disabled("#backend-coreml")
        assert "needs macOS" in page.inner_text("#backends")

    # Upload: top-5 with confidence bars and per-stage timings.
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    assert page.locator("#top5 li").count() == 5
    for stage in ("decode", "preprocess", "inference"):
        assert stage in page.inner_text("#timings")
    assert "onnx" in page.inner_text("#result")

    # Switch backend: the page classifies again on the new one.
    page.check("#backend-onnx-int8")
    page.wait_for_function("document.querySelector('#result').innerText.includes('onnx-int8')")

    # OpenVINO (the x86 backends) is offered because /backends lists it; it classifies too.
    page.check("#backend-openvino-int8")
    page.wait_for_function("document.querySelector('#result').innerText.includes('openvino-int8')")
    page.check("#backend-onnx-int8")
    page.wait_for_function("document.querySelector('#result').innerText.includes('onnx-int8')")

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
    page.wait_for_function(f"document.querySelector('#analysis').innerText.includes({ANSWER[:20]!r})")

    # The live panel has counted what we did.
    page.wait_for_function("Number(document.querySelector('#live-served')?.innerText || 0) >= 3")

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
    page.wait_for_function("document.querySelector('#analysis').innerText.includes('Analysis unavailable')")
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
    page.wait_for_function("document.querySelector('#key-why').innerText.includes('not accepted')")

    page.fill("#key-input", API_KEYS[1])
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#backend-onnx-int8")
    assert page.is_hidden("#key-form") and page.is_visible("#key-state")
    page.check("#backend-onnx-int8")
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#top5 li")
    page.wait_for_function("Number(document.querySelector('#live-served')?.innerText || 0) >= 1")
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
    retries it with that key instead of forgetting it and asking again (review finding)."""
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
    page.wait_for_function("Number(document.querySelector('#live-served')?.innerText ?? -1) >= 0")
    context.close()


def test_chromium_is_debians(browser) -> None:
    assert shutil.which("chromium") == CHROMIUM or Path(CHROMIUM).exists()
