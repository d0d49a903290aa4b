"""The suite's own scheduler (tests/conftest.py ``_GroupedFiles``): a selection of fewer files than workers, as
``-k``, ``--lf`` or one file path make, runs instead of stopping with an INTERNALERROR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_one_file_on_two_workers_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's worker
    argv = ["-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "run")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *argv, "-k", "known_logits", "tests/unit/test_fidelity.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
