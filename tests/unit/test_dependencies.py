"""Every package the product imports is declared in pyproject.toml, and every declared one is used: deptry, as
`make lint` runs it, here too so that the suite (and CI) checks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deptry(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deptry", ".", "--no-ansi"], cwd=root, capture_output=True, text=True)


def test_the_imports_and_the_declared_dependencies_agree() -> None:
    done = deptry(ROOT)
    assert done.returncode == 0, f"deptry found dependency issues (pyproject.toml, [tool.deptry]):\n{done.stderr}"


def test_deptry_finds_an_undeclared_import(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "probe"\nversion = "0"\ndependencies = []\n[tool.deptry]\nknown_first_party = ["probe"]\n'
    )
    (tmp_path / "probe.py").write_text("import attrs\n")
    done = deptry(tmp_path)
    assert done.returncode != 0 and "DEP003 'attrs'" in done.stderr, done.stderr
