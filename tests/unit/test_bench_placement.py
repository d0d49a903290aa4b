"""``make bench``'s placement step runs placement × scheduling on fresh servers, each told every setting its label
names; the bench's other servers are told the scheduling they record (unset: the default, ``shared``)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

import load_tests.__main__ as bench
from fastinfer.catalog.config import get_settings


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch):
    """FASTINFER_* as the test sets them, read afresh (get_settings caches)."""
    monkeypatch.setenv("FASTINFER_TUNED", "off")
    for name in ("FASTINFER_SCHEDULING", "FASTINFER_DECODE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("setting", "cores", "resolved"),
    [("", 2, "shared"), ("", 8, "shared"), ("shared", 2, "shared"), ("turns", 2, "turns"), (" Turns ", 8, "turns")],
)
def test_the_bench_records_the_scheduling_its_servers_are_told(
    settings, setting: str, cores: int, resolved: str
) -> None:
    settings.setenv("FASTINFER_SCHEDULING", setting)
    settings.setenv("FASTINFER_DECODE_THREADS", "3")
    settings.setattr(bench.hardware, "cpu_count", lambda: cores)
    here = bench.scheduling_here()
    assert here == {"scheduling": resolved, "decode_threads": 3}
    assert bench.told(here) == {"FASTINFER_SCHEDULING": resolved, "FASTINFER_DECODE_THREADS": "3"}


def test_the_placement_step_runs_each_placement_and_scheduling_in_alternating_order(monkeypatch, tmp_path) -> None:
    started: list[dict[str, str]] = []

    def start(home, log, env, **_):
        started.append(env)
        return SimpleNamespace(url="http://x", process=SimpleNamespace(pid=len(started)))

    def inference_run(url, backend, users, args, pid):
        return {"scenario": "inference", "backend": backend, "users": users, "req_per_s": float(pid)}

    monkeypatch.setattr(bench, "start_server", start)
    monkeypatch.setattr(bench, "stop_server", lambda server: None)
    monkeypatch.setattr(bench, "inference_run", inference_run)
    monkeypatch.setattr(bench, "sequential", lambda url, backend, n, data: {"backend": backend, "median_ms": 20.0})
    monkeypatch.setattr(bench.photos, "benchmark_photo", lambda: b"jpeg")
    results = {
        "runs": [{"scenario": "inference", "backend": "onnx-int8", "users": 10, "req_per_s": 50.0}],
        "scheduling": "turns",
        "decode_threads": 0,
    }
    args = argparse.Namespace(duration=1.0, out=tmp_path, sequential=3)
    rows = bench.placement(results, args)
    configs = [("runner process", "shared"), ("runner process", "turns"), ("front worker", "shared"),
               ("front worker", "turns")]  # fmt: skip
    # each round in the reverse order of the one before: a machine drifting in speed favours none
    assert [(r["placement"], r["scheduling"], r["round"]) for r in rows] == [
        *((p, s, 1) for p, s in configs),
        *((p, s, 2) for p, s in reversed(configs)),
    ]
    assert len(rows) == 4 * bench.PLACEMENT_ROUNDS
    for n, (row, env) in enumerate(zip(rows, started, strict=True), 1):  # every label is what its server was told
        assert env["FASTINFER_SCHEDULING"] == row["scheduling"] and env["FASTINFER_DECODE_THREADS"] == "0"
        assert env["FASTINFER_IN_FRONT"] == ("onnx-int8" if row["placement"] == "front worker" else "")
        assert env["FASTINFER_FRONT_WORKERS"] == "1" and row["decode_threads"] == 0
        assert row["sequential"]["median_ms"] == 20.0 and row["req_per_s"] == float(n)  # its own server's run


def test_auto_is_no_scheduling_now_and_stops_the_bench_before_any_run(settings) -> None:
    settings.setenv("FASTINFER_SCHEDULING", "auto")  # the first design's value: refused, never recorded as a mode
    with pytest.raises(ValueError, match="FASTINFER_SCHEDULING must be one of shared, turns"):
        bench.scheduling_here()
