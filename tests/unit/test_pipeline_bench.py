"""``python -m load_tests.pipeline``: the in-process pipeline the scheduling figures in docs/tuning.md come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastinfer.common import hardware
from load_tests.pipeline import main


def test_each_scheduling_serves_every_image_and_takes_its_turns(
    built_models, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTINFER_TUNED", "off")  # as main sets it, restored after
    out = tmp_path / "rows" / "pipeline.json"
    argv = ["--images", "12", "--clients", "3", "--rounds", "2", "--decode-threads", "0,1", "--json", str(out)]
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    cores = hardware.cpu_count()
    order = [("shared", cores), ("shared", 1), ("turns", cores), ("turns", 1)]
    assert [(r["scheduling"], r["decode_threads"]) for r in rows] == order + order[::-1]  # the other way round
    assert all(r["images_per_s"] > 0 and r["cpu_ms_per_image"] > 0 and r["turns_not_taken"] == 0 for r in rows)
    assert "| 1 | turns |" in capsys.readouterr().out


BAD = [
    ["--schedulings", "fast"],
    ["--schedulings", ","],
    ["--images", "0"],
    ["--decode-threads", "-1"],
    ["--decode-threads", "two"],
    ["--backend", "nosuch"],
]


@pytest.mark.parametrize("argv", BAD)
def test_bad_arguments_are_one_line(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
