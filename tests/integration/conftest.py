"""Fixtures shared by the integration tests (servers and the built store: tests/conftest.py, tests/servers.py)."""

from __future__ import annotations

import pytest

from tests.family_data import Family, make_family


@pytest.fixture(scope="session")
def own_family(tmp_path_factory) -> Family:
    """A fine-tuned ResNet-50 family made here (tests/family_data.py): its weights, labels, and its train,
    held-out and calibration photos; generated and trained once per run (~20 s)."""
    return make_family(tmp_path_factory.mktemp("own-family"))
