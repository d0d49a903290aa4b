"""Where BentoML keeps its files: the model store, OpenVINO's compiled models, the server's pins."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_STORE = "bentoml_home"  # the folder, in the project, where `make` keeps the store


def project_root() -> Path | None:
    """The source checkout this package runs from (an editable install: `make venv`'s), or None where
    it was installed elsewhere (a bento, a wheel): there only BENTOML_HOME (or BentoML's ~/bentoml) says."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "service.py").is_file() else None


def use_project_store() -> Path:
    """Point BENTOML_HOME at the project's store (``./bentoml_home``) unless it is set already, and
    return the home in force. Every command calls it first, so that ``fastinfer …``, ``python -m
    build_models`` and ``python -m load_tests`` use the store ``make`` does wherever they run from,
    rather than build a second one in ~/bentoml. BentoML reads BENTOML_HOME on its first store access."""
    if not os.environ.get("BENTOML_HOME") and (root := project_root()) is not None:
        os.environ["BENTOML_HOME"] = str(root / PROJECT_STORE)
    return bentoml_home()


def bentoml_home() -> Path:
    """BentoML's home, as BentoML resolves it (BENTOML_HOME, else ~/bentoml)."""
    return Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml")


def home_roots() -> list[str]:
    """The home as written and as resolved (a symlink), longest first, without a trailing slash; never
    the filesystem root: what a path on this server starts with when it is under the home."""
    home = str(bentoml_home())
    roots = {home.rstrip("/"), os.path.realpath(home).rstrip("/")}
    return sorted((root for root in roots if root), key=len, reverse=True)
