"""The dashboard's Content-Security-Policy (fastinfer/front/dashboard_page.py) and the page's sources it
relies on: no inline script or style for the policy to refuse, and no HTML parsed from strings in
app.js (every value the server sends is put on the page as text). The browser's view of both is in
tests/e2e/test_dashboard.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fastinfer.front import api_page, dashboard_page
from tests.asgi import request

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"
POLICY = dashboard_page.CONTENT_SECURITY_POLICY


def mounted_dashboard() -> Any:
    """The app service.py mounts at /dashboard, as the server runs it."""
    import service

    (app,) = [app for app, path, _ in service.FastInfer.mount_apps if path == "/dashboard"]
    return app


RANGE_PAST_THE_END, RANGE_GARBLED = {"range": "bytes=999999-"}, {"range": "bytes=abc"}


@pytest.mark.parametrize(
    ("method", "path", "status", "headers"),
    [*(("GET", path, 200, {}) for path in ("/", "/index.html", "/app.js", "/style.css")),
     ("GET", "/not-a-file", 404, {}), ("POST", "/app.js", 405, {}), ("GET", "/app.js", 304, {}),
     ("GET", "/app.js", 416, RANGE_PAST_THE_END), ("GET", "/app.js", 400, RANGE_GARBLED)],
)  # fmt: skip
def test_every_response_of_the_dashboard_carries_its_policy(
    method: str, path: str, status: int, headers: dict[str, str]
) -> None:
    """The 400 and 416 of a bad Range are made as the file response is sent, after StaticFiles returns it."""
    if status == 304:
        headers = {"if-none-match": request(mounted_dashboard(), "GET", path).headers["etag"]}
    response = request(mounted_dashboard(), method, path, headers=headers)
    assert response.status_code == status
    assert response.headers.get_list("content-security-policy") == [dashboard_page.CONTENT_SECURITY_POLICY]


def test_the_policy_keeps_the_page_to_this_server_with_no_inline_code() -> None:
    policy = dict(d.strip().split(" ", 1) for d in POLICY.split(";"))
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"  # no inline script, no hash, no eval
    assert policy["style-src"] == "'self'"  # no style attribute either: markup cannot restyle the page
    assert policy["img-src"] == "'self' data: blob:"  # the empty icon, the photo's preview
    assert policy["connect-src"] == "'self'" and policy["base-uri"] == "'self'"
    assert "unsafe" not in POLICY and "http" not in POLICY


def test_the_api_page_s_policy_is_built_by_the_same_helper() -> None:
    built = api_page.content_security_policy([api_page.INITIALIZER], inline_styles=True, images=["data:"])
    assert built == api_page.CONTENT_SECURITY_POLICY
    assert f"script-src 'self' 'sha256-{api_page.script_hash(api_page.INITIALIZER)}';" in built


def test_the_page_has_nothing_inline_for_the_policy_to_refuse() -> None:
    html = (DASHBOARD / "index.html").read_text(encoding="utf-8")
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, flags=re.DOTALL | re.IGNORECASE)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts), scripts
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", html, flags=re.IGNORECASE)
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing from elsewhere


def test_app_js_never_parses_html_from_a_string() -> None:
    """Values are put on the page as text nodes and attributes (app.js's el()); the ways a string becomes
    markup are not used at all, so no value can reach one unescaped."""
    source = (DASHBOARD / "app.js").read_text(encoding="utf-8")
    code = re.sub(r"//[^\n]*", "", source)  # comments may name what is not used
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "createContextualFragment"):
        assert sink not in code, sink
