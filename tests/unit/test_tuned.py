"""The tuned file: in force only where it was measured (this machine, these runtimes, these models),
below the environment, and never a failed start: corrupt, truncated, foreign or stale files are
ignored with the reason."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastinfer.catalog import backends, choice, config, tune_space, tuned
from tests.settings import settings_with

ROOT = Path(__file__).resolve().parents[2]

HERE = {
    "machine": "x86_64",
    "cpu": "AMD EPYC",
    "cores": 2,
    "isa": ["avx2"],
    "runtimes": {"openvino": "1", "torch": "2"},
}
STORED = {"resnet50-onnx-int8": "resnet50-onnx-int8:abc"}
CAN_RUN: dict[str, str | None] = {"onnx-int8": None, "onnx": None, "coreml-batched": "CoreML prediction needs macOS"}
EVERY_BACKEND_RUNS: dict[str, str | None] = dict.fromkeys(backends.BACKENDS)


def tuned_data(**change) -> dict:
    data = {
        "format": tuned.FORMAT,
        "created": "2026-12-04 20:00 UTC",
        "goal": "throughput: most req/s at 10 clients",
        "settings": {"FASTINFER_DEFAULT_BACKEND": "onnx-int8", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8": "16"},
        "fingerprint": {**HERE, "models": dict(STORED)},
    }
    data.update(change)
    return data


def resolved(settings: object = None, **fields: object) -> str:
    """RESOLVED_ENV as `bentoml serve`'s parent sets it for a tuned file in force with ``settings``."""
    given = {"path": "t", "settings": settings or {}, "status": "in force", "why": "", "created": "", "goal": ""}
    return json.dumps({**given, **fields})


def chose(backend: str, **more: str) -> dict[str, str]:
    """Settings as the tuner writes them: the backend it chose, and what it changed for it."""
    return {"FASTINFER_DEFAULT_BACKEND": backend, **more}


def test_a_file_measured_here_is_in_force() -> None:
    settings, why = tuned.check(tuned_data(), HERE, STORED, CAN_RUN)
    assert why == "in force" and settings["FASTINFER_MAX_BATCH_SIZE_ONNX_INT8"] == "16"


