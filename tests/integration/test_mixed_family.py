"""A family whose stored models are of two sources (an interrupted rebuild with other labels, made exactly),
served by a real ``bentoml serve``: only the newest source's models are served, the others answer 503
saying why and how to rebuild, the server stays ready, and start-up says so once.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from load_tests.service import Server
from tests.family_data import Built, Family, build_here, images
from tests.servers import NO_CACHE, serve, serving

pytestmark = pytest.mark.integration

OLD = ("pytorch", "onnx", "onnx-int8-dynamic")  # of the old source: copied from the family's own build
NEW = ("pytorch", "onnx")  # then rebuilt from the new one before the rebuild was cut short
NEVER_BUILT = "onnx-int8"


@dataclass(frozen=True)
class Mixed:
    home: Path
    name: str
    old_hash: str
    new_hash: str
    new_labels: list[str]


def source_args(family: Family, labels: Path) -> list[str]:
    """The family's build flags (its weights, preprocessing and name) with ``labels``."""
    return [
        *("--weights", str(family.weights), "--labels", str(labels), "--name", family.name),
        *("--mean", ",".join(map(str, family.mean)), "--std", ",".join(map(str, family.std))),
        *("--resize", str(family.resize), "--crop", str(family.crop)),
    ]


def latest(home: Path, name: str) -> tuple[str, dict]:
    folder = home / "models" / name
    version = (folder / "latest").read_text().strip()
    return version, yaml.safe_load((folder / version / "model.yaml").read_text())


@pytest.fixture(scope="module")
def mixed(own_family: Family, family_build: Built, tmp_path_factory) -> Mixed:
    work = tmp_path_factory.mktemp("mixed-family")
    old_home, new_home = work / "old", work / "new"
    for backend in OLD:  # the old source's models: the family's own build
        name = f"{own_family.name}-{backend}"
        shutil.copytree(family_build.home / "models" / name, old_home / "models" / name)
    reversed_labels = work / "reversed.txt"
    reversed_labels.write_text("\n".join(reversed(own_family.classes)) + "\n")
    build_here(new_home, [*source_args(own_family, reversed_labels), "--only", ",".join(NEW)])
    for backend in NEW:  # as the interrupted rebuild stored them: the version, then the pointer to it
        name = f"{own_family.name}-{backend}"
        version, _ = latest(new_home, name)
        shutil.copytree(new_home / "models" / name / version, old_home / "models" / name / version)
        (old_home / "models" / name / "latest").write_text(version)
    old_hash = latest(old_home, f"{own_family.name}-onnx-int8-dynamic")[1]["labels"]["source_hash"]
    new_hash = latest(old_home, f"{own_family.name}-onnx")[1]["labels"]["source_hash"]
    assert old_hash != new_hash
    return Mixed(old_home, own_family.name, old_hash, new_hash, list(reversed(own_family.classes)))


@pytest.fixture(scope="module")
def mixed_server(mixed: Mixed, tmp_path_factory) -> Server:
    # Ready although two runners hold nothing to serve: one model of another source, one never built. The
    # backends neither built nor needed for that are switched off (FASTINFER_BACKENDS): no runner for them.
    env = {"FASTINFER_MODEL": mixed.name, "FASTINFER_CACHE": "memory", **serving(*OLD, NEVER_BUILT)}
    with serve(tmp_path_factory.mktemp("mixed-serve"), env, home=mixed.home) as srv:
        yield srv


def test_a_server_of_a_mixed_family_serves_only_its_newest_source_and_says_so(
    mixed: Mixed, mixed_server: Server, own_family: Family
) -> None:
    with httpx.Client(base_url=mixed_server.url, timeout=120) as client:
        listed = client.get("/backends").json()
        available = sorted(b["name"] for b in listed["backends"] if b["available"])
        assert available == sorted(NEW), listed["backends"]
        assert listed["family"]["labels"] == mixed.new_labels, listed["family"]
        assert "not in the model store" in {b["name"]: b for b in listed["backends"]}[NEVER_BUILT]["reason"]
        (apart,) = [b for b in listed["backends"] if b["name"] == "onnx-int8-dynamic"]
        reason = apart["reason"]
        assert "built from other weights, labels or preprocessing" in reason and "not served" in reason, reason
        assert f"source hash {mixed.old_hash}" in reason and f"source hash {mixed.new_hash}" in reason, reason
        mean = ",".join(map(repr, map(float, own_family.mean)))
        assert f"--name {mixed.name} --mean {mean}" in reason and f"--crop {own_family.crop}" in reason, reason
        assert "(the whole family, without --only), then restart the server" in reason, reason

        photo, _ = images(own_family.heldout)[0]
        sent = {"image": (photo.name, photo.read_bytes(), "image/jpeg" if photo.suffix == ".jpg" else "image/png")}
        compared = client.post("/compare", files=sent).json()
        assert [r["backend"] for r in compared["results"]] == list(NEW), compared
        assert "onnx-int8-dynamic" in compared["summary"]["unavailable"], compared
        assert compared["summary"]["all_agree_top1"] and compared["results"][0]["class"] in mixed.new_labels
        refused = client.post("/classify", data={"backend": "onnx-int8-dynamic"}, files=sent, headers=NO_CACHE)
        assert refused.status_code == 503 and refused.json()["error"]["message"] == reason, refused.text

    # Said once at start-up (the deployment hook), not by each worker or runner.
    lines = [line for line in mixed_server.log.read_text().splitlines() if "holds models of two sources" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], lines
