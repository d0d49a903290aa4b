"""The browser for the e2e tests: Debian's Chromium driven by Playwright (no browser download)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-background-networking",  # this machine's network is closed: no phoning home
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def launch(*extra_args: str) -> Iterator[Any]:
    """Debian's Chromium under Playwright, with ``extra_args`` beside the usual ones."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (make test does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra_args])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()