NOT_CHOSEN = [  # settings, and what the reason says
    (chose("openvino-int8", FASTINFER_MAX_LATENCY_MS_OPENVINO_INT8="10000"), "LATENCY_MS_OPENVINO_INT8='10000'"),
    (chose("pytorch", FASTINFER_MAX_BATCH_SIZE_PYTORCH="1024"), "FASTINFER_MAX_BATCH_SIZE_PYTORCH='1024'"),
    (chose("onnx-int8", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8="8"), "BATCH_SIZE_ONNX_INT8='8'"),  # the table's
    (chose("onnx-int8", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8="016"), "BATCH_SIZE_ONNX_INT8='016'"),
    (chose("onnx-int8", FASTINFER_MAX_LATENCY_MS_ONNX_INT8="3"), "FASTINFER_MAX_LATENCY_MS_ONNX_INT8='3'"),
    (chose("onnx-int8", FASTINFER_MAX_BATCH_SIZE_ONNX="16"), "never sets FASTINFER_MAX_BATCH_SIZE_ONNX "),
    (chose("onnx-int8", FASTINFER_BATCHING_ONNX_INT8="false"), "never sets FASTINFER_BATCHING_ONNX_INT8"),
    (chose("onnx-int8", FASTINFER_RUNNER_WORKERS="2"), "never sets FASTINFER_RUNNER_WORKERS"),
    (chose("onnx-int8-dynamic", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8_DYNAMIC="4"), "never sets"),  # no batching
    (chose("onnx-int8", FASTINFER_THREADS="2"), "FASTINFER_THREADS='2'"),  # 2 cores: 0 or 1
    (chose("onnx-int8", FASTINFER_IN_FRONT="onnx"), "FASTINFER_IN_FRONT='onnx'"),  # another backend's engine
    (chose("onnx-int8", FASTINFER_IN_FRONT="none"), "FASTINFER_IN_FRONT='none'"),
    (chose("onnx-int8", FASTINFER_IN_FRONT="onnx-int8,onnx"), "FASTINFER_IN_FRONT='onnx-int8,onnx'"),
    (chose("onnx-int8", FASTINFER_IN_FRONT="onnx-int8", FASTINFER_FRONT_WORKERS="2"), "together"),
    (chose("onnx-int8", FASTINFER_DECODE_THREADS="2"), "FASTINFER_DECODE_THREADS='2'"),  # 2 cores: 0 or 1
    (chose("onnx-int8", FASTINFER_DECODE_THREADS="-1"), "FASTINFER_DECODE_THREADS='-1'"),
    (chose("auto"), "names no backend `fastinfer tune` chooses: 'auto'"),
    (chose("coreml"), "names no backend `fastinfer tune` chooses: 'coreml'"),  # coreml-batched is measured
    ({"FASTINFER_MAX_BATCH_SIZE_ONNX_INT8": "16"}, "names no backend: it sets no FASTINFER_DEFAULT_BACKEND"),
]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ([1, 2], "not a tuned file"),
        (tuned_data(format=99), "not a tuned file of format 1"),
        (tuned_data(settings=None), "settings or fingerprint are missing"),
        (tuned_data(fingerprint={**HERE}), "settings or fingerprint are missing"),
        (tuned_data(settings={"FASTINFER_API_KEYS": "x" * 20}), "sets what tuning may not: FASTINFER_API_KEYS"),
        (tuned_data(settings={"FASTINFER_THREADS": 2}), "values must be strings, as in the environment"),
        (tuned_data(settings={"FASTINFER_BATCHING_NOPE": "true"}), "sets what tuning may not"),
        (tuned_data(settings={}), "it sets nothing"),
        (tuned_data(fingerprint={**HERE, "models": {}}), "records no model versions"),
        (
            tuned_data(settings=chose("onnx-int8", FASTINFER_FRONT_WORKERS="64")),
            "FASTINFER_FRONT_WORKERS='64' is not a value `fastinfer tune` chooses for onnx-int8 on 2 cores ('1', '2')",
        ),
        (
            tuned_data(fingerprint={**HERE, "isa": ["avx512_vnni"], "models": STORED}),
            "another machine or runtime (isa)",
        ),
        (tuned_data(fingerprint={**HERE, "cores": 64, "models": STORED}), "another machine or runtime (cores)"),
        (
            tuned_data(fingerprint={**HERE, "runtimes": {"openvino": "0", "torch": "2"}, "models": STORED}),
            "another machine or runtime (openvino 0 → 1)",
        ),
        (tuned_data(fingerprint={**HERE, "models": {"resnet50-onnx-int8": "resnet50-onnx-int8:old"}}), "no longer"),
        (tuned_data(settings=chose("fastest")), "names no backend `fastinfer tune` chooses: 'fastest'"),
        (tuned_data(settings=chose("coreml-batched")), "chose coreml-batched, which cannot run here: CoreML"),
        # Only the settings and values the tuner chooses from:
        *((tuned_data(settings=settings), said) for settings, said in NOT_CHOSEN),
    ],
)
def test_a_file_that_does_not_hold_here_is_ignored_with_the_reason(data, said) -> None:
    settings, why = tuned.check(data, HERE, STORED, {**EVERY_BACKEND_RUNS, **CAN_RUN})
    assert settings == {} and said in why and len(why) <= tuned.MAX_WHY, why


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "unreadable (JSONDecodeError"),
        (b'{"format": 1, "settings": {"FASTINFER_DEF', "unreadable (JSONDecodeError"),  # truncated
        (b"\xff\xfe\x00garbage", "unreadable ("),
        (b"null", "not a tuned file"),
        (b'{"format": 1, "fingerprint": [], "settings": {}}', "settings or fingerprint are missing"),
        (b"[" * 50_000, "unreadable (RecursionError"),  # deeper than the JSON parser goes
        (b"{" + b" " * (tuned.MAX_BYTES + 1) + b"}", "larger than"),
    ],
)
def test_a_corrupt_or_truncated_file_is_ignored_never_raised(tmp_path, content, said) -> None:
    path = tmp_path / "tuned.json"
    path.write_bytes(content)
    found = tuned.load(path)
    assert (found.status, found.settings) == ("ignored", {}) and said in found.why


