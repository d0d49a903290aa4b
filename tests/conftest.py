"""Test-wide set-up: a temporary BentoML home with the models built once per run.

BENTOML_HOME must be set before anything imports bentoml, so it is set here, at import.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from xdist.scheduler import LoadFileScheduling

T = TypeVar("T")

pytest_plugins = ["tests.servers"]  # the real bentoml serve, redis-server and fake Groq, shared by all suites

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The project's store (`make test` builds it first, as `make serve` does): where the test store starts from. Kept
# in the environment for pytest-xdist's workers, which inherit the BENTOML_HOME set below.
_PROJECT_HOME = Path(
    os.environ.setdefault("FASTINFER_SUITE_PROJECT_HOME", os.environ.get("BENTOML_HOME") or str(ROOT / "bentoml_home"))
)
_HOME = Path(tempfile.mkdtemp(prefix="fastinfer-bentoml-home-"))
os.environ["BENTOML_HOME"] = str(_HOME)
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
# The suite sets its own access settings, default backend and BentoML configuration: keys exported in the
# shell for a real server (README, Access) must not lock the test servers or change what get_settings()
# tells the unit tests.
for _name in ("FASTINFER_API_KEYS", "FASTINFER_API_KEYS_FILE", "FASTINFER_API_KEY", "GROQ_API_KEY_FILE",
              "FASTINFER_ANALYZE_PER_MINUTE", "FASTINFER_ANALYZE_TOTAL_PER_MINUTE",
              "FASTINFER_DEFAULT_BACKEND", "FASTINFER_TUNED", "FASTINFER_TUNED_RESOLVED",
              "BENTOML_CONFIG", "BENTOML_CONFIG_OPTIONS",
              "BENTOML_CONFIG_OVERRIDES", "FASTINFER_MODEL", "FASTINFER_BACKENDS", "FASTINFER_IN_FRONT",
              "FASTINFER_IN_FRONT_PLACED", "FASTINFER_SCHEDULING"):  # fmt: skip
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _settings_read_afresh() -> Iterator[None]:
    """The process's cached settings dropped before and after each test: each test's code reads them under its
    own environment (a monkeypatched FASTINFER_DEFAULT_BACKEND), not under what an import or another test saw."""

    def clear() -> None:
        if config := sys.modules.get("fastinfer.catalog.config"):  # never imported: nothing cached
            config.get_settings.cache_clear()

    clear()
    yield
    clear()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """``@pytest.mark.anyio`` tests run on asyncio only (anyio's own fixture would add trio where installed)."""
    return "asyncio"


@pytest.fixture(scope="session")
def bentoml_home() -> Path:
    return _HOME


def _say(line: str) -> None:
    print(line, flush=True)


def _start_from_project_store(home: Path) -> None:
    """``home`` given copies (never links: tests damage their stores) of the project store's default family. The
    build below keeps what is current, and rebuilds the rest: on a fresh clone, where `make models` found no
    downloadable weights, the project's models are this seeded random init's, and the test store costs a check of
    their sha256 (seconds) instead of a build (~45 s)."""
    from build_models import ARTIFACTS
    from fastinfer.catalog import store

    for artifact in ARTIFACTS.values():  # by name: a family called resnet50-shop is not the default family
        for batch in artifact.batches:
            model = _PROJECT_HOME / "models" / store.model_name(artifact.name, batch)
            if model.is_dir():
                shutil.copytree(model, home / "models" / model.name)


def run_folder(factory: pytest.TempPathFactory) -> Path:
    """The test run's temporary folder, which every pytest-xdist worker shares (each has its own below it)."""
    base = factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


def once_per_run(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], T]) -> T:
    """``make(folder)`` done once per test run, by whichever pytest-xdist worker asks first (`make test` runs two):
    the others wait for it and get its result, pickled beside the folder. ``make`` must leave the folder as it is
    afterwards: every worker reads it."""
    from filelock import FileLock

    folder = run_folder(factory) / name
    made, failed = folder.with_suffix(".pickle"), folder.with_suffix(".failed")
    with FileLock(f"{folder}.lock"):
        if failed.exists():  # the same failure again would only cost the other worker the same minutes
            pytest.fail(f"{name}, made by another worker, failed: {failed.read_text()}")
        if not made.exists():
            folder.mkdir()
            try:
                made.write_bytes(pickle.dumps(make(folder)))
            except BaseException as exc:
                failed.write_text(f"{type(exc).__name__}: {exc}"[:4000])
                raise
        return pickle.loads(made.read_bytes())


def _make_store(home: Path) -> list:
    from build_models import build

    _start_from_project_store(home)
    with model_store_at(home):
        return build("random", progress=_say)


