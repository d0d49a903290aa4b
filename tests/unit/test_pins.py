"""The bento installs exactly what the tests ran with: every package pinned, the same as the project's."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\[[^\]]+\])?==(?P<version>[^,;\s]+)$")


def pins(requirements: list[str]) -> dict[str, str]:
    found = {}
    for req in requirements:
        match = PIN.match(req.strip())
        assert match, f"{req!r} is not pinned to one version (name==version)"
        found[match["name"].lower()] = match["version"]
    return found


def test_every_bento_package_is_pinned_to_the_version_installed_here() -> None:
    bento = pins(yaml.safe_load((ROOT / "bentofile.yaml").read_text())["python"]["packages"])
    for name, version in bento.items():
        assert importlib.metadata.version(name) == version, f"bentofile pins {name}=={version}"


def test_the_bento_and_the_project_pin_the_same_versions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = pins(project["dependencies"])
    bento = pins(yaml.safe_load((ROOT / "bentofile.yaml").read_text())["python"]["packages"])
    assert {n: v for n, v in bento.items() if n in runtime} == {n: runtime[n] for n in bento if n in runtime}
    missing = set(bento) - set(runtime)
    assert not missing, f"the bento installs {missing}, which the project (and so the tests) does not"
    pins(project["optional-dependencies"]["dev"])  # the test tools are pinned too