def test_a_missing_file_or_off_is_no_configuration(tmp_path, monkeypatch) -> None:
    assert tuned.load(tmp_path / "none.json").status == "none"
    monkeypatch.setenv(tuned.FILE_ENV, "off")
    assert tuned.path() is None and tuned.load().status == "none"
    monkeypatch.setenv(tuned.FILE_ENV, str(tmp_path / "mine.json"))
    assert tuned.path() == tmp_path / "mine.json"
    monkeypatch.delenv(tuned.FILE_ENV)
    assert tuned.path() == tuned.default_path() and tuned.default_path().parent.name == "tuned"


@pytest.fixture
def in_force(built_models, monkeypatch, tmp_path) -> Path:
    """A tuned file that holds here: this machine's fingerprint, the store's models as they are."""
    path = tmp_path / "tuned.json"
    models = tuned.model_tags(["resnet50-onnx-int8"])
    assert models["resnet50-onnx-int8"] is not None
    path.write_text(json.dumps(tuned_data(fingerprint={**tuned.machine_fingerprint(), "models": models})))
    monkeypatch.setenv(tuned.FILE_ENV, str(path))
    return path


def rewrite(path: Path, settings: dict[str, str]) -> dict:
    """The tuned file at ``path`` with ``settings`` instead of its own; its data."""
    data = json.loads(path.read_text())
    data["settings"] = settings
    path.write_text(json.dumps(data))
    return data


