"""The API page of a real ``bentoml serve``: ``/`` and ``/docs.json`` speak FastInfer, and every example
on them works as written (curl and Python, against this server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from fastinfer import __version__
from fastinfer.common import hardware
from fastinfer.front.paths import is_open
from fastinfer.measure import photos
from tests.servers import API_KEYS
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


def examples(spec: dict) -> list[tuple[str, str, str]]:
    """(where, language, code) of every example on the page: its description's and each operation's."""
    found = [("the page", lang, code) for lang, code in BLOCK.findall(spec["info"]["description"])]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if isinstance(op, dict):
                found += [(f"{method.upper()} {path}", lang, code) for lang, code in BLOCK.findall(op["description"])]
    return found


def run(where: str, lang: str, code: str, url: str, cwd: Path, env: dict[str, str]) -> None:
    """One example as a user would paste it, against the server at ``url``: it must work."""
    code = code.replace(EXAMPLE_URL, url)
    if lang == "python":
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (where, code, done.stderr[-2000:])
        return
    for command in code.replace("\\\n", " ").splitlines():
        line = command + " -s -o answer -w '%{http_code}'"
        done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        status, answer = done.stdout, (cwd / "answer").read_text(errors="replace")
        if "coreml" in command and not hardware.is_macos():
            assert status == "503" and "needs macOS" in answer, (where, command, status, answer[:500])
        else:
            assert status == "200", (where, command, status, answer[:500])


def photos_in(directory: Path) -> Path:
    (directory / "cat.jpg").write_bytes(photos.photo_jpeg("chelsea.png"))
    (directory / "dog.jpg").write_bytes(photos.photo_jpeg("coffee.png"))
    return directory


def test_every_example_works_as_written(spec: dict, server, tmp_path: Path) -> None:
    found = examples(spec)
    paths = spec["paths"]
    operations = {f"{m.upper()} {p}" for p, item in paths.items() for m, op in item.items() if "responses" in op}
    assert {e[0] for e in found} == {"the page"} | operations - {"GET /dashboard/"}  # the dashboard's is a link
    for where, lang, code in found:
        run(where, lang, code, server.url, photos_in(tmp_path), dict(os.environ))


def test_with_keys_on_every_operation_s_example_sends_the_key(locked_server, tmp_path: Path) -> None:
    """A server that needs a key: the examples under each API send $FASTINFER_API_KEY, as the page says."""
    spec = httpx.get(f"{locked_server.url}/docs.json", timeout=30).json()
    assert "export FASTINFER_API_KEY=<your key>" in spec["info"]["description"]
    env = {**os.environ, "FASTINFER_API_KEY": API_KEYS[0]}
    for where, lang, code in examples(spec):
        # Not /analyze: this server allows 3 calls a minute in all, counted by tests/integration/test_access.py.
        if where != "the page" and where != "POST /analyze":
            assert ("$FASTINFER_API_KEY" in code) != is_open(where.split(" ", 1)[1]), where  # open paths need none
            run(where, lang, code, locked_server.url, photos_in(tmp_path), env)
    assert httpx.get(f"{locked_server.url}/backends", timeout=60).status_code == 401  # the key is what let them in
