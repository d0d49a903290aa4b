"""The API page of a real ``bentoml serve``: ``/`` and ``/docs.json`` speak FastInfer, and every example
on them works as written (curl and Python, against this server)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fastinfer import __version__, hardware, photos
from tests.spec_checks import spec_problems

BLOCK = re.compile(r"```(bash|python)\n(.*?)\n```", re.DOTALL)
EXAMPLE_URL = "http://127.0.0.1:3000"


@pytest.fixture
def spec(client: httpx.Client) -> dict:
    return client.get("/docs.json").json()


def test_docs_json_speaks_fastinfer(spec: dict) -> None:
    assert spec_problems(spec) == []
    assert spec["info"]["version"] == __version__
    assert "## This server" in spec["info"]["description"]


def test_the_page_at_root_is_fastinfer_s(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>FastInfer API</title>" in page.text and "googletagmanager" not in page.text
    assets = re.findall(r'(?:src|href)="\./([^"]+)"', page.text)
    assert len(assets) == 4  # Swagger UI's css and three scripts, from BentoML's static files
    for asset in assets:
        assert client.get("/" + asset).status_code == 200, asset
    assert client.head("/").status_code == 200


def examples(spec: dict) -> list[tuple[str, str, str]]:
    """(where, language, code) of every example on the page: its description's and each operation's."""
    found = [("the page", lang, code) for lang, code in BLOCK.findall(spec["info"]["description"])]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if isinstance(op, dict):
                found += [(f"{method.upper()} {path}", lang, code) for lang, code in BLOCK.findall(op["description"])]
    return found


def test_every_example_works_as_written(spec: dict, server, tmp_path: Path) -> None:
    (tmp_path / "cat.jpg").write_bytes(photos.photo_jpeg("chelsea.png"))
    (tmp_path / "dog.jpg").write_bytes(photos.photo_jpeg("coffee.png"))
    found = examples(spec)
    paths = spec["paths"]
    operations = {f"{m.upper()} {p}" for p, item in paths.items() for m, op in item.items() if "responses" in op}
    assert {e[0] for e in found} == {"the page"} | operations - {"GET /dashboard/"}  # the dashboard's is a link
    for where, lang, code in found:
        code = code.replace(EXAMPLE_URL, server.url)
        if lang == "python":
            python = [sys.executable, "-c", code]
            done = subprocess.run(python, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (where, code, done.stderr[-2000:])
            continue
        for command in code.replace("\\\n", " ").splitlines():
            done = subprocess.run(
                ["bash", "-c", command + " -s -o answer -w '%{http_code}'"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            status, answer = done.stdout, (tmp_path / "answer").read_text(errors="replace")
            if "coreml" in command and not hardware.is_macos():
                assert status == "503" and "needs macOS" in answer, (where, command, status, answer[:500])
            else:
                assert status == "200", (where, command, status, answer[:500])
