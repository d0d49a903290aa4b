"""BENCHMARKS.md's target lines say what was measured, limit and verdict in the right places."""

from __future__ import annotations

from load_tests.report import _targets


def results(p50_by_backend: dict[str, float], inference_ms: dict[str, float], decode_ms: float = 4.0) -> dict:
    stages = [{"stage": "decode", "detail": "medium", "wall_ms": decode_ms}]
    stages += [{"stage": "inference", "detail": f"{b} b1", "wall_ms": ms} for b, ms in inference_ms.items()]
    return {
        "runs": [],
        "profile": {"stages": stages, "ceilings": []},
        "sequential": [{"backend": b, "median_ms": p50} for b, p50 in p50_by_backend.items()],
    }


def test_single_client_target_names_the_in_process_time_the_limit_and_the_verdict() -> None:
    # The committed run's onnx-int8 figures: p50 30.5 ms against 19.1 ms in process (limit 23.9 ms).
    lines = _targets(results({"onnx-int8": 30.5, "onnx": 40.0}, {"onnx-int8": 15.1, "onnx": 30.0}))
    (line,) = lines
    assert "met for 1 of 2 backends (`onnx`)" in line
    assert "`onnx-int8` p50 30.5 ms = 1.60× its in-process 19.1 ms (limit 23.9 ms: missed)" in line
    assert "`onnx` p50 40.0 ms = 1.18× its in-process 34.0 ms (limit 42.5 ms: met)" in line


def test_no_backend_meeting_the_target_is_said_plainly() -> None:
    (line,) = _targets(results({"pytorch": 95.5}, {"pytorch": 60.1}))
    assert "met for 0 of 1 backends." in line and "missed" in line
