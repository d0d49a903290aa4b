"""The fastinfer command line produces parseable results with the expected fields, and says in plain
words what each command, option and number is."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from fastinfer import cli
from fastinfer.catalog import backends, config
from fastinfer.catalog.config import BACKENDS
from fastinfer.common import hardware
from tests.conftest import doctor_report


def test_doctor_reports_hardware_backends_and_a_recommendation(built_models, tmp_path, capsys) -> None:
    report = doctor_report(tmp_path)
    assert {"os", "cpu", "cores", "cores_source", "isa", "neural_engine", "cuda", "mps"} <= report["hardware"].keys()
    assert set(report["backends"]) == set(BACKENDS)
    onnx = report["backends"]["onnx"]
    assert onnx["available"] and onnx["node_placement"]["CPUExecutionProvider"].endswith("nodes")
    int8 = report["backends"]["openvino-int8"]
    assert int8["available"] and int8["layer_precision"]["Convolution"].endswith(" 53/53") and not int8["fallbacks"]
    assert report["backends"]["openvino"]["precision"] in ("bf16", "f32")
    assert report["recommended"]["backend"] in BACKENDS and report["recommended"]["source"] == "rule"
    assert report["default"]["backend"] == report["recommended"]["backend"]  # FASTINFER_DEFAULT_BACKEND=auto
    printed = capsys.readouterr().out
    assert "recommended here:" in printed and "Convolution layers run in u8: 53 of 53" in printed


def test_doctor_says_where_the_core_count_came_from(monkeypatch, tmp_path, capsys) -> None:
    # A container limited to 1.5 CPUs (cgroup v2) on a 64-core machine, laid out in tmp_path.
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("150000 100000\n")
    budget = hardware.probe_cpu_budget(tmp_path, affinity=64)
    monkeypatch.setattr(hardware, "cpu_budget", lambda: budget)
    monkeypatch.setattr(cli, "_available", dict)  # no backends: only the machine is under test
    report = doctor_report(tmp_path)["hardware"]
    printed = capsys.readouterr().out
    assert "  cores          2 — cgroup v2 cpu.max 150000/100000 → 2 (CPU affinity 64)\n" in printed
    assert (report["cores"], report["cores_source"]) == (2, budget.source)
    # Nothing can run (no backends here): said, not an empty name called "the only backend available".
    assert "recommended here: none — no backend can run here" in printed


def test_doctor_says_a_tuned_file_that_is_a_symlink_loop_is_ignored(monkeypatch, tmp_path, capsys) -> None:
    loop = tmp_path / "tuned.json"
    loop.symlink_to(loop)
    monkeypatch.setenv("FASTINFER_TUNED", str(loop))
    monkeypatch.delenv("FASTINFER_TUNED_RESOLVED", raising=False)
    monkeypatch.setattr(cli, "_available", dict)  # no backends: only the tuned file is under test
    config.get_settings.cache_clear()  # read with this environment, and left for no other test
    try:
        report = doctor_report(tmp_path)
    finally:
        config.get_settings.cache_clear()
    said = "tuned configuration (tuned.json): ignored — unreadable (OSError: Too many levels of symbolic links)\n"
    assert said in capsys.readouterr().out and report["tuned"]["status"] == "ignored"


def shown_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[Any, str]:
    """``fastinfer ARGV --help``: the parser that printed it (fastinfer's or build_models') and the text."""
    shown: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.print_help

    def print_help(self: argparse.ArgumentParser, file: Any = None) -> None:
        shown.append(self)
        real(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", print_help)
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, "--help"])
    assert exited.value.code == 0
    (parser,) = shown
    return parser, capsys.readouterr().out


def help_problems(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """What a reader of this --help would miss: a description, a help for each option and command;
    and reStructuredText that argparse prints as written."""
    problems = [] if (parser.description or "").strip() else [f"{parser.prog}: no description"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            problems += [f"{parser.prog} {a.dest}: no help" for a in action._choices_actions if not a.help]
        elif not action.help or action.help == argparse.SUPPRESS:
            problems.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}: no help")
    if "``" in text or ":func:" in text or ":class:" in text:
        problems.append(f"{parser.prog}: reStructuredText in --help")
    return problems


def test_every_command_s_help_says_what_it_does_in_plain_text(monkeypatch, capsys) -> None:
    top, text = shown_help(monkeypatch, capsys)
    problems = help_problems(top, text)
    (commands,) = [a.choices for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"build", "doctor", "fidelity", "bench", "profile"} <= commands.keys()
    for name in commands:
        parser, text = shown_help(monkeypatch, capsys, name)
        problems += help_problems(parser, text)
    assert problems == []


class FakeEngine:
    def __init__(self, described: dict[str, Any]) -> None:
        self.described = described

    def describe(self) -> dict[str, Any]:
        return self.described


DESCRIBED = {  # what each engine's describe() says here (AMD EPYC with AVX-512 BF16), trimmed
    "pytorch": {"device": "cpu", "threads": 2, "precision": "fp32"},
    "onnx": {"node_placement": {"CPUExecutionProvider": "70/70 nodes"}, "fallbacks": []},
    "openvino": {
        "precision": "f32",
        "precision_requested": "f32",
        "layer_precision": {"Convolution": "f32 53/53"},
        "fallbacks": [],
    },
    "openvino-int8": {
        "precision": "bf16",
        "precision_requested": "auto",
        "layer_precision": {"Convolution": "u8 50/53, f32 3/53", "FullyConnected": "u8 1/1"},
        "fallbacks": ["3/53 Convolution layers do not run in INT8: 3 in f32"],
    },
}


def test_doctor_says_what_each_precision_it_prints_means(monkeypatch, tmp_path, capsys) -> None:
    """OpenVINO's precision hint (for float layers) and what the layers run in, each said as what it is."""
    monkeypatch.setattr(cli, "_available", lambda: dict.fromkeys(DESCRIBED))
    monkeypatch.setattr(backends, "open_engine", lambda name: FakeEngine(DESCRIBED[name]))
    monkeypatch.setattr(hardware, "probe", lambda check_torch=False: {"os": "Linux", "cpu": "AMD EPYC", "isa": []})
    assert cli.main(["doctor", "--profile", str(tmp_path / "none.json")]) == 0
    printed = capsys.readouterr().out
    indent = " " * 23
    assert f"  pytorch            available\n{indent}computes in fp32\n" in printed
    assert f"{indent}CPUExecutionProvider runs 70/70 nodes of the graph\n" in printed
    assert (
        f"  openvino-int8      available\n"
        f"{indent}inference precision hint: bf16 (OpenVINO's default on this CPU): layers not quantized compute in it\n"
        f"{indent}Convolution layers run in u8: 50 of 53, f32: 3 of 53\n"
        f"{indent}FullyConnected layers run in u8: 1 of 1\n"
        f"{indent}WARNING: 3/53 Convolution layers do not run in INT8: 3 in f32\n"
    ) in printed
    assert f"{indent}inference precision hint: f32 (as set by FASTINFER_OPENVINO_PRECISION=f32)" in printed
    for old in ("precision bf16 (requested auto)", "Convolution u8", "requested None"):
        assert old not in printed, old


