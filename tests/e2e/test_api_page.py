"""The API page in a real browser: Swagger UI titled FastInfer, its own text rendered, nothing loaded
from elsewhere (nor refused by its Content-Security-Policy: that shows as a console error), and
"Try it out" classifying a photo through the spec as written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from fastinfer.measure import photos
from tests.e2e.conftest import launch

# Swagger UI skips its online validator on localhost and 127.0.0.1 only: the page is opened as a user
# of a real deploy opens it, through a host name (resolved to the test server by Chromium itself).
HOST = "fastinfer.test"


@pytest.fixture(scope="module")
def named_browser() -> Iterator[Any]:
    yield from launch(f"--host-resolver-rules=MAP {HOST} 127.0.0.1")


def test_the_api_page_in_a_browser(server, named_browser, tmp_path) -> None:
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    url = server.url.replace("127.0.0.1", HOST)
    assert HOST in url  # on 127.0.0.1 Swagger UI never calls its validator: the test would prove nothing
    here = urlsplit(url).netloc
    elsewhere: list[str] = []
    errors: list[str] = []
    page = named_browser.new_page(viewport={"width": 1300, "height": 900})
    page.on("request", lambda r: elsewhere.append(r.url) if urlsplit(r.url).netloc not in (here, "") else None)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{url}/")

    assert page.title() == "FastInfer API"
    page.wait_for_selector(".info .title:has-text('FastInfer')")
    info = page.inner_text(".info")
    assert "Classify an image" in info and "Which one?" in info and "This server" in info and "Contact:" in info
    assert "BentoML" not in page.inner_text(".info .title")

    # Try it out: /classify with the photo, the form as Swagger UI fills it from the spec.
    operation = page.locator("#operations-Service_APIs-fastinfer__classify")
    operation.locator(".opblock-summary").click()
    operation.locator(".try-out__btn").click()
    operation.locator("input[type=file]").set_input_files(str(photo))
    operation.locator(".execute").click()
    status = operation.locator(".live-responses-table tr.response .response-col_status")
    status.wait_for()
    live = operation.locator(".live-responses-table").inner_text()
    assert status.inner_text().strip() == "200", live
    assert '"top_k"' in operation.locator(".live-responses-table").inner_text()

    assert elsewhere == [], "the page loaded something from elsewhere"
    assert errors == [], errors
    page.close()