def test_its_values_become_the_settings_below_the_environment(in_force, monkeypatch) -> None:
    unset = ("FASTINFER_DEFAULT_BACKEND", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8")
    settings = settings_with(monkeypatch, *unset, "FASTINFER_DECODE_THREADS")
    assert settings.tuned["status"] == "in force", settings.tuned
    assert settings.default_backend == "onnx-int8" and settings.batching_for("onnx-int8").max_batch_size == 16
    assert settings.sources == {"FASTINFER_DEFAULT_BACKEND": "tuned", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8": "tuned"}
    assert settings.decode_threads == 0  # not in the file: the default
    # The operator's variable wins, and says so.
    settings = settings_with(monkeypatch, FASTINFER_MAX_BATCH_SIZE_ONNX_INT8="4")
    assert settings.batching_for("onnx-int8").max_batch_size == 4
    assert settings.sources["FASTINFER_MAX_BATCH_SIZE_ONNX_INT8"] == "environment"
    shown = choice.configuration(settings, choice.choose_default(settings.default_backend, {}, [], named_by="tuned"))
    assert shown["FASTINFER_DEFAULT_BACKEND"] == {"value": "onnx-int8", "source": "tuned"}
    assert shown["FASTINFER_MAX_BATCH_SIZE_ONNX_INT8"] == {"value": "4", "source": "environment"}
    assert shown["FASTINFER_FRONT_WORKERS"] == {"value": "1", "source": "default"}
    assert shown["FASTINFER_THREADS"]["source"] == "rule"


def test_values_that_clash_with_the_environment_leave_it_out_not_the_server_down(in_force, monkeypatch, caplog):
    rewrite(in_force, chose("onnx-int8", FASTINFER_IN_FRONT="onnx-int8", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8="16"))
    with caplog.at_level(logging.WARNING, logger="fastinfer.tuned"):
        settings = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND", FASTINFER_FRONT_WORKERS="2")  # in front: 1
    assert settings.in_front == frozenset() and settings.front_workers == 2  # all left out:
    assert settings.default_backend == "auto" and settings.batching_for("onnx-int8").max_batch_size == 8
    assert settings.tuned["status"] == "ignored" and "do not hold" in settings.tuned["why"]
    assert "tuned configuration" in caplog.text and "ignored" in caplog.text


def test_a_stale_file_is_ignored_and_the_rule_applies(in_force, monkeypatch) -> None:
    data = json.loads(in_force.read_text())
    data["fingerprint"]["models"] = {"resnet50-onnx-int8": "resnet50-onnx-int8:rebuilt-since"}
    in_force.write_text(json.dumps(data))
    settings = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND")
    assert settings.default_backend == "auto" and settings.sources == {}
    assert settings.tuned["status"] == "ignored" and "no longer served here" in settings.tuned["why"]
    assert config.get_settings.cache_info().currsize == 0  # settings_with leaves nothing cached


def test_auto_set_by_the_operator_still_takes_the_tuned_backend(in_force, monkeypatch) -> None:
    for auto in ("auto", " AUTO ", "Auto"):
        settings = settings_with(monkeypatch, FASTINFER_DEFAULT_BACKEND=auto)
        assert settings.default_backend == "onnx-int8" and settings.sources["FASTINFER_DEFAULT_BACKEND"] == "tuned"
    settings_with(monkeypatch, FASTINFER_DEFAULT_BACKEND="auto")  # and get_settings() reads it afresh
    chosen = choice.default_choice(kept=False)  # what the server resolves, from the settings as parsed
    assert (chosen.backend, chosen.source) == ("onnx-int8", "tuned")


def test_an_error_of_the_environment_is_its_own_not_the_tuned_files(in_force, monkeypatch, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fastinfer.tuned"), pytest.raises(ValueError, match="MAX_BYTES"):
        settings_with(monkeypatch, FASTINFER_MAX_BYTES="abc")
    assert "ignored" not in caplog.text


@pytest.mark.parametrize(
    ("name", "value"),
    [("FASTINFER_MAX_BATCH_SIZE_ONNX_INT8", "0"), ("FASTINFER_MAX_BATCH_SIZE_ONNX_INT8", "100000"),
     ("FASTINFER_MAX_LATENCY_MS_ONNX_INT8", "600000"), ("FASTINFER_MAX_LATENCY_MS_ONNX_INT8", "-1")],
)  # fmt: skip
def test_values_out_of_range_leave_the_file_out_and_refuse_from_the_environment(in_force, monkeypatch, name, value):
    rewrite(in_force, chose("onnx-int8", **{name: value}))
    settings = settings_with(monkeypatch, name)
    assert settings.tuned["status"] == "ignored" and "is not a value `fastinfer tune` chooses" in settings.tuned["why"]
    with pytest.raises(ValueError, match="must be from"):
        settings_with(monkeypatch, **{name: value})


def test_every_process_of_a_server_takes_what_its_parent_read(in_force, monkeypatch) -> None:
    parent = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND")
    tuned.export(parent.tuned)  # what `bentoml serve`'s parent does at deployment
    try:
        in_force.write_text("{changed meanwhile")
        worker = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND")
        assert worker.tuned == parent.tuned and worker.default_backend == "onnx-int8"
    finally:
        os.environ.pop(tuned.RESOLVED_ENV, None)  # set directly, as the server's parent does: removed directly
    assert tuned.here().status == "ignored"  # the file itself, read again without the parent's word
    assert tuned.here().path == in_force.name  # shown by name: not under BentoML's home


@pytest.mark.parametrize("value", ["²", "9" * 5000, "４", "٨"])
def test_counts_in_other_digits_are_refused_with_the_reason_not_as_unreadable(value) -> None:
    settings, why = tuned.check(tuned_data(settings=chose("onnx", FASTINFER_THREADS=value)), HERE, STORED, CAN_RUN)
    assert settings == {} and "is not a value `fastinfer tune` chooses" in why and len(why) < 200


def test_spaces_in_a_tuned_file_read_as_in_the_environment_and_auto_is_no_tuning(in_force, monkeypatch) -> None:
    data = rewrite(
        in_force, chose(" onnx-int8\n", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8=" 16\n", FASTINFER_IN_FRONT="onnx-int8 ")
    )
    unset = ("FASTINFER_DEFAULT_BACKEND", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8", "FASTINFER_IN_FRONT")
    settings = settings_with(monkeypatch, *unset, FASTINFER_FRONT_WORKERS="1")
    assert settings.tuned["status"] == "in force", settings.tuned
    assert settings.default_backend == "onnx-int8" and settings.batching_for("onnx-int8").max_batch_size == 16
    assert settings.in_front == {"onnx-int8"}
    data["settings"]["FASTINFER_DEFAULT_BACKEND"] = "AUTO"  # the tuner always chooses a backend
    in_force.write_text(json.dumps(data))
    settings = settings_with(monkeypatch, *unset)
    assert settings.tuned["status"] == "ignored" and "chooses: 'AUTO'" in settings.tuned["why"]


@pytest.mark.parametrize("value", ["1_000", "٨", "８", "0x8", "1e3", "9" * 16])
def test_a_count_is_plain_ascii_digits(monkeypatch, value) -> None:
    with pytest.raises(ValueError, match="must be an integer"):
        settings_with(monkeypatch, FASTINFER_TUNED="off", FASTINFER_MAX_BATCH_SIZE_ONNX=value)


def test_none_in_the_environment_keeps_every_engine_in_its_runner_over_the_tuned_file(in_force, monkeypatch) -> None:
    rewrite(in_force, chose("onnx-int8", FASTINFER_IN_FRONT="onnx-int8"))
    assert settings_with(monkeypatch, "FASTINFER_IN_FRONT").in_front == {"onnx-int8"}
    settings = settings_with(monkeypatch, FASTINFER_IN_FRONT="None")
    assert settings.in_front == frozenset() and settings.sources["FASTINFER_IN_FRONT"] == "environment"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: the refusal needs an ordinary user")
def test_a_folder_it_may_not_read_is_a_reason_not_a_failed_start(tmp_path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        found = tuned.load(locked / "tuned.json")
        assert found.status == "ignored" and "PermissionError" in found.why and str(tmp_path) not in found.why
    finally:
        locked.chmod(0o755)


def test_an_unreadable_file_says_why_without_its_path(tmp_path, monkeypatch) -> None:
    def refused(where: Path) -> str:
        raise PermissionError(13, "Permission denied", str(where))

    monkeypatch.setattr(tuned, "_read", refused)
    found = tuned.load(tmp_path / "tuned.json")
    assert found.status == "ignored" and found.why == "unreadable (PermissionError: Permission denied)"


@pytest.mark.parametrize(
    "settings",
    [{"FASTINFER_API_KEYS": "k"}, {"FASTINFER_CACHE": "off"}, {"FASTINFER_THREADS": 2}, ["x"]],
)
def test_a_resolved_value_not_from_a_tuned_file_is_refused(monkeypatch, settings) -> None:
    monkeypatch.setenv(tuned.RESOLVED_ENV, resolved(settings))
    assert tuned.here().status == "ignored" and tuned.here().settings == {}


@pytest.mark.parametrize(
    ("in_front", "holds"),
    [("", True), ("onnx", True), (" onnx ", True), ("none", False), ("NONE", False), ("onnx,none", False),
     ("auto", False), ("onnx-int8", False), ("onnx,onnx-int8", False)],
)  # fmt: skip
def test_in_front_in_a_tuned_file_is_the_chosen_backend_or_nothing_as_the_tuner_writes_it(in_front, holds) -> None:
    data = tuned_data(settings=chose("onnx", FASTINFER_IN_FRONT=in_front))
    settings, why = tuned.check(data, HERE, STORED, CAN_RUN)
    assert bool(settings) is holds, why


@pytest.mark.parametrize(
    "resolved",
    [
        "[" * 100_000,  # past the parser's depth
        resolved(status="bogus"),
        resolved(path=["t"]),
    ],
)
def test_a_resolved_value_of_odd_shape_is_refused_not_a_failed_start(monkeypatch, resolved) -> None:
    monkeypatch.setenv(tuned.RESOLVED_ENV, resolved)
    assert tuned.here().status == "ignored"


def test_a_resolved_values_free_text_is_plain(monkeypatch) -> None:
    monkeypatch.setenv(tuned.RESOLVED_ENV, resolved(created="<b>x</b>", goal="[a](b)"))
    assert (tuned.here().created, tuned.here().goal) == ("bx/b", "a(b)")


def test_the_reason_to_ignore_a_file_fits_in_every_workers_environment(tmp_path) -> None:
    fingerprint = {**HERE, "runtimes": {"fastinfer": "9" * 200_000}, "models": dict(STORED)}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(tuned_data(fingerprint=fingerprint)))
    found = tuned.load(path)
    assert found.status == "ignored" and len(found.why) <= tuned.MAX_WHY
    assert len(json.dumps(found.as_dict())) < 128 * 1024  # Linux refuses one environment string beyond it


# ---- a path that cannot be opened: a reason, never a failed start --------------------------------


def _loop(tmp_path: Path) -> Path:
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    return loop


def _loop_above(tmp_path: Path) -> Path:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    return tmp_path / "a" / "tuned.json"


def _dangling(tmp_path: Path) -> Path:
    link = tmp_path / "tuned.json"
    link.symlink_to(tmp_path / "gone.json")
    return link


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "tuned.json"


def _fifo(tmp_path: Path) -> Path:
    """Opening a FIFO for reading blocks until a writer comes: it must not be opened."""
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path / "fifo.json"


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (_loop, "unreadable (OSError: Too many levels of symbolic links)"),
        (_loop_above, "unreadable (OSError: Too many levels of symbolic links)"),
        (_dangling, "a symlink to nothing"),
        (_under_a_file, "unreadable (NotADirectoryError: Not a directory)"),
        (lambda tmp: tmp / ("x" * 300), "unreadable (OSError: File name too long)"),
        (lambda tmp: tmp.joinpath(*["y" * 200] * 30), "unreadable (OSError: File name too long)"),
        (lambda tmp: tmp / "nul\0.json", "unreadable (ValueError: embedded null byte)"),
        (lambda tmp: tmp, "unreadable (ValueError: not a regular file)"),  # a directory
        (_fifo, "unreadable (ValueError: not a regular file)"),
    ],
)
def test_a_path_that_cannot_be_opened_is_a_reason_not_a_failed_start(tmp_path, make, said) -> None:
    found = tuned.load(make(tmp_path))
    assert (found.status, found.settings, found.why) == ("ignored", {}, said)
    assert "\n" not in found.why and str(tmp_path) not in found.why


def test_a_symlink_loop_named_by_the_environment_is_ignored_with_one_warning(tmp_path, monkeypatch, caplog) -> None:
    loop = _loop(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastinfer.tuned"):
        settings = settings_with(monkeypatch, tuned.RESOLVED_ENV, FASTINFER_TUNED=str(loop))
    assert settings.tuned["status"] == "ignored" and settings.tuned["path"] == "loop.json"
    assert "Too many levels of symbolic links" in settings.tuned["why"] and settings.sources == {}
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "fastinfer.tuned"]
    assert "\n" not in warning and "Too many levels of symbolic links" in warning


def test_a_home_that_is_a_symlink_loop_shows_the_files_name_not_a_failed_start(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BENTOML_HOME", str(_loop(tmp_path)))
    found = tuned.load(tmp_path / "tuned.json")
    assert (found.status, found.path) == ("none", "tuned.json")


# ---- only what the tuner chooses from ------------------------------------------------------------


def test_one_value_the_tuner_never_chose_leaves_the_whole_file_out(in_force, monkeypatch) -> None:
    # The hostile example: every request would wait 10 s for a batch.
    rewrite(
        in_force,
        chose("onnx-int8", FASTINFER_MAX_BATCH_SIZE_ONNX_INT8="16", FASTINFER_MAX_LATENCY_MS_ONNX_INT8="10000"),
    )
    settings = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8",
                             "FASTINFER_MAX_LATENCY_MS_ONNX_INT8")  # fmt: skip
    assert settings.tuned["status"] == "ignored" and "'10000'" in settings.tuned["why"]
    assert settings.sources == {} and settings.default_backend == "auto"  # its good values are left out too
    batching = settings.batching_for("onnx-int8")
    assert (batching.max_batch_size, batching.max_latency_ms) == (8, 0)  # the table's


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_every_configuration_the_tuner_can_write_is_in_force(cores) -> None:
    from load_tests.tuning.files import tuned_settings
    from load_tests.tuning.search import Config, Trial

    here = {**HERE, "cores": cores}
    for goal in tune_space.GOALS:
        for point in (p for backend in tune_space.BACKENDS_TUNED for p in tune_space.points(backend, cores, goal)):
            chosen = Config(**vars(point))
            data = tuned_data(settings=tuned_settings(Trial(chosen, "")), fingerprint={**here, "models": STORED})
            _, why = tuned.check(data, here, STORED, EVERY_BACKEND_RUNS)
            assert why == "in force", (chosen, why)


@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_tuner_writes_its_decode_threads_only_when_not_the_default(cores) -> None:
    points = [p for goal in tune_space.GOALS for p in tune_space.points("onnx-int8", cores, goal)]
    written = [tune_space.written(p.settings()) for p in points]
    threads = {w.get("FASTINFER_DECODE_THREADS") for w in written}
    assert threads == ({None} if cores == 1 else {None, str(cores // 2)})  # 0, one per core, is left out
    first = tune_space.dimensions("onnx-int8", cores, "throughput")["decode_threads"][0]
    default = config.Settings.model_fields["decode_threads"].default
    assert first == tune_space.plain("onnx-int8").decode_threads == default == 0


def test_tuned_decode_threads_reach_the_settings_below_the_environment(monkeypatch) -> None:
    names = ("FASTINFER_DEFAULT_BACKEND", "FASTINFER_DECODE_THREADS")
    monkeypatch.setenv(tuned.RESOLVED_ENV, resolved(chose("onnx-int8", FASTINFER_DECODE_THREADS="1")))
    settings = settings_with(monkeypatch, *names)
    assert settings.decode_threads == 1 and settings.sources == dict.fromkeys(names, "tuned")
    settings = settings_with(monkeypatch, FASTINFER_DECODE_THREADS="2")
    assert settings.decode_threads == 2 and settings.sources["FASTINFER_DECODE_THREADS"] == "environment"


def test_a_bogus_decode_pool_from_the_parent_leaves_the_tuned_values_out_not_the_server_down(monkeypatch) -> None:
    monkeypatch.setenv(tuned.RESOLVED_ENV, resolved(chose("onnx-int8", FASTINFER_DECODE_THREADS="bogus")))
    settings = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND", "FASTINFER_DECODE_THREADS")
    assert settings.tuned["status"] == "ignored" and "FASTINFER_DECODE_THREADS" in settings.tuned["why"]
    assert (settings.decode_threads, settings.default_backend, settings.sources) == (0, "auto", {})


def test_a_file_tuned_with_the_removed_scheduling_is_ignored_whole(in_force, monkeypatch, caplog) -> None:
    """The tuner wrote FASTINFER_SCHEDULING only when it chose `turns`: the file's other values were measured with
    it, so none of them holds."""
    data = json.loads(in_force.read_text())
    data["settings"]["FASTINFER_SCHEDULING"] = "turns"
    in_force.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="fastinfer.tuned"):
        settings = settings_with(monkeypatch, "FASTINFER_DEFAULT_BACKEND", "FASTINFER_MAX_BATCH_SIZE_ONNX_INT8")
    assert settings.tuned["status"] == "ignored" and "run `fastinfer tune` again" in settings.tuned["why"]
    assert "FASTINFER_SCHEDULING, since removed" in settings.tuned["why"] and settings.sources == {}
    assert settings.default_backend == "auto" and settings.batching_for("onnx-int8").max_batch_size == 8
    assert "tuned configuration" in caplog.text and "FASTINFER_SCHEDULING" in caplog.text


def test_each_bad_variable_gets_one_line_naming_it(monkeypatch) -> None:
    """Secrets and REDIS_URL, read apart from the other fields, included: a bad secret must not hide the rest."""
    env = {"FASTINFER_THREADS": "5000", "FASTINFER_BATCHING_ONNX": "maybe", "FASTINFER_CACHE": "disk",
           "FASTINFER_API_KEYS": "short", "REDIS_URL": "http://cache:6379", "FASTINFER_CACHE_TTL": "-1",
           "FASTINFER_GROQ_TIMEOUT_S": "nan"}  # fmt: skip
    with pytest.raises(ValueError) as caught:
        settings_with(monkeypatch, FASTINFER_TUNED="off", **env)
    said = sorted(str(caught.value).splitlines())
    assert said[:3] == [
        "FASTINFER_API_KEYS: key 1 of 1 is shorter than 16 characters; "
        'make one with: python3 -c "import secrets; print(secrets.token_urlsafe(32))"',
        "FASTINFER_BATCHING_ONNX must be true or false, got 'maybe'",
        "FASTINFER_CACHE must be 'auto', 'redis', 'memory' or 'off', got 'disk'",
    ]
    assert said[3:] == [
        "FASTINFER_CACHE_TTL must be at least 1, got -1",
        "FASTINFER_GROQ_TIMEOUT_S must be a number of seconds such as 20 or 2.5, got 'nan'",
        "FASTINFER_THREADS must be from 0 to 1024, got 5000",
        "REDIS_URL must be a redis://, rediss:// or unix:// URL, such as redis://host:6379/0",
    ]


@pytest.mark.parametrize("url", ["redis://[::1", "not a url", "redis://host:port/0"])
def test_a_redis_url_that_is_no_url_stops_start_up_without_echoing_it(monkeypatch, url: str) -> None:
    with pytest.raises(ValueError, match=r"^REDIS_URL ") as caught:
        settings_with(monkeypatch, FASTINFER_TUNED="off", REDIS_URL=url, FASTINFER_REDIS_PASSWORD="pw-never-shown")
    assert url not in str(caught.value) and "pw-never-shown" not in str(caught.value)


def test_a_bad_setting_stops_bentoml_serve_in_one_line_per_variable() -> None:
    """service.py reads the settings before anything else does: no traceback through the imports."""
    env = {**os.environ, "FASTINFER_THREADS": "-1", "FASTINFER_MAX_BYTES": "abc", "FASTINFER_TUNED": "off"}
    done = subprocess.run([sys.executable, "-c", "import service"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-2:] == [
        "fastinfer: FASTINFER_MAX_BYTES must be an integer, got 'abc'",
        "FASTINFER_THREADS must be from 0 to 1024, got -1",
    ]


def test_the_environment_alone_is_the_model_read_by_pydantic_settings(monkeypatch) -> None:
    monkeypatch.setenv("FASTINFER_MAX_LATENCY_MS_ONNX_INT8", " 7 ")
    monkeypatch.setenv("FASTINFER_TIMEOUT_S", "12")
    settings = config.Settings()
    assert settings.batching_for("onnx-int8").max_latency_ms == 7 and settings.request_timeout_s == 12
    assert settings.batching_for("onnx").max_latency_ms == backends.SPECS["onnx"].batching[2]  # the table's default


def test_the_groq_base_url_is_the_sdks_variable_and_the_old_name_is_said_not_read(monkeypatch) -> None:
    monkeypatch.setenv("FASTINFER_GROQ_BASE_URL", "http://127.0.0.1:9/old")
    assert tuned.removed_in_environment() == ["FASTINFER_GROQ_BASE_URL"]
    with pytest.raises(ValueError, match="FASTINFER_GROQ_BASE_URL was removed: set GROQ_BASE_URL"):
        settings_with(monkeypatch, "GROQ_BASE_URL")  # ignored, /analyze would go to Groq's public API
    assert settings_with(monkeypatch, GROQ_BASE_URL="http://127.0.0.1:9/").groq.base_url == "http://127.0.0.1:9/"
