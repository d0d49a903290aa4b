"""The exhaustive sweep and the check that holds `fastinfer tune` against it (load_tests/tuning/check.py),
with stand-ins for the server and the load: the sweep covers every configuration the search can reach,
packs them onto few servers without mixing server-wide settings, and the check's verdicts and section
come from what was measured."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from fastinfer.catalog import tune_space
from load_tests.tuning import check
from load_tests.tuning.search import (
    RUN_OVERHEAD_S,
    SERVER_S,
    Config,
    Goal,
    Search,
    Trial,
    alternatives,
    alternatives_from,
    cores_variants,
    serve,
    server_env,
    server_groups,
    space,
    sweep,
    sweep_estimate_s,
    tune,
)
from tests.unit.test_tune_search import FIGURES, FakeServers, by_rate

BACKENDS = ["openvino-int8", "onnx-int8", "onnx-int8-dynamic"]


def reachable(config: Config, cores: int, goal: Goal) -> set[Config]:
    """Every configuration the one-dimension-at-a-time search can reach from ``config``, whatever it keeps."""
    seen, todo = {config}, [config]
    while todo:
        current = todo.pop()
        for _, options in alternatives(current, cores, goal):
            for option in alternatives_from(current, options, current):
                if option not in seen:
                    seen.add(option)
                    todo.append(option)
    return seen


@pytest.mark.parametrize("goal", [Goal(), Goal("latency")])
@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_sweep_covers_every_configuration_the_search_can_reach(goal: Goal, cores: int) -> None:
    configs = space(BACKENDS, cores, goal)
    assert len(configs) == len(set(configs))
    every = {Config(**vars(p)) for b in BACKENDS for p in tune_space.points(b, cores, goal.kind)}  # what tuned.py takes
    for backend in BACKENDS:
        plain = Config(**vars(tune_space.plain(backend)))
        found = reachable(plain, cores, goal)
        assert found <= every and len(found) == len([p for p in every if p.backend == backend])
        # Served by the sweep: as it is, or with an untuned server's decode threads (then its best with every
        # other value of them: cores_variants).
        untuned = {replace(c, decode_threads=0) for c in found}
        assert untuned == {c for c in configs if c.backend == backend}
        assert {c.decode_threads for c in found} == ({0} if cores == 1 else {0, cores // 2})
        assert len(cores_variants(plain, cores, goal)) == (0 if cores == 1 else 1)
    assert not any(c.in_front and c.front_workers != 1 for c in configs)


def test_two_cores_give_36_configurations_a_batching_backend_and_6_one_without() -> None:
    configs = space(BACKENDS, 2, Goal())
    assert sum(c.backend == "openvino-int8" for c in configs) == 36  # placement × batch 3 × wait 2 × workers × threads
    assert sum(c.backend == "onnx-int8-dynamic" for c in configs) == 6  # batching off: placement, workers, threads
    groups = server_groups(configs, 2, Goal())
    assert len(groups) == 36 and sum(map(len, groups)) == len(configs)
    for group in groups:
        env = server_env(group)  # raises if a group mixes server-wide settings or serves a backend twice
        assert env["FASTINFER_TUNED"] == "off" and env["FASTINFER_DEFAULT_BACKEND"] == group[0].backend
        assert env["FASTINFER_IN_FRONT"] == (",".join(c.backend for c in group if c.in_front) or "none")


def test_a_server_env_serves_each_backend_its_own_settings() -> None:
    env = server_env([Config("openvino-int8", True, 4, 5), Config("onnx-int8", max_batch=16)])
    assert env["FASTINFER_IN_FRONT"] == "openvino-int8"
    assert env["FASTINFER_BACKENDS"] == "openvino-int8,onnx-int8"  # no runner for a backend not measured
    assert env["FASTINFER_MAX_BATCH_SIZE_OPENVINO_INT8"] == "4" and env["FASTINFER_MAX_LATENCY_MS_OPENVINO_INT8"] == "5"
    assert env["FASTINFER_MAX_BATCH_SIZE_ONNX_INT8"] == "16" and env["FASTINFER_MAX_LATENCY_MS_ONNX_INT8"] == ""
    with pytest.raises(ValueError):
        server_env([Config("onnx", threads=1), Config("onnx-int8")])
    with pytest.raises(ValueError):
        server_env([Config("onnx"), Config("onnx", max_batch=4)])


def test_the_sweep_measures_every_configuration_once_and_stops_every_server(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    servers = FakeServers()
    rates = {"onnx-int8, in front, max batch 16, 1 engine threads": 40.0}
    swept = sweep(Goal(), 5, tmp_path, BACKENDS, by_rate(rates), servers.start, servers.stop)
    assert len(swept.trials) == 78 + 1 and swept.servers == 36 + 1 == len(servers.started) and servers.running == 0
    assert swept.chosen is not None and swept.chosen.config == Config("onnx-int8", True, 16, threads=1)
    best = Config("onnx-int8", True, 16, threads=1)  # then it alone, with the other decode pool
    assert swept.trials[-1].config == replace(best, decode_threads=1)
    assert {env["FASTINFER_DECODE_THREADS"] for env in servers.started[:-1]} == {"0"}  # the default, said
    assert servers.started[-1]["FASTINFER_DECODE_THREADS"] == "1"
    # Its estimate counts what it serves: each server's start, each run.
    runs = len(swept.trials) * (5 + RUN_OVERHEAD_S)
    assert sweep_estimate_s(BACKENDS, 2, Goal(), 5) == swept.servers * SERVER_S + runs


def _searches(tmp_path, rates: dict[str, float]) -> tuple[Search, Search, FakeServers]:
    servers = FakeServers()
    tuner = tune(Goal(), 10_000, 5, tmp_path, list(FIGURES), by_rate(rates), FIGURES, servers.start, servers.stop)
    swept = sweep(Goal(), 5, tmp_path, ["openvino-int8", "onnx-int8"], by_rate(rates), servers.start, servers.stop)
    return tuner, swept, servers


ABOUT = {"command": "x", "date": "d", "hardware": {"cpu": "CPU", "cores": 2}, "goal": "throughput: …",
         "backends": ["openvino-int8", "onnx-int8"], "seconds": 5}  # fmt: skip


def test_the_check_judges_the_choice_head_to_head_against_the_sweeps_best_few(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {
        "openvino-int8, runner, max batch 16": 30.0,
        "onnx-int8, in front, max batch 4": 40.0,
        "onnx-int8, in front, max batch 16": 39.0,
    }
    tuner, swept, servers = _searches(tmp_path, rates)
    result = check.compare(tuner, 60.0, swept, 2, by_rate(rates)) | ABOUT
    assert result["tune"]["chosen"]["label"] == "openvino-int8, runner, max batch 16"
    assert result["sweep"]["best"]["label"] == "onnx-int8, in front, max batch 4"
    assert result["share_in_sweep"] == pytest.approx(0.75) and result["share_head_to_head"] == pytest.approx(0.75)
    rows = result["head_to_head"]
    assert [r["tuned"] for r in rows] == [False, False, True]  # the 3 best, the tuned one among them
    assert check.contenders(Goal(), swept, Config("onnx")) == [*(Config(**r["runs"][0]["config"]) for r in rows),
                                                               Config("onnx")]  # fmt: skip
    assert all(len(r["runs"]) == 2 for r in rows) and servers.running == 0
    assert result["sweep"]["configurations"] == 73 and result["tune"]["elapsed_s"] == 60.0  # not the sweep's time
    lines = check.verdict(result)
    assert "**NOT met**, 75% head to head" in lines[0] and lines[0].endswith("— CPU, 2 cores")
    text = "\n".join(check.section(result, "docs/bench/tuning.png"))
    assert "| **onnx-int8, in front, max batch 4** |" in text and "★ tuned" in text and "tuning.png" in text
    said = "chose **openvino-int8, runner, max batch 16** (decode pool: a decode thread per core)"
    assert said in text and "; the choice's decode pool: a decode thread per core" in lines[0]
    # The sweep's best under each decode pool: its own run and the other.
    assert "| one per core | 40.0 (100) | 200 |\n| 1 | 10.0 (100) | 200 |" in text


def test_a_tuned_choice_that_fails_head_to_head_is_not_met_not_judged_on_its_sweep_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"openvino-int8, runner, max batch 16": 30.0}
    tuner, swept, _ = _searches(tmp_path, rates)

    def failing(server, config: Config, search: Search) -> Trial:
        trial = by_rate(rates)(server, config, search)
        return replace(trial, failures=3) if config == tuner.chosen.config else trial

    result = check.compare(tuner, 60.0, swept, 2, failing) | ABOUT
    assert result["share_in_sweep"] == 1.0 and result["share_head_to_head"] is None
    share = check.targets(result)[0]
    assert share.verdict == "NOT met" and share.figure.startswith("the tuned configuration failed")


def test_nothing_chosen_nothing_swept_and_interrupted_checks_say_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    tuner, swept, _ = _searches(tmp_path, {})
    partial = check.sweep_result(tuner, 60.0, None) | ABOUT
    (interrupted,) = check.targets(partial)
    assert interrupted.verdict == "not judged" and "the check was interrupted (after the tune" in interrupted.figure
    assert "**not judged**, the check was interrupted" in check.verdict(partial)[0]
    tuner.chosen = None
    result = check.compare(tuner, 60.0, swept, 2, by_rate({})) | ABOUT
    share, took = check.targets(result)
    assert (share.verdict, share.figure, took.verdict) == ("NOT met", "the tune chose nothing", "NOT met")
    swept.trials = [replace(t, failures=1) for t in swept.trials]
    result = check.compare(tuner, 60.0, swept, 0, by_rate({})) | ABOUT
    assert [(t.verdict, t.figure, t.machine) for t in check.targets(result)] == [
        ("not judged", "no configuration of the sweep served within the goal", "CPU, 2 cores")
    ]


def test_the_sweep_rotates_its_order_and_saves_after_each_server(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    servers = FakeServers()
    saved = []
    measure = by_rate({})
    swept = sweep(Goal(), 5, tmp_path, ["openvino-int8", "onnx-int8"], measure, servers.start, servers.stop,
                  after_each=lambda s: saved.append(len(s.trials)))  # fmt: skip
    first = [t for t in swept.trials if t.config in (Config("openvino-int8"), Config("onnx-int8"))]
    assert [t.config.backend for t in first] == ["openvino-int8", "onnx-int8"]
    assert swept.servers == 37 and len(saved) == 37 and saved[-1] == 73  # 36 servers, then 1 of its best
    second = [t.config.backend for t in swept.trials[2:4]]
    assert second == ["onnx-int8", "openvino-int8"]  # the next server takes them the other way round
    assert [t.position for t in swept.trials[:4]] == [0, 1, 0, 1]


def test_a_failed_run_puts_the_rest_of_its_server_on_a_fresh_one(tmp_path) -> None:
    servers = FakeServers()
    configs = [Config("openvino-int8"), Config("onnx-int8"), Config("onnx")]

    def measure(server, config: Config, search: Search) -> Trial:
        if config.backend == "openvino-int8":
            raise TimeoutError("locust hung")
        return by_rate({})(server, config, search)

    search = Search(Goal(), 100, 5, tmp_path, start=servers.start, stop=servers.stop)
    trials = serve(configs, "sweep", search, measure)
    assert [bool(t.error) for t in trials] == [True, False, False] and search.servers == 2
    assert [t.position for t in trials] == [0, 0, 1] and servers.running == 0

    def failing(server, config: Config, search: Search) -> Trial:  # one failed request in ten is not a wedge
        trial = by_rate({})(server, config, search)
        return replace(trial, failures=trial.requests // 10 + (config.backend == "onnx-int8"))

    search = Search(Goal(), 100, 5, tmp_path, start=servers.start, stop=servers.stop)
    assert [t.position for t in serve(configs, "sweep", search, failing)] == [0, 1, 0] and search.servers == 2


def test_shares_read_the_goal_and_refuse_nothing_measured() -> None:
    assert check.share(Goal(), 19.0, 20.0) == pytest.approx(0.95)
    assert check.share(Goal("latency"), -50.0, -40.0) == pytest.approx(0.8)  # p50 50 ms against the best's 40
    assert check.share(Goal(), -math.inf, 20.0) is None
    assert check.mean_score(Goal(), [Trial(Config("onnx"), "x", 10, 1, 1, 0, 5)]) == 10


def test_the_bench_keeps_a_saved_check_and_survives_a_broken_one(tmp_path) -> None:
    assert check.load(tmp_path / "missing.json") is None
    (tmp_path / "t.json").write_text('{"tune": {"elapsed_s"')  # truncated by an interrupt
    assert check.load(tmp_path / "t.json") is None
    (tmp_path / "t.json").write_text("[1]")
    assert check.load(tmp_path / "t.json") is None
    (tmp_path / "t.json").write_text('{"tune": {}, "sweep": null, "hardware": {}}')  # an earlier format
    assert check.load(tmp_path / "t.json") is None
    (tmp_path / "t.json").write_text("[" * 100_000)
    assert check.load(tmp_path / "t.json") is None


def test_a_head_to_head_interrupted_or_with_a_failed_contender_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"onnx-int8, in front, max batch 4": 40.0, "onnx-int8, in front, max batch 16": 39.0}
    tuner, swept, _ = _searches(tmp_path, rates)
    saved = []
    strongest = Config("onnx-int8", True, 4)

    def measure(server, config: Config, search: Search) -> Trial:  # head to head only: the sweep ran already
        trial = by_rate(rates)(server, config, search)
        return replace(trial, failures=1) if config == strongest else trial

    result = check.compare(tuner, 60.0, swept, 2, measure, save=lambda r: saved.append(r | ABOUT)) | ABOUT
    assert [r["stage"] for r in saved] == ["head to head"] * 3 and result["stage"] == "done"
    assert saved[0]["head_to_head"] is None and len(saved[1]["head_to_head"][0]["runs"]) == 1
    line = check.verdict(result)[0]
    assert "judged against 1 of the sweep's 2 best: onnx-int8, in front, max batch 4 failed" in line
    assert result["head_to_head_best"] == "onnx-int8, in front, max batch 16"
    json.dumps(result, allow_nan=False)  # no -inf for a failed contender: valid JSON for any reader
    first, took = check.targets(saved[0])  # the sweep done, the head to head not begun
    assert first.verdict == "not judged" and took.verdict in ("met", "NOT met")
    assert first.figure.startswith("the head to head was interrupted before its first round")
    assert "interrupted after this round" in check.verdict(saved[1])[0]


def test_the_plot_and_the_link_follow_the_markdown_and_no_stale_plot_stays(tmp_path, monkeypatch) -> None:
    from tests.unit.test_report import bench, run

    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"openvino-int8, runner, max batch 16": 30.0}
    tuner, swept, _ = _searches(tmp_path, rates)
    result = check.compare(tuner, 60.0, swept, 0, by_rate(rates)) | ABOUT
    markdown, plots = tmp_path / "docs" / "B.md", tmp_path / "plots"
    markdown.parent.mkdir()
    (tmp_path / "tuning.json").write_text(json.dumps(result))  # as the check saves it
    assert not check.write_markdown(markdown, plots, tmp_path) and not markdown.exists()  # no bench beside the plots
    check.write_benchmarks(bench([run("inference", "onnx-int8", 10, 58.0)]), markdown, tmp_path / "none", plots)
    assert check.write_markdown(markdown, plots, tmp_path)
    assert "](../plots/tuning.png)" in markdown.read_text() and (plots / "tuning.png").stat().st_size > 10_000
    (tmp_path / "tuning.json").write_text(json.dumps(check.sweep_result(tuner, 60.0, None) | ABOUT))
    assert check.write_markdown(markdown, plots, tmp_path)
    assert not (plots / "tuning.png").exists() and "tuning.png" not in markdown.read_text()


def test_a_head_to_head_without_its_tuned_row_is_not_met_not_a_crash() -> None:
    trial = {"label": "x", "req_per_s": 1.0, "p50_ms": 1, "failures": 0, "error": ""}
    result = {"hardware": {"cpu": "CPU", "cores": 2}, "stage": "done", "share_in_sweep": None,
              "share_head_to_head": None, "head_to_head": [{"label": "x", "tuned": False, "qualified": True,
              "runs": [trial]}], "tune": {"chosen": {"label": "y"}, "elapsed_s": 60, "budget_s": 420},
              "sweep": {"best": {"label": "x"}, "elapsed_s": 600}}  # fmt: skip
    assert "**NOT met**" in check.verdict(result)[0]


def test_a_check_saved_before_the_decode_pool_was_tuned_says_so_in_its_rows(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"openvino-int8, runner, max batch 16": 30.0, "onnx-int8, in front, max batch 4": 40.0}
    tuner, swept, _ = _searches(tmp_path, rates)
    result = check.compare(tuner, 60.0, swept, 2, by_rate(rates)) | ABOUT
    assert not any("before the scheduling" in t.figure for t in check.targets(result))
    del result["tune"]["chosen"]["config"]["decode_threads"]  # as a check saved before it was tuned
    for target in check.targets(result):
        assert target.figure.endswith("before the scheduling and decode pool were tuned"), target.figure
