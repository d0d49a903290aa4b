"""The key header a client sends (fastinfer/common/client.py): the server's key syntax, never echoed."""

from __future__ import annotations

import pytest

from fastinfer.common.client import auth_headers


def test_the_key_is_sent_as_a_bearer_token(monkeypatch) -> None:
    monkeypatch.setenv("FASTINFER_API_KEY", " sk-0123456789abcdef= ")
    assert auth_headers() == {"Authorization": "Bearer sk-0123456789abcdef="}
    monkeypatch.delenv("FASTINFER_API_KEY")
    assert auth_headers() == {}


@pytest.mark.parametrize("key", ["sk-secret-0123\nX-Evil: 1", "sk-clé-0123456789", "two words"])
def test_a_key_no_header_can_carry_is_refused_without_echoing_it(monkeypatch, key: str) -> None:
    monkeypatch.setenv("FASTINFER_API_KEY", key)
    with pytest.raises(ValueError, match="FASTINFER_API_KEY is not a Bearer token") as refused:
        auth_headers()
    assert "secret" not in str(refused.value) and "clé" not in str(refused.value)