def test_a_layer_summary_in_another_form_is_printed_as_it_is() -> None:
    assert cli._per_precision("u8 53/53") == "u8: 53 of 53"
    assert cli._per_precision("mixed") == "mixed"


def test_bench_then_doctor_recommends_from_measurements(built_models, tmp_path, capsys) -> None:
    bench = tmp_path / "bench.json"
    assert cli.main(["bench", "--batches", "1", "--repeats", "2", "--json", str(bench)]) == 0
    data = json.loads(bench.read_text())
    rows = {r["backend"]: r for r in data["engines"]}
    assert {"pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8"} <= rows.keys()
    assert all(r["median_ms"] > 0 and r["batch"] == 1 for r in rows.values())
    assert "× vs onnx FP32" in capsys.readouterr().out
    doctor = tmp_path / "doctor.json"
    assert cli.main(["doctor", "--json", str(doctor), "--profile", str(bench)]) == 0
    report = json.loads(doctor.read_text())
    rec, default = report["recommended"], report["default"]  # FASTINFER_DEFAULT_BACKEND=auto follows the measurement
    assert rec["backend"] == max(rows, key=lambda n: rows[n]["images_per_s"]) and rec["source"] == "measured"
    assert (default["backend"], default["source"]) == (rec["backend"], "measured")
