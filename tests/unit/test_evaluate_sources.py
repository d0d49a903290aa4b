"""In-process ``fastinfer evaluate`` follows the server's same-source rule (issue 41, finding 4).

After an interrupted rebuild from other weights, a family's store holds models of two sources; a server serves
only those built like its newest model (fastinfer.catalog.holdings). Evaluated in process, the others are not
measured, with the reason the server gives, and the family's labels are the newest source's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastinfer.catalog import backends, holdings
from fastinfer.measure import evaluate as ev
from tests.unit.test_evaluate import no_bench, quiet  # noqa: F401 (a fixture)
from tests.unit.test_family_serving import SHAPES, own_store, stored  # noqa: F401 (a fixture)

OLD, NEW = "0ld50urce0ld50ur", "6e75045ce6e75045"
STALE_LABELS = [*SHAPES, "hexagon"]  # the old source's: one label more, which the folder does not hold
COLOURS = dict(zip(SHAPES, [(220, 30, 30), (30, 220, 30), (30, 30, 220)], strict=True))  # label i: channel i


class ByColour:
    """An engine that ranks label i by how much of channel i a photo has (stands in for any stored model)."""

    input_size = 128

    def run(self, images: np.ndarray) -> np.ndarray:
        return images.reshape(len(images), -1, 3).mean(axis=1).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {}


def photos(root: Path) -> Path:
    for label, colour in COLOURS.items():
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64 + i, 48), colour).save(root / label / f"{i}.png")
    return root


@pytest.mark.usefixtures("own_store", "no_bench")
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
    report = ev.evaluate(photos(tmp_path / "eval"), "pytorch,onnx,onnx-int8", progress=quiet, family_name="tiles")
    rows = {r.backend: r for r in report.rows}
    for backend in stale:  # the reason a server on this store gives for it (GET /backends, doctor)
        why = backends.unavailable_reason(backend)
        assert why == holdings.apart_now("tiles")[f"tiles-{backend}"] and "built from other weights" in why
        assert (rows[backend].status, rows[backend].note, rows[backend].top1) == ("not measured", why, None)
    for backend in fresh:
        assert (rows[backend].status, rows[backend].top1) == ("measured", 1.0), rows[backend]
    assert report.unevaluated == [] and report.labels == len(SHAPES)  # the newest source's labels
