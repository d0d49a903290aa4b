"""Where BentoML keeps its files: the model store, OpenVINO's compiled models, the server's pins."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_STORE = "bentoml_home"  # the folder, in the project, where `make` keeps the store


def project_root() -> Path | None:
    """The source checkout this package runs from (an editable install), or None (a bento, a wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "service.py").is_file() else None


def use_project_store() -> Path:
    """Point BENTOML_HOME at the project's store unless it is set, and return the home in force: every command
    calls it first, so that all use the store ``make`` does wherever they run from."""
    if not os.environ.get("BENTOML_HOME") and (root := project_root()) is not None:
        os.environ["BENTOML_HOME"] = str(root / PROJECT_STORE)
    return bentoml_home()


def bentoml_home() -> Path:
    """BentoML's home, as BentoML resolves it (BENTOML_HOME, else ~/bentoml)."""
    return Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml")


def home_roots() -> list[str]:
    """The home as written and as resolved, longest first, without a trailing slash (never the root)."""
    home = str(bentoml_home())
    roots = {home.rstrip("/"), os.path.realpath(home).rstrip("/")}
    return sorted((root for root in roots if root), key=len, reverse=True)
