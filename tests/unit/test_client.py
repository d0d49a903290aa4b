"""The key header a client sends (fastinfer/common/client.py): the server's key syntax, never echoed."""

from __future__ import annotations

import os

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


def test_commands_that_send_the_key_refuse_a_bad_one_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    """evaluate --url, the benchmark and the tuner: one line naming the variable, no traceback, nothing started or
    changed, the key never echoed."""
    from fastinfer import cli
    from load_tests.__main__ import main as bench_main
    from load_tests.tuning.__main__ import main as tune_main

    monkeypatch.setenv("FASTINFER_API_KEY", "sk-secret-0123 two words")
    monkeypatch.setenv("FASTINFER_TUNED", str(tmp_path / "tuned.json"))
    environment = dict(os.environ)
    assert cli.main(["evaluate", str(tmp_path), "--url", "http://127.0.0.1:9"]) == 1
    assert tune_main(["--budget", "60"]) == 1
    with pytest.raises(SystemExit) as exited:
        bench_main(["--url", "http://127.0.0.1:9", "--out", str(tmp_path / "bench")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "FASTINFER_API_KEY" in line]
    assert len(lines) == 3 and "Traceback" not in err and "secret" not in err
    assert list(tmp_path.iterdir()) == [] and dict(os.environ) == environment
    monkeypatch.setenv("FASTINFER_TUNED", os.environ.get("FASTINFER_TUNED", ""))  # the benchmark sets it: restored
    with pytest.raises(SystemExit) as exited:  # rewriting the report sends nothing: the key is not its business
        bench_main(["--report-only", "--out", str(tmp_path / "none"), "--plots", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "no results.json" in err and "FASTINFER_API_KEY" not in err
