"""Test-wide set-up: a temporary BentoML home with the models built once per run.

BENTOML_HOME must be set before anything imports bentoml, so it is set here, at import.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["tests.servers"]  # the real bentoml serve, redis-server and fake Groq, shared by all suites

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_HOME = Path(tempfile.mkdtemp(prefix="fastinfer-bentoml-home-"))
os.environ["BENTOML_HOME"] = str(_HOME)
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
# The suite sets its own access settings, default backend and BentoML configuration: keys exported in the
# shell for a real server (README, Access) must not lock the test servers or change what get_settings()
# tells the unit tests.
for _name in ("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE", "FASTINFER_API_KEY", "GROQ_API_KEY_FILE",
              "FASTINFER_ANALYZE_PER_MINUTE", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE",
              "FASTINFER_DEFAULT_BACKEND", "FASTINFER_TUNED", "FASTINFER_TUNED_RESOLVED",
              "FASTINFER_RUNNER_TELEMETRY", "BENTOML_CONFIG", "BENTOML_CONFIG_OPTIONS",
              "BENTOML_CONFIG_OVERRIDES", "FASTINFER_MODEL"):  # fmt: skip
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def bentoml_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def built_models(bentoml_home: Path) -> list:
    """Every model built once into the temporary store (seeded random init: no network here)."""
    from build_models import build

    return build("random", progress=lambda m: print(m, flush=True))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)
