"""The default backend follows the machine: measured here when a bench of this machine exists, else
by rule; FASTINFER_DEFAULT_BACKEND names one to override it. Stand-ins for other machines' probes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastinfer.catalog import choice
from fastinfer.catalog.backends import BACKENDS
from tests.settings import settings_with

EVERY = ["pytorch", "onnx", "onnx-int8", "onnx-int8-dynamic", "openvino", "openvino-int8", "coreml-batched"]
VNNI = {"machine": "x86_64", "cpu": "AMD EPYC", "cores": 2, "isa": ["avx2", "avx512f", "avx512_vnni"], "cuda": False}
AVX2 = {"machine": "x86_64", "cpu": "AMD EPYC", "cores": 2, "isa": ["avx2"], "cuda": False}
ARM_LINUX = {"machine": "aarch64", "cpu": "Neoverse-N1", "cores": 4, "isa": ["neon"], "cuda": False}


NO_OPENVINO = [b for b in EVERY if not b.startswith("openvino")]
MAC = {"isa": ["neon"], "machine": "arm64", "neural_engine": True, "apple_chip": "M3"}
BF16_ONLY = {"isa": ["avx512", "avx512_bf16"], "cuda": False}  # no machine: not known to be x86


@pytest.mark.parametrize(
    ("hw", "available", "backend", "why"),
    [
        (VNNI, EVERY, "openvino-int8", "VNNI"),
        (AVX2, EVERY, "openvino-int8", "without integer dot-product units"),
        (VNNI, NO_OPENVINO, "onnx-int8", "static INT8"),
        (AVX2, NO_OPENVINO, "onnx-int8", "static INT8"),
        (BF16_ONLY, ["pytorch", "onnx", "openvino"], "openvino", "BF16"),
        (MAC, EVERY, "coreml-batched", "Neural Engine"),
        ({**VNNI, "cuda": True}, EVERY, "onnx", "CUDA"),
        (ARM_LINUX, EVERY, "onnx", "no integer units"),  # no x86 INT8 rule on ARM
    ],
)
def test_the_rule_picks_each_machines_backend(hw, available, backend, why) -> None:
    rec = choice.recommend(hw, available)
    assert (rec["backend"], rec["source"]) == (backend, "rule") and why in rec["why"], rec


def test_measurements_beat_the_rule_among_what_can_run() -> None:
    rec = choice.recommend(VNNI, EVERY, {"onnx-int8": 60.0, "openvino-int8": 50.0, "coreml": 999.0})
    assert rec == {"backend": "onnx-int8", "why": "highest measured throughput here (60.0 img/s)", "source": "measured"}


def test_a_recommendation_by_default_says_what_it_is() -> None:
    no_rule = choice.recommend({"isa": []}, ["pytorch", "onnx-int8-dynamic"])
    assert no_rule["backend"] == "pytorch" and "only" not in no_rule["why"]
    assert choice.recommend({"isa": []}, ["pytorch"])["why"] == "the only backend available here"
    assert choice.recommend({"isa": []}, [])["backend"] == ""


def bench_file(tmp_path: Path, hw: dict, rows: list[tuple[str, int, float]]) -> Path:
    path = tmp_path / "bench.json"
    engines = [{"backend": b, "batch": n, "images_per_s": r} for b, n, r in rows]
    path.write_text(json.dumps({"hardware": hw, "engines": engines}))
    return path


def test_a_bench_of_this_machine_is_a_measurement_its_best_batch_counts(tmp_path) -> None:
    path = bench_file(tmp_path, AVX2, [("onnx", 1, 10.0), ("onnx", 8, 12.0), ("openvino-int8", 8, 30.0)])
    measured, why = choice.measured_here(path, {**AVX2, "os": "another kernel"})
    assert measured == {"onnx": 12.0, "openvino-int8": 30.0} and "fastinfer bench" in why


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "no bench result"),
        ("{", "not a bench result (JSONDecodeError)"),
        ('{"engines": []}', "not a bench result (KeyError)"),
        ('{"hardware": {}, "engines": [{"backend": "onnx", "images_per_s": "fast"}]}', "not a bench result"),
        ("[1, 2]", "not a bench result (TypeError)"),
        ("[" * 50_000, "(RecursionError)"),
        ('{"hardware": [], "engines": []}', "(TypeError)"),
        ('{"hardware": {}, "engines": [{"backend": "onnx", "images_per_s": "nan"}]}', "another machine"),
        (json.dumps({"hardware": VNNI, "engines": [{"backend": "onnx-int8", "images_per_s": 80.0}]}),
         "another machine (isa differ)"),
    ],
)  # fmt: skip
def test_a_missing_broken_or_foreign_bench_result_is_a_reason_never_a_crash(tmp_path, content, said) -> None:
    path = tmp_path / "bench.json"
    if content is not None:
        path.write_text(content)
    measured, why = choice.measured_here(path, AVX2)
    assert measured is None and said in why


def test_auto_follows_the_machine_and_a_named_backend_wins() -> None:
    auto = choice.choose_default("auto", AVX2, EVERY)
    assert (auto.backend, auto.requested, auto.source) == ("openvino-int8", "auto", "rule")
    assert auto.describe().startswith("`openvino-int8` (FASTINFER_DEFAULT_BACKEND=auto, rule: ")
    measured = choice.choose_default("auto", AVX2, EVERY, {"onnx-int8": 40.0, "openvino-int8": 35.0})
    assert (measured.backend, measured.source) == ("onnx-int8", "measured")
    named = choice.choose_default("onnx", AVX2, EVERY, {"onnx-int8": 40.0})
    assert (named.backend, named.source) == ("onnx", "environment")
    assert named.describe() == "`onnx` (FASTINFER_DEFAULT_BACKEND)"
    # Nothing can run here: a backend all the same, whose 503 says why, never an empty name.
    assert choice.choose_default("auto", AVX2, []).backend == choice.LAST_RESORT


def test_the_setting_accepts_auto_and_backends_only(monkeypatch) -> None:
    assert settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND").default_backend == "auto"
    assert settings_with(monkeypatch, FASTINFER_DEFAULT_BACKEND=" onnx-int8 ").default_backend == "onnx-int8"
    with pytest.raises(ValueError, match="must be auto or one of"):
        settings_with(monkeypatch, FASTINFER_DEFAULT_BACKEND="fastest")


@pytest.fixture
def resolving(monkeypatch, tmp_path) -> Iterator[None]:
    """``auto`` resolved afresh on an AVX2 machine where only onnx and onnx-int8 can run, with no bench."""
    monkeypatch.setattr(choice.hardware, "probe", lambda: AVX2)
    monkeypatch.setattr(choice, "unavailable_reason", lambda name: None if name in ("onnx", "onnx-int8") else "no")
    monkeypatch.setattr(choice, "bench_result", lambda: tmp_path / "none.json")
    monkeypatch.setattr(choice, "served_result", lambda: tmp_path / "none.json")
    choice._resolved.cache_clear()
    yield
    choice._resolved.cache_clear()


def test_the_process_default_resolves_once_per_setting(monkeypatch, resolving) -> None:
    settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND")
    assert choice.default_choice().backend == "onnx-int8"  # openvino-int8 cannot run: the next rule
    settings_with(monkeypatch, FASTINFER_DEFAULT_BACKEND="pytorch")
    assert choice.default_choice().backend == "pytorch"
    assert set(EVERY) <= set(BACKENDS)


def test_a_chosen_default_that_cannot_answer_gives_way_to_the_next_choice_a_named_one_does_not() -> None:
    failed = {"openvino-int8": "OpenVINO compile_model crashed with SIGFPE on this CPU"}
    chosen = choice.choose_default("auto", AVX2, EVERY)
    now = choice.default_now(chosen, AVX2, EVERY, failed.get)
    assert now.backend == "onnx-int8" and "openvino-int8 cannot answer here (OpenVINO compile_model" in now.why
    assert choice.default_now(chosen, AVX2, EVERY, {}.get) == chosen  # nothing failed: as chosen
    named = choice.choose_default("openvino-int8", AVX2, EVERY)
    assert choice.default_now(named, AVX2, EVERY, failed.get) == named  # the operator's choice stays (503s say why)
    nothing = choice.default_now(chosen, AVX2, EVERY, lambda name: "down")
    assert nothing == chosen  # no other can answer either: as chosen, its 503 says why


def served(runs: list[dict], hw: dict | None = None) -> str:
    return json.dumps({"hardware": hw or AVX2, "runs": runs})


def test_what_make_bench_served_here_beats_the_in_process_figures(tmp_path, monkeypatch) -> None:
    runs = [
        {"scenario": "inference", "backend": "onnx-int8", "users": 10, "req_per_s": 25.7, "failures": 0},
        {"scenario": "inference", "backend": "openvino-int8", "users": 10, "req_per_s": 31.1, "failures": 0},
        {"scenario": "inference", "backend": "onnx", "users": 10, "req_per_s": 40.0, "failures": 3},  # erred
        {"scenario": "inference", "backend": "openvino", "users": 32, "req_per_s": 50.0, "failures": 0},  # not 10
        {"scenario": "repeat", "backend": "pytorch", "users": 10, "req_per_s": 90.0, "failures": 0},  # the cache
    ]
    (tmp_path / "results.json").write_text(served(runs))
    engines = [{"backend": "onnx-int8", "images_per_s": 29.9}, {"backend": "openvino-int8", "images_per_s": 28.3}]
    (tmp_path / "bench.json").write_text(json.dumps({"hardware": AVX2, "engines": engines}))
    monkeypatch.setattr(choice, "served_result", lambda: tmp_path / "results.json")
    monkeypatch.setattr(choice, "bench_result", lambda: tmp_path / "bench.json")
    measured, unit = choice.measurements(AVX2)
    assert measured == {"onnx-int8": 25.7, "openvino-int8": 31.1} and unit.startswith("req/s served at 10 clients")
    rec = choice.recommend(AVX2, EVERY, measured, unit)
    assert rec["backend"] == "openvino-int8" and "31.1 req/s served" in rec["why"]
    (tmp_path / "results.json").write_text(served(runs, {**AVX2, "cores": 64}))  # another machine: in process
    measured, unit = choice.measurements(AVX2)
    assert max(measured, key=measured.get) == "onnx-int8" and unit.startswith("img/s in process")
    (tmp_path / "bench.json").unlink()
    assert choice.measurements(AVX2)[0] is None


@pytest.mark.parametrize("content", ["[" * 50_000, '{"hardware": {}, "runs": 3}', '{"runs": []}', "not json"])
def test_a_served_result_of_any_shape_is_a_reason_never_a_crash(tmp_path, content) -> None:
    (tmp_path / "results.json").write_text(content)
    assert choice.served_here(tmp_path / "results.json", AVX2)[0] is None


def test_a_bench_of_fewer_backends_does_not_overrule_the_rule_or_a_fuller_bench(tmp_path, monkeypatch) -> None:
    (tmp_path / "results.json").write_text(
        served([{"scenario": "inference", "backend": "onnx", "users": 10, "req_per_s": 9.0, "failures": 0}])
    )
    engines = [{"backend": "onnx", "images_per_s": 12.0}, {"backend": "openvino-int8", "images_per_s": 30.0}]
    (tmp_path / "bench.json").write_text(json.dumps({"hardware": AVX2, "engines": engines}))
    monkeypatch.setattr(choice, "served_result", lambda: tmp_path / "results.json")
    monkeypatch.setattr(choice, "bench_result", lambda: tmp_path / "bench.json")
    measured, unit = choice.measurements(AVX2)
    assert measured == {"onnx": 12.0, "openvino-int8": 30.0} and unit == choice.IN_PROCESS_UNIT
    available = ["onnx", "onnx-int8", "openvino-int8"]
    assert choice.choose_default("auto", AVX2, available, measured, unit=unit).backend == "openvino-int8"
    assert choice.recommend(AVX2, available, {"onnx": 9.0}) == choice.recommend(AVX2, available)  # the rule's


def test_auto_passes_over_a_backend_whose_build_measured_it_over_the_limit(monkeypatch, resolving) -> None:
    lossy = {"onnx-int8": "its build measured a top-1 drop of 3.33 pp"}
    monkeypatch.setattr(choice, "over_accuracy_limit", lossy.get)
    chosen = choice._resolved("auto", "environment")
    assert chosen.backend == "onnx"
    assert chosen.why.endswith("; passed over for accuracy: onnx-int8: " + lossy["onnx-int8"])
    # With nothing else that can run, the one over the limit is served (not an unstored onnx's 503).
    monkeypatch.setattr(choice, "unavailable_reason", lambda name: None if name == "onnx-int8" else "no")
    choice._resolved.cache_clear()
    alone = choice._resolved("auto", "environment")
    assert alone.backend == "onnx-int8" and "passed over" not in alone.why


def test_a_stored_drop_over_the_familys_limit_is_read_from_the_model(private_store: Path) -> None:
    import yaml

    from fastinfer.catalog.backends import over_accuracy_limit

    folder = private_store / "models" / "resnet50-onnx-int8"
    record = folder / (folder / "latest").read_text().strip() / "model.yaml"
    info = yaml.safe_load(record.read_text())
    assert over_accuracy_limit("onnx-int8") is None  # built without --eval-dir: nothing measured
    for top1, over in ((0.95, False), (0.9, True)):
        measured = {"top1": top1, "reference_top1": 0.96, "max_accuracy_drop_pp": 1.0, "images": 60}
        record.write_text(yaml.safe_dump({**info, "metadata": {**info["metadata"], "accuracy": measured}}))
        said = over_accuracy_limit("onnx-int8")
        assert (said is not None) == over, said
    for odd in ({"top1": float("nan")}, {"max_accuracy_drop_pp": -1.0}, {"top1": False, "reference_top1": True},
                {"reference_top1": 10**400}, {"max_accuracy_drop_pp": float("inf")}):  # fmt: skip
        record.write_text(yaml.safe_dump({**info, "metadata": {**info["metadata"], "accuracy": {**measured, **odd}}}))
        assert over_accuracy_limit("onnx-int8") is None, odd  # not what a build writes: nothing measured
    assert said == (
        "its build measured a top-1 drop of 6.00 pp against PyTorch on 60 photos, over the family's limit of 1 pp"
    )