@pytest.fixture(scope="session")
def built_models(bentoml_home: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    """Every model of the default family, current for the seeded random init (no network here), made once per run
    and linked into this process's store; the build's results."""
    results = once_per_run(tmp_path_factory, "built-store", _make_store)
    made = run_folder(tmp_path_factory) / "built-store" / "models"
    shutil.copytree(made, bentoml_home / "models", copy_function=_link_or_copy, dirs_exist_ok=True)
    return results


def _link_or_copy(src: str, dst: str) -> None:
    """Large files hard-linked (a build writes new files, never into old ones), small ones (``latest``, model.yaml,
    which BentoML and the tests rewrite in place) copied. A test that damages a large file in place breaks
    the link first (:func:`unshared`)."""
    if os.path.getsize(src) > 1 << 20:
        with contextlib.suppress(OSError):  # another filesystem (EXDEV): copied instead
            os.link(src, dst)
            return
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


def doctor_report(tmp_path: Path) -> dict:
    """``fastinfer doctor --json`` without a benchmark profile: it exits 0; its JSON report."""
    from fastinfer import cli

    out = tmp_path / "doctor.json"
    assert cli.main(["doctor", "--json", str(out), "--profile", str(tmp_path / "none.json")]) == 0
    return json.loads(out.read_text())


# A user's own family of 3 classes, as its weights and labels files: what a build is given.
CLASSES = ["red", "green", "blue"]


def three_class_state(seed: int = 1) -> dict:
    """A fresh torchvision ResNet-50 with a 3-class head: what a user's fine-tune saves."""
    import torch
    from torchvision.models import resnet50

    torch.manual_seed(seed)
    return resnet50(weights=None, num_classes=3).state_dict()


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    path = tmp_path_factory.mktemp("weights") / "three.pth"
    torch.save(three_class_state(), path)
    return path


@pytest.fixture(scope="module")
def labels_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("labels") / "labels.txt"
    path.write_text("\n".join(CLASSES) + "\n")
    return path


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


# Fixtures that build models or start servers: a test that uses one is not in `make test-quick`.
HEAVY_FIXTURES = {"built_models", "private_store", "measured_build", "own_family", "server", "locked_server",
                  "redis_server", "locked_redis"}  # fmt: skip


# Fixtures made once per worker (the session's servers) or waited for (the family's build): under pytest-xdist,
# every file that uses one runs on one worker, so that each server starts once and no worker idles on a lock.
# First in this order: the longest groups are handed out first.
SHARED_FIXTURES = {"family_build": "family", "server": "servers", "locked_server": "servers"}
_GROUPS = "file-groups.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test marked by its folder (unit, integration, e2e), and ``heavy`` where it needs the built store, a
    server or a model build: ``-m "unit and not heavy"`` is `make test-quick`. Under pytest-xdist, each file's group
    (SHARED_FIXTURES) is written for the scheduler below."""
    groups: dict[str, str] = {}
    heavy: dict[str, int] = {}
    for item in items:
        folder = Path(str(item.path)).relative_to(ROOT / "tests").parts[0]
        item.add_marker(folder)
        fixtures = set(getattr(item, "fixturenames", ()))
        file = item.nodeid.split("::", 1)[0]
        if folder != "unit" or HEAVY_FIXTURES & fixtures:
            item.add_marker("heavy")
            heavy[file] = heavy.get(file, 0) + 1
        for fixture, group in SHARED_FIXTURES.items():
            if fixture in fixtures:
                groups.setdefault(file, group)
                break
    if "PYTEST_XDIST_WORKER" in os.environ:  # every worker collects the same tests: the last write is as good
        written = run_folder(config._tmp_path_factory) / f"{_GROUPS}.{os.environ['PYTEST_XDIST_WORKER']}"
        written.write_text(json.dumps({"groups": groups, "heavy": heavy}))
        written.replace(written.parent / _GROUPS)


class _GroupedFiles(LoadFileScheduling):
    """``--dist loadfile``, with the files of one group (SHARED_FIXTURES) handed to one worker as one unit, the
    groups first, then the files with the most heavy tests (the longest, as a rule), then the rest by their
    number of tests: the quick files come last, where they fill in while the other worker ends its last file."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)
        self.groups: dict[str, str] = {}

    def schedule(self) -> None:
        if self.collection is not None or not self._check_nodes_have_same_collection():
            return super().schedule()  # a later call, or a collection that differs (xdist reports it)
        written = self.config._tmp_path_factory.getbasetemp() / _GROUPS
        told = json.loads(written.read_text()) if written.exists() else {"groups": {}, "heavy": {}}
        self.groups = {f: f"group {g}" for f, g in told["groups"].items()}
        # The collections' order is what the workers run by (xdist sends indices into it): only the units are ranked.
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:  # as xdist's own: nothing to hand out
            return None
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        rank = {f"group {group}": r for r, group in enumerate(dict.fromkeys(SHARED_FIXTURES.values()))}

        def order(scope: str) -> tuple[int, int, int]:
            return rank.get(scope, len(rank)), -told["heavy"].get(scope, 0), -len(units[scope])

        for scope in sorted(units, key=order):
            self.workqueue[scope] = units[scope]
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than units (-k, one file): as xdist
            self.assigned_work.popitem()[0].shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()
        return None

    def _split_scope(self, nodeid: str) -> str:
        file = super()._split_scope(nodeid)
        return self.groups.get(file, file)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadFileScheduling | None:
    return _GroupedFiles(config, log) if config.getvalue("dist") == "loadfile" else None


_running: list[str] = []  # the test in progress, for an INTERNALERROR that names none


def pytest_runtest_logstart(nodeid: str) -> None:
    _running[:] = [nodeid]


def pytest_runtest_logfinish() -> None:
    _running[:] = ["(between tests)"]


def pytest_internalerror(excrepr: object) -> None:
    # pytest's own report of an INTERNALERROR names no test (one CI run died of "I/O operation on closed file").
    # Written to the real stderr: the capture file may be what was closed.
    sys.__stderr__.write(f"INTERNALERROR while running: {_running[0] if _running else '(no test yet)'}\n")
