"""Test-wide set-up: a temporary BentoML home with the models built once per run.

BENTOML_HOME must be set before anything imports bentoml, so it is set here, at import.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
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
              "BENTOML_CONFIG_OVERRIDES", "FASTINFER_MODEL", "FASTINFER_BACKENDS", "FASTINFER_IN_FRONT"):  # fmt: skip
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def bentoml_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def built_models(bentoml_home: Path) -> list:
    """Every model built once into the temporary store (seeded random init: no network here)."""
    from build_models import build

    return build("random", progress=lambda m: print(m, flush=True))


def _link_or_copy(src: str, dst: str) -> None:
    """Large files hard-linked (a build writes new files, never into old ones), small ones (``latest``, model.yaml,
    which BentoML and the tests rewrite in place) copied. A test that damages a large file in place breaks
    the link first (:func:`unshared`)."""
    if os.path.getsize(src) > 1 << 20:
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


def unshared(path: Path) -> Path:
    """``path`` made a file of its own (a hard link replaced by a copy), so that writing into it changes no other."""
    copy = path.with_name(path.name + ".unshared")
    shutil.copy2(path, copy)
    os.replace(copy, path)
    return path


@contextlib.contextmanager
def model_store_at(home: Path) -> Iterator[Path]:
    """BENTOML_HOME and BentoML's model store both at ``home`` (its ``models`` folder made if missing)."""
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models.model import ModelStore

    from fastinfer.catalog import store

    (home / "models").mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BENTOML_HOME", str(home))
        patch.delenv(store.PINS_ENV, raising=False)
        with BentoMLContainer.model_store.patch(ModelStore(home / "models")):
            yield home


@pytest.fixture()
def private_store(built_models: list, bentoml_home: Path, tmp_path: Path) -> Iterator[Path]:
    """A home of this test's own holding the built models: a test that rebuilds, damages or deletes models does it
    here, never in the store the session's servers read, so no order between test folders is needed."""
    home = tmp_path / "private-home"
    shutil.copytree(bentoml_home / "models", home / "models", copy_function=_link_or_copy)
    with model_store_at(home):
        yield home


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


# Fixtures that build models or start servers: a test that uses one is not in `make test-quick`.
HEAVY_FIXTURES = {"built_models", "private_store", "measured_build", "own_family", "server", "locked_server",
                  "redis_server", "locked_redis"}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test marked by its folder (unit, integration, e2e), and ``heavy`` where it needs the built store, a
    server or a model build: ``-m "unit and not heavy"`` is `make test-quick`."""
    for item in items:
        folder = Path(str(item.path)).relative_to(ROOT / "tests").parts[0]
        item.add_marker(folder)
        if folder != "unit" or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("heavy")


_running: list[str] = []  # the test in progress, for an INTERNALERROR that names none


def pytest_runtest_logstart(nodeid: str) -> None:
    _running[:] = [nodeid]


def pytest_runtest_logfinish() -> None:
    _running[:] = ["(between tests)"]


def pytest_internalerror(excrepr: object) -> None:
    # pytest's own report of an INTERNALERROR names no test (one CI run died of "I/O operation on closed file").
    # Written to the real stderr: the capture file may be what was closed.
    sys.__stderr__.write(f"INTERNALERROR while running: {_running[0] if _running else '(no test yet)'}\n")
