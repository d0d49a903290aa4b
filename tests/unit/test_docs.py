"""The docs: README stays short, the MkDocs site builds with --strict (a broken link or anchor
fails it), README's links reach their files, and configuration.md's tables, generated from the settings'
definitions, list every environment variable the code reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
PRODUCT = ["fastinfer", "runners", "build_models", "load_tests", "examples", "service.py"]
# FASTINFER_* and the Groq and Redis variables the settings read; an f-string's prefix ends in "_".
VARIABLE = re.compile(r"\b(?:FASTINFER_[A-Z0-9_]*|GROQ_[A-Z0-9_]+|REDIS_URL)")


def test_readme_is_at_most_150_lines() -> None:
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the reference into docs/"


def test_readmes_relative_links_reach_files() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    local = [link.split("#")[0] for link in links if "://" not in link and not link.startswith("#")]
    assert len(local) >= 10, local  # the picture and the docs pages
    assert [link for link in local if not (ROOT / link).is_file()] == []


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-3000:]}"
    return out


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file() and (site / "configuration" / "index.html").is_file()


def read_in_code() -> set[str]:
    files = [ROOT / p for p in PRODUCT if p.endswith(".py")]
    files += [f for p in PRODUCT if not p.endswith(".py") for f in (ROOT / p).rglob("*.py")]
    return {name for f in files for name in VARIABLE.findall(f.read_text(encoding="utf-8"))}


def undocumented(read: set[str], documented: str) -> list[str]:
    """The names in ``read`` that ``documented`` does not list; a prefix (``FASTINFER_BATCHING_``, from
    an f-string) must begin a listed name (``FASTINFER_BATCHING_<BACKEND>``)."""
    follows = {True: r"[<A-Z]", False: r"(?![A-Z0-9_])"}
    return sorted(
        name
        for name in read
        if name != "FASTINFER_" and not re.search(re.escape(name) + follows[name.endswith("_")], documented)
    )


def test_the_configuration_page_holds_the_tables_its_definitions_make() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import settings_table

    committed = settings_table.PAGE.read_text(encoding="utf-8")
    assert committed == settings_table.page(committed), "docs/configuration.md is stale: run `make docs`"


def test_every_variable_the_code_reads_is_in_the_configuration_tables() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = re.findall(r"<!-- (\S+-table) -->(.*?)<!-- /\1 -->", page, re.S)  # the tables only, not the prose
    assert [name for name, _ in found] == ["settings-table", "elsewhere-table"]
    tables = "".join(table for _, table in found)
    read = read_in_code()
    assert {"FASTINFER_MAX_BYTES", "FASTINFER_PINNED_MODELS", "FASTINFER_BATCHING_", "GROQ_API_KEY"} <= read
    assert undocumented(read, tables) == [], "add it to the settings' definitions (fastinfer/catalog/config.py)"


def test_the_check_finds_a_missing_variable() -> None:
    listed = "FASTINFER_BATCHING_<BACKEND> FASTINFER_API_KEYS FASTINFER_MAX_BYTES"
    read = {"FASTINFER_BATCHING_", "FASTINFER_API_KEY", "FASTINFER_MAX_", "FASTINFER_MAX_BYTES", "FASTINFER_NEW"}
    assert undocumented(read, listed) == ["FASTINFER_API_KEY", "FASTINFER_NEW"]


@pytest.mark.parametrize(
    "markers",
    [
        "<!-- /settings-table -->",  # no beginning
        "<!-- settings-table -->",  # no end
        "<!-- /settings-table -->\n<!-- settings-table -->",  # swapped
        "<!-- settings-table -->\n<!-- /settings-table -->\n" * 2,  # twice: the second would stay stale
    ],
)
def test_a_page_with_misplaced_markers_is_refused(markers: str) -> None:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import settings_table

    with pytest.raises(ValueError, match="settings-table"):
        settings_table.page(f"{markers}\n<!-- elsewhere-table -->\n<!-- /elsewhere-table -->\n")
