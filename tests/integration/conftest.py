"""Fixtures shared by the integration tests (servers and the built store: tests/conftest.py, tests/servers.py)."""

from __future__ import annotations

from functools import partial

import pytest

from tests.conftest import once_per_run
from tests.family_data import Built, Family, build_family, make_family


@pytest.fixture(scope="session")
def own_family(tmp_path_factory) -> Family:
    """A fine-tuned ResNet-50 family made here (tests/family_data.py): its weights, labels, and its train,
    held-out and calibration photos; generated and trained once per run (~20 s)."""
    return once_per_run(tmp_path_factory, "own-family", make_family)


@pytest.fixture(scope="session")
def family_build(own_family: Family, tmp_path_factory) -> Built:
    """Every backend of the family built, calibrated and measured on its photos, once per run (~1 min on 2 cores).
    Read-only: a server serves it from a home of its own (tests.servers.serve's ``store``), a test that changes
    models copies them."""
    return once_per_run(tmp_path_factory, "family-build", partial(build_family, own_family))
