"""The fastinfer command line produces parseable results with the expected fields."""

from __future__ import annotations

import json

from fastinfer import cli, hardware
from fastinfer.config import BACKENDS


def test_doctor_reports_hardware_backends_and_a_recommendation(built_models, tmp_path, capsys) -> None:
    out = tmp_path / "doctor.json"
    assert cli.main(["doctor", "--json", str(out), "--profile", str(tmp_path / "none.json")]) == 0
    report = json.loads(out.read_text())
    assert {"os", "cpu", "cores", "cores_source", "isa", "neural_engine", "cuda", "mps"} <= report["hardware"].keys()
    assert set(report["backends"]) == set(BACKENDS)
    onnx = report["backends"]["onnx"]
    assert onnx["available"] and onnx["node_placement"]["CPUExecutionProvider"].endswith("nodes")
    int8 = report["backends"]["openvino-int8"]
    assert int8["available"] and int8["layer_precision"]["Convolution"].endswith(" 53/53") and not int8["fallbacks"]
    assert report["backends"]["openvino"]["precision"] in ("bf16", "f32")
    assert report["recommended"]["backend"] in BACKENDS and "(rule)" in report["recommended"]["why"]
    printed = capsys.readouterr().out
    assert "recommended here:" in printed and "Convolution u8 53/53" in printed


def test_doctor_says_where_the_core_count_came_from(monkeypatch, tmp_path, capsys) -> None:
    # A container limited to 1.5 CPUs (cgroup v2) on a 64-core machine, laid out in tmp_path.
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("150000 100000\n")
    budget = hardware.probe_cpu_budget(tmp_path, affinity=64)
    monkeypatch.setattr(hardware, "cpu_budget", lambda: budget)
    monkeypatch.setattr(cli, "_available", dict)  # no backends: only the machine is under test
    out = tmp_path / "doctor.json"
    assert cli.main(["doctor", "--json", str(out), "--profile", str(tmp_path / "none.json")]) == 0
    printed = capsys.readouterr().out
    assert "  cores          2 — cgroup v2 cpu.max 150000/100000 → 2 (CPU affinity 64)\n" in printed
    report = json.loads(out.read_text())["hardware"]
    assert (report["cores"], report["cores_source"]) == (2, budget.source)


def test_bench_then_doctor_recommends_from_measurements(built_models, tmp_path, capsys) -> None:
    bench = tmp_path / "bench.json"
    assert cli.main(["bench", "--batches", "1", "--repeats", "2", "--json", str(bench)]) == 0
    data = json.loads(bench.read_text())
    rows = {r["backend"]: r for r in data["engines"]}
    assert {"pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8"} <= rows.keys()
    assert all(r["median_ms"] > 0 and r["batch"] == 1 for r in rows.values())
    assert "× vs onnx FP32" in capsys.readouterr().out
    doctor = tmp_path / "doctor.json"
    cli.main(["doctor", "--json", str(doctor), "--profile", str(bench)])
    rec = json.loads(doctor.read_text())["recommended"]
    assert rec["backend"] == max(rows, key=lambda n: rows[n]["images_per_s"]) and "profile" in rec["why"]


def test_fidelity_writes_a_table_and_json(built_models, tmp_path, capsys) -> None:
    out = tmp_path / "fidelity.json"
    assert cli.main(["fidelity", "--json", str(out)]) == 0
    rows = {r["backend"]: r for r in json.loads(out.read_text())}
    assert {"onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8"} <= rows.keys()
    assert rows["onnx"]["top1_agreement"] == 1.0 and rows["onnx"]["gate"] == "fp32"
    assert all(r["gate_passed"] for r in rows.values()), rows
    assert rows["openvino-int8"]["gate"] == "int8"
    assert rows["openvino"]["gate"] == {"bf16": "bf16", "f32": "fp32"}[rows["openvino"]["precision"]]
    assert "| backend | runs at | images | top-1 agreement" in capsys.readouterr().out
