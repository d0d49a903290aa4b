"""Where BentoML keeps its files: the model store, OpenVINO's compiled models, the server's pins."""

from __future__ import annotations

import os
from pathlib import Path


def bentoml_home() -> Path:
    """BentoML's home, as BentoML resolves it (BENTOML_HOME, else ~/bentoml)."""
    return Path(os.environ.get("BENTOML_HOME") or Path.home() / "bentoml")


def home_roots() -> list[str]:
    """The home as written and as resolved (a symlink), longest first, without a trailing slash; never
    the filesystem root: what a path on this server starts with when it is under the home."""
    home = str(bentoml_home())
    roots = {home.rstrip("/"), os.path.realpath(home).rstrip("/")}
    return sorted((root for root in roots if root), key=len, reverse=True)
