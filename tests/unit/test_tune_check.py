"""The exhaustive sweep and the check that holds `fastinfer tune` against it (load_tests/tuning/check.py),
with stand-ins for the server and the load: the sweep covers every configuration the search can reach,
packs them onto few servers without mixing server-wide settings, and the check's verdicts and section
come from what was measured."""

from __future__ import annotations

import math

import pytest

from load_tests.tuning import check
from load_tests.tuning.search import (
    Config,
    Goal,
    Search,
    Trial,
    alternatives,
    alternatives_from,
    server_env,
    server_groups,
    space,
    sweep,
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
            for option in alternatives_from(current, options):
                if option not in seen:
                    seen.add(option)
                    todo.append(option)
    return seen


@pytest.mark.parametrize("goal", [Goal(), Goal("latency")])
@pytest.mark.parametrize("cores", [1, 2, 8])
def test_the_sweep_covers_every_configuration_the_search_can_reach(goal: Goal, cores: int) -> None:
    configs = space(BACKENDS, cores, goal)
    assert len(configs) == len(set(configs))
    for backend in BACKENDS:
        assert reachable(Config(backend), cores, goal) <= set(configs)
    assert not any(c.in_front and c.front_workers != 1 for c in configs)


def test_two_cores_give_36_configurations_a_batching_backend_and_6_one_without() -> None:
    configs = space(BACKENDS, 2, Goal())
    assert sum(c.backend == "openvino-int8" for c in configs) == 36  # placement × batch 3 × wait 2 × workers × threads
    assert sum(c.backend == "onnx-int8-dynamic" for c in configs) == 6  # batching off: placement, workers, threads
    groups = server_groups(configs, 2, Goal())
    assert len(groups) == 36 and sum(map(len, groups)) == len(configs)
    for group in groups:
        env = server_env(group)  # raises if a group mixes server-wide settings or serves a backend twice
        assert env["FASTINFER_TUNED"] == "off" and "FASTINFER_DEFAULT_BACKEND" not in env
        assert env["FASTINFER_IN_FRONT"] in ("", ",".join(c.backend for c in group))


def test_a_server_env_serves_each_backend_its_own_settings() -> None:
    env = server_env([Config("openvino-int8", True, 4, 5), Config("onnx-int8", max_batch=16)])
    assert env["FASTINFER_IN_FRONT"] == "openvino-int8"
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
    assert len(swept.trials) == 78 and swept.servers == 36 == len(servers.started) and servers.running == 0
    assert swept.chosen is not None and swept.chosen.config == Config("onnx-int8", True, 16, threads=1)


def _searches(tmp_path, rates: dict[str, float]) -> tuple[Search, Search, FakeServers]:
    servers = FakeServers()
    tuner = tune(Goal(), 10_000, 5, tmp_path, list(FIGURES), by_rate(rates), FIGURES, servers.start, servers.stop)
    swept = sweep(Goal(), 5, tmp_path, ["openvino-int8", "onnx-int8"], by_rate(rates), servers.start, servers.stop)
    return tuner, swept, servers


def test_the_check_judges_the_choice_head_to_head_when_the_sweep_found_better(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"openvino-int8, runner, max batch 16": 30.0, "onnx-int8, in front, max batch 4": 40.0}
    tuner, swept, servers = _searches(tmp_path, rates)
    result = check.compare(tuner, swept, 2, by_rate(rates))
    assert result["tune"]["chosen"]["label"] == "openvino-int8, runner, max batch 16"
    assert result["sweep"]["best"]["label"] == "onnx-int8, in front, max batch 4"
    assert result["share_in_sweep"] == pytest.approx(0.75) and result["share_head_to_head"] == pytest.approx(0.75)
    assert [t.stage for t in swept.trials[-4:]] == ["head to head"] * 4 and servers.running == 0
    result |= {"command": "x", "date": "d", "hardware": {"cpu": "CPU", "cores": 2}, "goal": "throughput: …",
               "backends": ["openvino-int8", "onnx-int8"], "seconds": 5}  # fmt: skip
    lines = check.verdict(result)
    assert "NOT met**, 75%" in lines[0] and "— CPU, 2 cores" in lines[0]
    text = "\n".join(check.section(result, "docs/bench/tuning.png"))
    assert "**onnx-int8, in front, max batch 4**" in text and "★ tuned" in text and "tuning.png" in text


def test_the_check_needs_no_head_to_head_when_the_search_found_the_sweeps_best(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)
    rates = {"openvino-int8, runner, max batch 16": 30.0}
    tuner, swept, _ = _searches(tmp_path, rates)
    result = check.compare(tuner, swept, 2, by_rate(rates))
    assert result["share_in_sweep"] == 1.0 and result["head_to_head"] is None
    result |= {"command": "x", "date": "d", "hardware": {"cpu": "CPU", "cores": 2}, "goal": "throughput: …",
               "backends": [], "seconds": 5}  # fmt: skip
    assert "**met**, 100% (the sweep's own runs" in check.verdict(result)[0]
    assert "chose the sweep's best itself" in "\n".join(check.section(result, None))


def test_shares_read_the_goal_and_refuse_nothing_measured() -> None:
    assert check.share(Goal(), 19.0, 20.0) == pytest.approx(0.95)
    assert check.share(Goal("latency"), -50.0, -40.0) == pytest.approx(0.8)  # p50 50 ms against the best's 40
    assert check.share(Goal(), -math.inf, 20.0) is None
    assert check.mean_score(Goal(), [Trial(Config("onnx"), "x", 10, 1, 1, 0, 5)]) == 10


def test_the_section_replaces_its_old_self_and_nothing_else() -> None:
    old = "# Benchmarks\n\n## Targets\n\n- a\n\n" + check.SECTION + "\n\nold\n\n## Fidelity\n\nkept\n"
    new = check.replace_section(old, [check.SECTION, "", "new", ""])
    assert "old" not in new and "new" in new and new.endswith("## Fidelity\n\nkept\n") and "- a" in new
    assert check.replace_section("# B\n", ["x"]) == "# B\n\nx\n"
