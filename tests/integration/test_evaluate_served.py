"""`fastinfer evaluate --url` against a real server of a family's own: what it measures through HTTP is what
evaluate measures in process, on a machine whose model store is empty; each backend timed through the server
and the frontier drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from build_models import build
from fastinfer.measure import evaluate as ev
from load_tests.service import ROOT
from tests.conftest import model_store_at
from tests.servers import start_server, stop_server
from tests.unit.test_evaluate import quiet

SERVED = "evaluate-served"


def test_a_served_family_is_evaluated_from_an_empty_store_as_in_process(tmp_path) -> None:
    """A family's PyTorch model served by ``bentoml serve``; ``evaluate --url`` from a machine whose model store
    is empty gives what ``evaluate`` in process gives, an oversized photo skipped (413), not the backend."""
    with model_store_at(tmp_path / "home") as home:
        build("random", only=["pytorch"], progress=lambda m: None, family=SERVED)
        served_and_in_process(home, tmp_path)


def served_and_in_process(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "eval"
    for c, (name, colour) in enumerate({"tabby": (150, 120, 90), "Egyptian cat": (120, 110, 100)}.items()):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (240 + 17 * i, 260 + 11 * c), colour).save(root / name / f"{i}.png")
    noise = np.random.default_rng(0).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "tabby" / "big.png")  # ~1.5 MB: over the server's 1 MB
    env = {"FASTINFER_MODEL": SERVED, "FASTINFER_CACHE": "off", "FASTINFER_MAX_BYTES": "1000000",
           "FASTINFER_BACKENDS": "pytorch", "FASTINFER_DEFAULT_BACKEND": "pytorch"}  # fmt: skip
    server = start_server(home, tmp_path / "serve.log", env)
    try:
        empty = tmp_path / "empty-home"
        empty.mkdir()
        out = tmp_path / "url.json"
        done = subprocess.run(
            [sys.executable, "-m", "fastinfer.cli", "evaluate", str(root), "--url", server.url, "--backends",
             "pytorch", "--json", str(out), "--plot", str(tmp_path / "url.png"), "--seconds", "1", "--clients", "2"],
            cwd=ROOT, env={**os.environ, "BENTOML_HOME": str(empty)}, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        # In process, the server's 1 MB limit has no say: the big photo is left out first.
        (root / "tabby" / "big.png").unlink()
        untimed = ev.Timing(seconds=0)  # the engine's own timing: test_evaluate_sources.py
        local = ev.evaluate(root, "pytorch", progress=quiet, family_name=SERVED, timing=untimed)
        here = local.rows[0]
    finally:
        stop_server(server)
    through = json.loads(out.read_text())
    (big,) = [s for s in through["skipped_files"] if s["path"].endswith("big.png")]
    assert "payload_too_large" in big["why"]
    row = {r["backend"]: r for r in through["rows"]}["pytorch"]
    assert row["status"] == "measured" and row["images"] == 6 and through["family"] == SERVED
    assert through["labels"] == 1000 and (row["top1"], row["top5"]) == (here.top1, here.top5)
    # Timed through the server, as make bench times it: 2 clients, cache bypassed (FASTINFER_CACHE=off besides),
    # without a failure, and drawn.
    assert row["images_per_s"] > 0 and row["speed"]["failures"] == 0 and through["speed"]["clients"] == 2
    assert through["fastest_within_limit"] == "pytorch" and through["pareto_front"] == ["pytorch"]
    assert "2 closed-loop clients" in done.stdout and "fastest within the limit" in done.stdout
    assert (tmp_path / "url.png").stat().st_size > 0 and local.speeds == {}
