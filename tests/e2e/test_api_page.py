"""The API page in a real browser: Swagger UI titled FastInfer, its own text rendered, nothing loaded
from elsewhere, and "Try it out" classifying a photo through the spec as written."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastinfer import photos


def test_the_api_page_in_a_browser(server, browser, tmp_path) -> None:
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(photos.photo_jpeg("chelsea.png"))
    here = urlsplit(server.url).netloc
    elsewhere: list[str] = []
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.on("request", lambda r: elsewhere.append(r.url) if urlsplit(r.url).netloc not in (here, "") else None)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/")

    assert page.title() == "FastInfer API"
    page.wait_for_selector(".info .title:has-text('FastInfer')")
    info = page.inner_text(".info")
    assert "Classify an image" in info and "Which one?" in info and "This server" in info
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
