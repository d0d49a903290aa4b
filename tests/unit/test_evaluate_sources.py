"""In-process ``fastinfer evaluate`` follows the server's same-source rule (fastinfer.catalog.holdings): of a store
holding models of two sources, those a server would not serve are not measured, with its reason, and the labels
are the newest source's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastinfer.catalog import backends, holdings
from fastinfer.measure import evaluate as ev
from tests.unit.test_evaluate import FAST, quiet
from tests.unit.test_family_serving import SHAPES, own_store, stored  # noqa: F401 (a fixture)

OLD, NEW = "0ld50urce0ld50ur", "6e75045ce6e75045"
STALE_LABELS = [*SHAPES, "hexagon"]  # the old source's: one label more, which the folder does not hold
COLOURS = dict(zip(SHAPES, [(220, 30, 30), (30, 220, 30), (30, 30, 220)], strict=True))  # label i: channel i


class ByColour:
    """An engine that ranks label i by how much of channel i a photo has (stands in for any stored model)."""

    input_size = 128

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, images: np.ndarray) -> np.ndarray:
        self.batches.append(len(images))
        return images.reshape(len(images), -1, 3).mean(axis=1).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {}


def photos(root: Path) -> Path:
    for label, colour in COLOURS.items():
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64 + i, 48), colour).save(root / label / f"{i}.png")
    return root


@pytest.mark.usefixtures("own_store")
@pytest.mark.parametrize(
    ("stale", "fresh"),
    [(["onnx", "onnx-int8"], ["pytorch"]), (["pytorch"], ["onnx", "onnx-int8"])],
    ids=["PyTorch rebuilt, INT8 left over", "PyTorch left over"],
)
def test_in_process_evaluation_leaves_out_the_models_a_server_refuses(monkeypatch, tmp_path, stale, fresh) -> None:
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    monkeypatch.setattr(ev, "open_engine", lambda name, dirs: ByColour())
    for backend in stale:  # the interrupted rebuild's old models, then its new ones (the family's newest)
        stored(f"tiles-{backend}", backend, labels={"source_hash": OLD}, categories=STALE_LABELS, num_classes=4)
    for backend in fresh:
        stored(f"tiles-{backend}", backend, labels={"source_hash": NEW})
    result = ev.evaluate(photos(tmp_path / "eval"), "pytorch,onnx,onnx-int8", progress=quiet, family_name="tiles",
                         timing=FAST)  # fmt: skip
    report = result.report
    rows = {r.backend: r for r in report.rows}
    assert set(result.speeds) == set(fresh)  # timed: what was measured, alone
    for backend in stale:  # the reason a server on this store gives for it (GET /backends, doctor)
        why = backends.unavailable_reason(backend)
        assert why == holdings.apart_now("tiles")[f"tiles-{backend}"] and "built from other weights" in why
        assert (rows[backend].status, rows[backend].note, rows[backend].top1) == ("not measured", why, None)
    for backend in fresh:
        assert (rows[backend].status, rows[backend].top1) == ("measured", 1.0), rows[backend]
    assert report.unevaluated == [] and report.labels == len(SHAPES)  # the newest source's labels


@pytest.mark.usefixtures("own_store")
def test_in_process_each_engine_is_timed_on_the_photos_and_held_to_the_family_s_limit(monkeypatch, tmp_path) -> None:
    """The engine's own images/s on a batch of the preprocessed photos (dynamic INT8: one a call, as served), after
    a warm-up; the limit is the one the family's build recorded with its models, unless --max-drop says otherwise."""
    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    engines: dict[str, ByColour] = {}
    monkeypatch.setattr(ev, "open_engine", lambda name, dirs: engines.setdefault(name, ByColour()))
    for backend in ("pytorch", "onnx-int8-dynamic"):
        stored(f"tiles-{backend}", backend, accuracy={"top1": 1.0, "max_accuracy_drop_pp": 2.5})
    result = ev.evaluate(photos(tmp_path / "eval"), "pytorch,onnx-int8-dynamic", progress=quiet, timing=FAST)
    accuracy_pass = 6  # the photos, measured once: 16 a call (one a call for dynamic INT8)
    assert engines["pytorch"].batches[0] == 6 and set(engines["pytorch"].batches[1:]) == {16}
    dynamic = engines["onnx-int8-dynamic"].batches
    assert set(dynamic) == {1} and len(dynamic) > accuracy_pass + 2
    for backend, batch in (("pytorch", 16), ("onnx-int8-dynamic", 1)):
        speed = result.speeds[backend]
        assert speed.images_per_s > 0 and speed.images % batch == 0 and speed.seconds >= FAST.seconds
    assert (result.limit_pp, result.limit_source) == (2.5, ev.recorded_limit(None, [2.5])[1])
    assert result.fastest() in ("pytorch", "onnx-int8-dynamic")
    assert result.rows[1].paired.changed == 0 and result.rows[1].paired.images == 6  # paired with PyTorch's
    assert "16 images a call cycled from the 6 preprocessed photos" in result.how and "CPU:" in result.table()
    asked = ev.evaluate(photos(tmp_path / "again"), "pytorch", progress=quiet, timing=FAST, max_drop_pp=0.5)
    assert (asked.limit_pp, asked.limit_source) == (0.5, "--max-drop")


@pytest.mark.usefixtures("own_store")
def test_an_engine_that_fails_on_the_photos_is_a_row_not_a_crash(monkeypatch, tmp_path) -> None:

    class Failing(ByColour):
        def run(self, images: np.ndarray) -> np.ndarray:
            raise RuntimeError("simulated\nfailure")

    monkeypatch.setenv("FASTINFER_MODEL", "tiles")
    monkeypatch.setattr(ev, "open_engine", lambda name, dirs: Failing() if name == "onnx" else ByColour())
    for backend in ("pytorch", "onnx"):
        stored(f"tiles-{backend}", backend)
    result = ev.evaluate(photos(tmp_path / "eval"), "pytorch,onnx", progress=quiet, timing=FAST)
    rows = {r.backend: r for r in result.rows}
    assert (rows["onnx"].status, rows["onnx"].note) == (
        "not measured",
        "failed while running: RuntimeError: simulated failure",
    )
    assert rows["pytorch"].status == "measured" and "onnx" not in result.speeds
