"""The settings one environment gives: for the tests of what each FASTINFER_* variable does."""

from __future__ import annotations

import pytest

from fastinfer.catalog import config


def settings_with(monkeypatch: pytest.MonkeyPatch, *unset: str, **env: str) -> config.Settings:
    """``get_settings()`` with ``env`` set and the ``unset`` variables removed; the cached settings are
    cleared before and after, so that no other test sees these."""
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config.get_settings.cache_clear()
    try:
        return config.get_settings()
    finally:
        config.get_settings.cache_clear()
