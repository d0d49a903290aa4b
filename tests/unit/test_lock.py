"""requirements.lock.txt is current: every version pyproject.toml pins is the one locked, every locked package has
hashes, and the bento installs from the same file. A failure here means: run `make lock`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock.txt"


def locked(text: str) -> dict[str, set[str]]:
    """Package name -> its locked versions (more than one where the lock forks by Python version or platform)."""
    found: dict[str, set[str]] = {}
    for entry in text.replace("\\\n", " ").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        line, *hashes = entry.split(" --hash=")
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and hashes, f"{line!r}: not one version with its hashes"
        found.setdefault(canonicalize_name(req.name), set()).add(spec.version)
    return found


def stale(pyproject: dict, lock: dict[str, set[str]]) -> list[str]:
    """The requirements of pyproject.toml (runtime and dev) that the lock does not hold at their pinned version."""
    project = pyproject["project"]
    wrong = []
    for line in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        req = Requirement(line)
        (spec,) = req.specifier
        if lock.get(canonicalize_name(req.name)) != {spec.version}:
            wrong.append(f"{line} (locked: {sorted(lock.get(canonicalize_name(req.name), ()))})")
    return wrong


def test_the_lock_holds_every_pin_of_pyproject_with_hashes_for_every_platform() -> None:
    text = LOCK.read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert stale(pyproject, locked(text)) == [], "pyproject.toml changed: run `make lock`"
    assert "--universal" in text.splitlines()[1], "locked for this platform only: run `make lock`"


def test_the_bento_installs_the_lock() -> None:
    python = yaml.safe_load((ROOT / "bentofile.yaml").read_text())["python"]
    assert (ROOT / python["requirements_txt"]).resolve() == LOCK and "packages" not in python
