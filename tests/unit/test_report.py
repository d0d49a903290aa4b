"""BENCHMARKS.md's target lines say what was measured, limit and verdict in the right places."""

from __future__ import annotations

from load_tests.report import _openvino_targets, _per_core, _targets


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


def at10(rps: dict[str, float], failures: int = 0) -> list[dict]:
    return [
        {"scenario": "inference", "backend": b, "users": 10, "req_per_s": r, "failures": failures}
        for b, r in rps.items()
    ]


def test_openvino_targets_are_ratios_of_one_run_with_the_bf16_verdict() -> None:
    fidelity = [
        {"backend": "openvino", "precision": "bf16", "gate": "bf16", "gate_passed": True, "top1_agreement": 1.0,
         "top5_overlap": 0.99, "max_abs_error": 0.39},
    ]  # fmt: skip
    runs = at10({"onnx-int8": 40.0, "openvino-int8": 56.0, "onnx": 20.0, "openvino": 30.0})
    int8, bf16 = _openvino_targets({"runs": runs, "profile": {"fidelity": fidelity}})
    assert "`openvino-int8` >= 1.3× `onnx-int8` at 10 clients, zero errors: met.** 56.0 vs 40.0 req/s = 1.40×" in int8
    assert "zero errors: NOT met.** 30.0 vs 20.0 req/s = 1.50×" in bf16
    assert "ran in BF16; BF16 fidelity gates passed" in bf16
    (failing,) = _openvino_targets({"runs": at10({"onnx-int8": 40.0, "openvino-int8": 60.0}, failures=2)})
    assert "NOT met" in failing and "2 errors" in failing


def test_per_core_throughput_is_wall_time_over_cores_beside_the_anchors() -> None:
    stages = [
        {"stage": "inference", "detail": "openvino-int8 b1", "wall_ms": 12.5},
        {"stage": "inference", "detail": "openvino-int8 b8", "wall_ms": 10.0},
    ]
    text = "\n".join(_per_core({"profile": {"cores": 2, "stages": stages}}))
    assert "| `openvino-int8` | 40.0 | 50.0 | Xeon with AMX ~170–200" in text
