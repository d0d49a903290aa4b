"""A user's own fine-tuned ResNet-50 family (tests/family_data.py: 3 classes, its own labels and mean/std), built
with the real CLI into every backend and measured on its held-out photos; served by a real ``bentoml serve``
(``FASTINFER_MODEL``), every backend answers with the family's labels, at least 90% right and as the build
measured, and ``fastinfer evaluate --url`` agrees from a machine whose model store is empty. (A wrong labels file
or architecture: tests/unit/test_build_family.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from fastinfer.catalog.backends import openvino_missing
from load_tests.service import ROOT, Server
from tests.family_data import Built, Family, images
from tests.servers import NO_CACHE, serve

pytestmark = pytest.mark.integration

MIN_TOP1 = 0.90
ALWAYS_HERE = ("pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic")
"""The backends every machine the suite runs on builds and serves (OpenVINO's where it is installed)."""
EVALUATED = ("pytorch", "onnx-int8")  # the reference evaluate measures drops against, and an INT8 one
MAX_BYTES = 1_000_000  # the family server's upload limit: the held-out photos are under 0.5 MB


def stored(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.iterdir() if p.is_dir()) if models.is_dir() else []


@pytest.fixture(scope="module")
def family_server(family_build: Built, own_family: Family, redis_server, tmp_path_factory) -> Server:
    env = {"FASTINFER_MODEL": own_family.name, "REDIS_URL": redis_server.url, "FASTINFER_MAX_BYTES": str(MAX_BYTES)}
    with serve(tmp_path_factory.mktemp("own-family-serve"), env, store=family_build.home) as srv:
        yield srv


@pytest.fixture()
def client(family_server: Server) -> httpx.Client:
    with httpx.Client(base_url=family_server.url, timeout=120) as c:
        yield c


def expected_backends() -> set[str]:
    return set(ALWAYS_HERE) | (set() if openvino_missing() else {"openvino", "openvino-int8"})


def test_the_build_stores_every_backend_as_the_family_and_measures_it_on_the_heldout_photos(
    family_build: Built, own_family: Family
) -> None:
    heldout = images(own_family.heldout)
    table = family_build.table
    assert (table["images"], table["skipped"], table["labels"]) == (len(heldout), 0, len(own_family.classes)), table
    # The build's PyTorch reference is the weights with the family's mean/std and crop: what PyTorch measured
    # here. Had the build normalised with ImageNet's, it would be about 3%.
    (reference,) = [r for r in table["rows"] if r["backend"].startswith("pytorch")]
    assert round(reference["top1"] * len(heldout)) == round(own_family.heldout_top1 * len(heldout)), reference
    rows = family_build.rows(own_family.name)
    assert expected_backends() <= set(rows), f"measured: {sorted(rows)}\n{family_build.output[-4000:]}"
    for backend, row in rows.items():
        assert row["images"] == len(heldout) and row["top1"] >= MIN_TOP1, (backend, row)
        if row["precision"] in ("int8", "bf16"):  # the default --max-accuracy-drop: 1 point
            assert reference["top1"] - row["top1"] <= 0.01 + 1e-9, (backend, row, reference)
    # The fastest backend within the limit, from each engine's brief timing, named and written.
    fastest = table["fastest_within_limit"]
    assert fastest in {f"{own_family.name}-{backend}" for backend in rows}, table["images_per_s_in_process"]
    assert f"accuracy: fastest within the limit (1 pp): {fastest}, " in family_build.output
    # Only the family's models, named after it; each carries its labels, preprocessing and measured accuracy.
    names = stored(family_build.home)
    assert names and all(n.startswith(f"{own_family.name}-") for n in names), names
    for name in names:
        model = latest_model(family_build.home, name)
        meta = model["metadata"]
        assert model["labels"]["family"] == own_family.name, model["labels"]
        assert meta["categories"] == list(own_family.classes) and meta["num_classes"] == len(own_family.classes)
        pre = meta["preprocess"]
        assert (pre["resize_size"], pre["crop_size"]) == (own_family.resize, own_family.crop), (name, pre)
        assert pre["mean"] == pytest.approx(own_family.mean) and pre["std"] == pytest.approx(own_family.std), pre
        if (row := rows.get(name.removeprefix(f"{own_family.name}-"))) is not None:
            assert meta["accuracy"]["top1"] == row["top1"] and meta["accuracy"]["images"] == len(heldout), meta


def latest_model(home: Path, name: str) -> dict:
    """The model.yaml of ``name``'s latest version in ``home``'s store."""
    import yaml

    folder = home / "models" / name
    version = (folder / "latest").read_text().strip()
    return yaml.safe_load((folder / version / "model.yaml").read_text())


def ask(client: httpx.Client, backend: str, photo: Path, top_k: int | None = None) -> httpx.Response:
    mime = "image/png" if photo.suffix == ".png" else "image/jpeg"
    return client.post(
        "/classify",
        data={"backend": backend, **({} if top_k is None else {"top_k": str(top_k)})},
        files={"image": (photo.name, photo.read_bytes(), mime)},
        headers=NO_CACHE,  # computed for this request, never a cached answer
    )


def test_every_backend_serves_the_heldout_photos_with_the_family_labels_as_the_build_measured(
    client: httpx.Client, family_build: Built, own_family: Family
) -> None:
    listed = client.get("/backends").json()
    family = listed["family"]
    assert (family["name"], family["num_classes"]) == (own_family.name, len(own_family.classes)), family
    available = {b["name"]: b for b in listed["backends"] if b["available"]}
    rows = family_build.rows(own_family.name)
    assert set(available) == set(rows), f"served {sorted(available)}, built and measured {sorted(rows)}"

    classes = list(own_family.classes)
    heldout = images(own_family.heldout)
    failures = []
    for backend, row in rows.items():
        assert available[backend]["model"].startswith(f"{own_family.name}-{backend}:"), available[backend]
        assert available[backend]["accuracy"]["top1"] == row["top1"], (backend, available[backend]["accuracy"])
        right = 0
        for photo, _ in heldout:  # one at a time: each answer as the build's measurement computed it
            answer = ask(client, backend, photo)
            assert answer.status_code == 200, (backend, photo, answer.text)
            body = answer.json()
            assert body["model"].startswith(f"{own_family.name}-{backend}:") and not body["cached"], body
            # Every class ranked (top_k 5 capped at 3), each by the family's label of its index.
            assert sorted(p["index"] for p in body["top_k"]) == list(range(len(classes))), body
            assert all(p["label"] == classes[p["index"]] for p in body["top_k"]), body
            assert body["class"] == body["top_k"][0]["label"], body
            right += body["class"] == photo.parent.name
        served = right / len(heldout)
        # The build measured each engine as it is served (same pixels, OpenVINO at its runtime precision,
        # dynamic INT8 one image per run): the same photos must come out right.
        measured = round(row["top1"] * row["images"])
        if served < MIN_TOP1 or right != measured:
            failures.append(f"{backend}: served {right}/{len(heldout)} right, the build measured {measured}")
    assert not failures, "\n".join(failures)


def test_evaluate_through_the_server_from_an_empty_store_agrees_with_the_build(
    family_server: Server, family_build: Built, own_family: Family, tmp_path: Path
) -> None:
    """``fastinfer evaluate --url`` on the reference and an INT8 backend, from a machine whose model store is empty:
    what it measures through HTTP is what the build measured in process, a photo over the server's size limit
    skipped (413), not the backend; each backend timed through the server and the frontier drawn. (The test above
    holds every backend's served answers to the build's.)"""
    photos = tmp_path / "heldout"
    shutil.copytree(own_family.heldout, photos)
    noise = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    Image.fromarray(noise).save(big := photos / own_family.classes[0] / "big.png")
    assert big.stat().st_size > MAX_BYTES  # ~1.5 MB
    empty = tmp_path / "empty-home"
    empty.mkdir()
    out = tmp_path / "evaluate.json"
    done = subprocess.run(
        [sys.executable, "-m", "fastinfer.cli", "evaluate", str(photos), "--url", family_server.url,
         "--json", str(out), "--plot", str(plot := tmp_path / "evaluate.png"),
         "--backends", ",".join(EVALUATED),
         "--seconds", "0.3", "--clients", "2"],  # the speed's own tests: test_evaluate*.py; here, the frontier
        cwd=ROOT,
        env={**os.environ, "BENTOML_HOME": str(empty)},
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    evaluation = json.loads(out.read_text())
    (skipped,) = evaluation["skipped_files"]
    assert skipped["path"].endswith("big.png") and "payload_too_large" in skipped["why"], skipped
    # No --model: the family, and its labels, are the server's (GET /backends), not this machine's or the folders'.
    assert (evaluation["family"], evaluation["labels"]) == (own_family.name, len(own_family.classes)), evaluation
    assert evaluation["labels_from"] == "the server (GET /backends)", evaluation
    through = {r["backend"]: r for r in evaluation["rows"] if r["status"] == "measured"}
    rows = {b: r for b, r in family_build.rows(own_family.name).items() if b in EVALUATED}
    assert set(rows) == set(EVALUATED) and set(through) >= set(rows), (sorted(through), sorted(rows))
    for backend, row in rows.items():  # the big photo left out, no other
        assert (through[backend]["images"], through[backend]["top1"]) == (row["images"], row["top1"]), backend
    # The frontier: each backend evaluated is timed through the server, as make bench times it (2 clients, cache
    # bypassed), without a failure; the fastest within the limit named and drawn.
    assert evaluation["speed"]["clients"] == 2 and "2 closed-loop clients" in done.stdout, evaluation["speed"]
    for backend in rows:
        speed = through[backend]["speed"]
        assert through[backend]["images_per_s"] > 0 and speed["failures"] == 0, (backend, speed)
    fastest = evaluation["fastest_within_limit"]
    front = evaluation["pareto_front"]
    assert fastest in rows and fastest in front and set(front) <= set(rows), evaluation
    said = next(line for line in done.stdout.splitlines() if line.startswith("fastest within the limit (1 pp"))
    assert said.endswith(f"): {fastest}")
    assert plot.stat().st_size > 10_000
