"""The commands find the project's store: run from anywhere, `fastinfer …`, `python -m build_models` and
`python -m load_tests` use ./bentoml_home (as `make` does) unless BENTOML_HOME says otherwise, and a
missing model is one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastinfer.common import home
from tests.conftest import ROOT


def test_unset_the_home_is_the_projects_store_and_a_set_one_wins(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("BENTOML_HOME")  # restored afterwards by monkeypatch
    assert home.project_root() == ROOT and home.use_project_store() == ROOT / "bentoml_home"  # a source checkout
    assert os.environ["BENTOML_HOME"] == str(ROOT / "bentoml_home")  # for BentoML and every child process
    monkeypatch.setenv("BENTOML_HOME", str(tmp_path))
    assert home.use_project_store() == tmp_path


def test_installed_elsewhere_only_bentoml_home_says(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("BENTOML_HOME")
    monkeypatch.setattr(home, "project_root", lambda: None)  # a bento, a wheel: no checkout around it
    assert home.use_project_store() == Path.home() / "bentoml"
    assert "BENTOML_HOME" not in os.environ


def run(*argv: str, home_dir: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BENTOML_HOME": str(home_dir)}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["fidelity", "bench", "profile", "tune"])
def test_a_missing_model_is_one_line_not_a_traceback(tmp_path, command) -> None:
    """Run from another folder with an empty store: each command says, in one line, that nothing can
    run and where it looked."""
    empty = tmp_path / "empty-home"
    out = tmp_path / "out.json"
    options = ["--budget", "10"] if command == "tune" else ["--json", str(out)]
    done = run("-m", "fastinfer.cli", command, *options, home_dir=empty, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"fastinfer {command}: " in lines[0] and str(empty / "models") in lines[0]
