"""fastinfer tune's search, with stand-ins for the server and the load (the real path is tested end to
end in tests/integration/test_tune.py): pruning by in-process figures, one dimension at a time over the
tune space, a change kept only past MIN_GAIN, the budget, failed candidates, and what it writes."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from fastinfer.catalog import tune_space, tuned
from load_tests.service import Server
from load_tests.tuning import files
from load_tests.tuning.search import (
    MIN_GAIN,
    PLACEMENT,
    Config,
    Goal,
    Search,
    Trial,
    alternatives,
    alternatives_from,
    placement,
    relative_gap,
    serve,
    server_env,
    tune,
    worth_serving,
)


@pytest.fixture(autouse=True)
def two_cores(monkeypatch) -> None:
    """The search's space follows the cores (threads, front workers, decode threads): these tests are of 2."""
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: 2)


FIGURES = {
    "openvino-int8": {"ceiling_req_per_s": 24.0, "latency_ms": 43.0},
    "onnx-int8": {"ceiling_req_per_s": 22.0, "latency_ms": 52.0},
    "onnx": {"ceiling_req_per_s": 13.0, "latency_ms": 76.0},
    "pytorch": {"ceiling_req_per_s": 5.0, "latency_ms": 300.0},
}


class FakeServers:
    """start/stop stand-ins that record which settings each server had, and fail where told."""

    def __init__(self, refuse: set[str] = frozenset()) -> None:
        self.started: list[dict[str, str]] = []
        self.running = 0
        self.refuse = refuse

    def start(self, home: Path | None, log: Path, env: dict[str, str]) -> Server:
        if env.get("FASTINFER_IN_FRONT") in self.refuse:
            raise RuntimeError("bentoml serve exited with 1")
        self.started.append(env)
        self.running += 1
        return Server("http://fake", None, log)  # type: ignore[arg-type]

    def stop(self, server: Server) -> None:
        self.running -= 1


def by_rate(rates: dict[str, float]):
    """A measure that serves each configuration at the rate its label is given (default 10 req/s)."""

    def measure(server: Server, config: Config, search: Search) -> Trial:
        rate = rates.get(config.label(), 10.0)
        return Trial(config, "", rate, 100.0, 200.0, 0, int(rate * search.seconds))

    return measure


def searched(tmp_path, measure, servers: FakeServers | None = None, goal: Goal | None = None, budget=10_000) -> Search:
    """A whole tune over FIGURES (its in-process stage skipped), on ``servers``' stand-ins."""
    servers = servers or FakeServers()
    return tune(goal or Goal(), budget, 5, tmp_path, list(FIGURES), measure, FIGURES, servers.start, servers.stop)


def test_pruning_keeps_the_backends_near_the_best_ceiling_and_says_why_the_rest_went() -> None:
    keep, dropped = worth_serving(FIGURES, Goal())
    assert keep == ["openvino-int8", "onnx-int8"]
    assert "13.0 req/s < 60% of 24.0" in dropped["onnx"] and set(dropped) == {"onnx", "pytorch"}
    keep, _ = worth_serving(FIGURES, Goal("latency"))
    assert keep == ["openvino-int8", "onnx-int8"]  # 76 ms > 43 / 0.6


def test_the_search_keeps_a_change_only_past_the_noise_margin(tmp_path) -> None:
    servers = FakeServers()
    rates = {
        "openvino-int8, runner": 20.0,
        "onnx-int8, runner": 18.0,
        "openvino-int8, in front": 20.0 * (1 + MIN_GAIN / 2),  # better, but within the margin: not kept
        "openvino-int8, runner, max batch 16": 23.0,  # kept
        "openvino-int8, runner, max batch 16, max wait 5 ms": 22.0,
    }
    search = searched(tmp_path, by_rate(rates), servers)
    assert search.chosen is not None and search.chosen.config.label() == "openvino-int8, runner, max batch 16"
    assert servers.running == 0  # every server it started was stopped
    assert servers.started[0]["FASTINFER_TUNED"] == "off"  # a trial never serves the previous tuning
    assert servers.started[0]["FASTINFER_MAX_BATCH_SIZE_OPENVINO_INT8"] == ""  # nor what the shell exports
    assert servers.started[-1]["FASTINFER_MAX_BATCH_SIZE_OPENVINO_INT8"] == "16"
    assert [env["FASTINFER_DEFAULT_BACKEND"] for env in servers.started[:1]] == ["openvino-int8"]  # not the shell's
    tried = [t.config.label() for t in search.trials]
    assert tried[:2] == ["openvino-int8, runner", "onnx-int8, runner"]  # one server for the backend stage
    assert "openvino-int8, runner, max batch 4" in tried  # each dimension from the best so far:
    assert "openvino-int8, runner, max batch 16, 2 front workers" in tried
    assert any(d.startswith("where the engine runs: kept;") for d in search.decisions)
    assert len(servers.started) == len(tried) - 1


def by_rounds(rates: dict[str, list[float]]):
    """A measure that serves each configuration at the next of its label's rates, round after round."""
    served: dict[str, int] = {}
    fixed = by_rate({})

    def measure(server: Server, config: Config, search: Search) -> Trial:
        if (label := config.label()) not in rates:
            return fixed(server, config, search)
        n = served[label] = served.get(label, -1) + 1
        rate = rates[label][n % len(rates[label])]
        return Trial(config, "", rate, 100.0, 200.0, 0, int(rate * search.seconds))

    return measure


RUNNER, FRONT = "openvino-int8, runner", "openvino-int8, in front"


@pytest.mark.parametrize(
    ("runner", "front", "said", "moved"),
    [  # runner 100 ± 3, in front 110 ± 3: three rounds each separate them (the runner's first: the backend stage's)
        ([100.0, 103.0, 97.0, 100.0], [113.0, 107.0, 110.0], f"{FRONT} (113.0, 107.0, 110.0 req/s) vs {RUNNER} "
         "(103.0, 97.0, 100.0 req/s): 10.0% better, beyond the rounds' noise (±4.9%)", True),
        ([100.0, 92.0, 108.0, 100.0], [112.0, 96.0, 104.0], "4.0% better, within the rounds' noise (±13.1%)", False),
        ([100.0, 100.0, 101.0, 99.0], [80.0, 81.0, 79.0], "20.0% worse, beyond the rounds' noise (±1.6%)", False),
        ([100.0], [102.0], "2.0% better, beyond the rounds' noise (±0.0%), under the 3% a change must gain", False),
        ([100.0], [100.0], "0.0% apart, within the rounds' noise (±0.0%)", False),  # a tie: neither better nor worse
    ],
)  # fmt: skip
def test_the_placement_is_served_in_alternating_rounds_and_moved_only_past_the_noise_and_min_gain(
    tmp_path, runner: list[float], front: list[float], said: str, moved: bool
) -> None:
    search = searched(tmp_path, by_rounds({RUNNER: runner, FRONT: front}))
    placed = [t.config.label() for t in search.trials if t.stage == PLACEMENT]
    assert placed == [RUNNER, FRONT, FRONT, RUNNER, RUNNER, FRONT]  # each round the other way round
    (decision,) = [d for d in search.decisions if d.startswith(PLACEMENT)]
    assert decision.startswith(f"{PLACEMENT}: {'' if moved else 'kept; '}{FRONT} (") and decision.endswith(said)
    assert search.chosen is not None and search.chosen.config.in_front == moved
    files.write(search, "fastinfer tune", tmp_path / "tuned.json")
    assert decision in (tmp_path / "report.md").read_text()  # the report says it


def test_a_placement_that_serves_nothing_or_breaks_the_p95_limit_in_a_round_loses_and_is_named(tmp_path) -> None:
    assert relative_gap([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == (1.0, 0.0)  # a mean of 0 req/s: no division by it
    slow = {RUNNER: 100.0, FRONT: 70.0}
    servers = FakeServers()
    search = Search(Goal(p95_ms=250), 10_000, 5, tmp_path, start=servers.start, stop=servers.stop)
    current = Trial(Config("openvino-int8"), "backend", 100.0, 100.0, 200.0, 0, 500)
    over = iter([300.0, 200.0, 200.0])  # the runner's first fresh round is over the limit

    def measure(server: Server, config: Config, s: Search) -> Trial:
        p95 = next(over) if config.label() == RUNNER else 200.0
        return Trial(config, "", slow[config.label()], 100.0, p95, 0, 500)

    chosen = placement(search, current, Config("openvino-int8", in_front=True), measure)
    assert chosen.config.in_front and chosen.req_per_s == 70.0  # the one that met the goal every round
    assert search.decisions[-1].endswith(f"{RUNNER} failed the goal in a round (an error, or its p95 over the limit)")
    assert "p95 300, 200, 200 ms" in search.decisions[-1]  # the breach is shown


def test_a_placement_kept_by_its_rounds_is_not_confirmed_again_and_only_its_chosen_trial_is_starred(tmp_path) -> None:
    search = searched(tmp_path, by_rounds({RUNNER: [115.0, 100.0, 100.0, 100.0, 100.0], FRONT: [110.0]}))
    (said,) = [d for d in search.decisions if d.startswith(PLACEMENT)]
    assert said.endswith("10.0% better, beyond the rounds' noise (±0.0%)")
    assert search.chosen is not None and search.chosen.config.in_front  # not undone by the stage-2 run's 115
    assert any(d.startswith("confirmation: not run: the placement alone changed") for d in search.decisions)
    files.write(search, "fastinfer tune", tmp_path / "tuned.json")
    assert (tmp_path / "report.md").read_text().count("★") == 1


def test_the_budget_stops_the_search_and_says_what_it_left(tmp_path) -> None:
    search = searched(tmp_path, by_rate({}), budget=1.0)
    assert [t.stage for t in search.trials] == ["backend", "backend"]  # the first server always runs
    assert search.skipped and all("(the budget)" in s for s in search.skipped)
    assert search.chosen is not None


def test_a_candidate_whose_server_fails_is_an_error_trial_not_a_crash(tmp_path) -> None:
    search = searched(tmp_path, by_rate({}), FakeServers(refuse={"openvino-int8"}))
    failed = [t for t in search.trials if t.error]
    assert [t.config.label() for t in failed] == ["openvino-int8, in front"]
    assert Goal().score(failed[0]) == -math.inf and search.chosen and not search.chosen.error


def test_errors_and_the_p95_limit_disqualify_and_latency_prefers_the_lowest_p50() -> None:
    ok = Trial(Config("onnx"), "x", 20.0, 50.0, 90.0, 0, 100)
    assert Goal().score(ok) == 20.0
    assert Goal().score(Trial(Config("onnx"), "x", 30.0, 50.0, 90.0, 1, 100)) == -math.inf
    assert Goal(p95_ms=80).score(ok) == -math.inf
    assert Goal("latency").score(ok) == -50.0


def test_dimensions_follow_the_backend_and_the_goal() -> None:
    names = [name for name, _ in alternatives(Config("openvino-int8"), 2, Goal())]
    assert names == ["where the engine runs", "max batch", "max wait", "front workers", "engine threads",
                     "decode threads"]  # fmt: skip
    latency = [name for name, _ in alternatives(Config("openvino-int8"), 2, Goal("latency"))]
    assert "max batch" not in latency and "max wait" not in latency  # no batch forms at one client
    (batches,) = [opts for name, opts in alternatives(Config("coreml-batched"), 8, Goal()) if name == "max batch"]
    assert all(c.max_batch is not None and c.max_batch <= 8 for c in batches)  # its largest static batch
    one_core = {n for n, _ in alternatives(Config("onnx"), 1, Goal())}
    assert not one_core & {"front workers", "engine threads", "decode threads"}  # no cores to share out


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
def test_the_search_can_reach_every_configuration_of_the_tune_space_and_no_other(goal: Goal, cores: int) -> None:
    for backend in ["openvino-int8", "onnx-int8", "onnx-int8-dynamic"]:
        every = {Config(**vars(p)) for p in tune_space.points(backend, cores, goal.kind)}  # what tuned.py takes
        found = reachable(Config(**vars(tune_space.plain(backend))), cores, goal)
        assert found == every and not any(c.in_front and c.front_workers != 1 for c in found)
        assert {c.decode_threads for c in found} == ({0} if cores == 1 else {0, cores // 2})


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


def test_a_failed_run_puts_the_rest_of_its_server_on_a_fresh_one(tmp_path) -> None:
    configs = [Config("openvino-int8"), Config("onnx-int8"), Config("onnx")]

    def measure(server, config: Config, search: Search) -> Trial:
        if config.backend == "openvino-int8":
            raise TimeoutError("locust hung")
        return by_rate({})(server, config, search)

    servers = FakeServers()
    search = Search(Goal(), 100, 5, tmp_path, start=servers.start, stop=servers.stop)
    trials = serve(configs, "backend", search, measure)
    assert [bool(t.error) for t in trials] == [True, False, False] and len(servers.started) == 2
    assert [t.position for t in trials] == [0, 0, 1] and servers.running == 0

    def failing(server, config: Config, search: Search) -> Trial:  # one failed request in ten is not a wedge
        trial = by_rate({})(server, config, search)
        return replace(trial, failures=trial.requests // 10 + (config.backend == "onnx-int8"))

    servers = FakeServers()
    search = Search(Goal(), 100, 5, tmp_path, start=servers.start, stop=servers.stop)
    assert [t.position for t in serve(configs, "backend", search, failing)] == [0, 1, 0] and len(servers.started) == 2


def test_it_writes_the_tuned_file_last_and_the_report_beside_it(tmp_path, built_models, monkeypatch) -> None:
    rates = {"openvino-int8, runner, max batch 16": 30.0}
    search = searched(tmp_path, by_rate(rates))
    written = files.write(search, "fastinfer tune --budget 1", tmp_path / "tuned.json")
    data = json.loads(written.read_text())
    assert data["settings"] == {
        "FASTINFER_DEFAULT_BACKEND": "openvino-int8",
        "FASTINFER_MAX_BATCH_SIZE_OPENVINO_INT8": "16",
    }  # one decode thread per core, the default, is left out like every other plain value
    assert set(data["fingerprint"]["models"]) == {"resnet50-openvino-int8", "resnet50-onnx-int8"}
    monkeypatch.setenv(tuned.FILE_ENV, str(written))
    assert tuned.load().status == "in force"  # what it writes, the server takes
    report = (tmp_path / "report.md").read_text()
    assert "**Chosen: openvino-int8, runner, max batch 16.**" in report and "★" in report
    assert "Decode pool: a decode thread per core." in report
    assert (tmp_path / "tuned.png").stat().st_size > 10_000 and not list(tmp_path.glob(".tuned.json.*"))
    (tmp_path / "plain").touch()  # the usual mode of a new file (0o666 less the umask)
    assert written.stat().st_mode == (tmp_path / "plain").stat().st_mode  # a server as another user reads it


def test_nothing_served_writes_the_report_and_keeps_the_previous_tuned_file(tmp_path) -> None:
    previous = tmp_path / "tuned.json"
    previous.write_text('{"format": 1}')
    servers = FakeServers(refuse={"none"})  # every server fails to start
    search = searched(tmp_path, by_rate({}), servers)
    assert search.chosen is None and files.write(search, "fastinfer tune", previous) is None
    assert previous.read_text() == '{"format": 1}' and "Nothing served" in (tmp_path / "failed-report.md").read_text()


@pytest.mark.parametrize("interrupt_at", [1, 3])
def test_an_interrupted_tune_stops_its_servers_and_writes_nothing(tmp_path, interrupt_at) -> None:
    servers = FakeServers()
    calls = []

    def measure(server: Server, config: Config, search: Search) -> Trial:
        calls.append(config)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return Trial(config, "", 10.0, 100.0, 200.0, 0, 50)

    with pytest.raises(KeyboardInterrupt):
        searched(tmp_path, measure, servers)
    assert servers.running == 0 and not (tmp_path / "tuned.json").exists()


@pytest.mark.parametrize("lucky", [True, False])
def test_a_choice_stands_only_if_it_wins_again_in_the_confirmation_round(tmp_path, lucky: bool) -> None:
    """max batch 16 serves 30 req/s against the table's 20 in its first run; a lucky one, 10 in its next."""
    seen: dict[str, int] = {}

    def measure(server: Server, config: Config, search: Search) -> Trial:
        label = config.label()
        seen[label] = seen.get(label, 0) + 1
        if label == "openvino-int8, runner, max batch 16":
            rate = 10.0 if lucky and seen[label] > 1 else 30.0
        else:
            rate = 20.0 if label == "openvino-int8, runner" else 10.0
        return Trial(config, "", rate, 100.0, 200.0, 0, 100)

    search = searched(tmp_path, measure)
    kept = "openvino-int8, runner" if lucky else "openvino-int8, runner, max batch 16"
    assert search.chosen is not None and search.chosen.config.label() == kept
    assert search.decisions[-1].startswith("confirmation: openvino-int8, runner, max batch 16")
    assert ("the table's settings stay" if lucky else "again beat") in search.decisions[-1]
    assert [t.stage for t in search.trials][-2:] == ["confirmation", "confirmation"]


def test_the_decode_threads_are_one_step_on_the_leading_configuration(tmp_path) -> None:
    servers = FakeServers()
    rates = {
        "openvino-int8, runner": 20.0,
        "openvino-int8, runner, max batch 16": 23.0,
        "openvino-int8, runner, max batch 16, 2 front workers": 26.0,  # kept: the later steps start from it
        "openvino-int8, runner, max batch 16, 2 front workers, 1 decode threads": 30.0,
    }
    search = searched(tmp_path, by_rate(rates), servers)
    assert search.chosen is not None
    assert search.chosen.config == Config("openvino-int8", max_batch=16, front_workers=2, decode_threads=1)
    assert servers.started[0]["FASTINFER_DECODE_THREADS"] == "0"  # the backend stage: the default, said
    steps = [t.stage for t in search.trials if t.stage not in ("backend", "confirmation", PLACEMENT)]
    # One served trial more than before it (5 on 2 cores, past the placement's rounds), not twice the space.
    assert len(steps) == 6 and steps.count("decode threads") == 1 and steps[-1] == "decode threads"
    assert [t.config.label() for t in search.trials if t.stage == "decode threads"] == [
        "openvino-int8, runner, max batch 16, 2 front workers, 1 decode threads"  # front workers kept
    ]
    assert files.tuned_settings(search.chosen) == {
        "FASTINFER_DEFAULT_BACKEND": "openvino-int8",
        "FASTINFER_MAX_BATCH_SIZE_OPENVINO_INT8": "16",
        "FASTINFER_FRONT_WORKERS": "2",
        "FASTINFER_DECODE_THREADS": "1",  # not the default: written
    }


@pytest.mark.parametrize("cores", [2, 8])
def test_on_any_cores_the_search_tries_a_decode_pool_of_half_the_cores_last(tmp_path, monkeypatch, cores) -> None:
    monkeypatch.setattr("fastinfer.common.hardware.cpu_count", lambda: cores)
    servers = FakeServers()
    search = searched(tmp_path, by_rate({}), servers)
    assert not any("FASTINFER_SCHEDULING" in env for env in servers.started)  # removed: never tried, never said
    halves = [t.config.decode_threads for t in search.trials if t.stage == "decode threads"]
    assert halves == [cores // 2]  # half the cores
    assert [t.stage for t in search.trials if t.stage != "confirmation"][-1] == "decode threads"
    assert search.chosen is not None and search.chosen.config.decode_threads == 0  # nothing beat it
    assert "FASTINFER_DECODE_THREADS" not in files.tuned_settings(search.chosen)  # the default: left out


def test_the_tuned_file_is_replaced_whole_and_never_written_through_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, elsewhere = tmp_path / "tuned.json", tmp_path / "elsewhere"
    target.write_text("old")
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "planted")
    (tmp_path / ".tuned.json.planted").symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        files.write_atomically(target, "new")
    assert target.read_text() == "old" and not elsewhere.exists()
    (tmp_path / ".tuned.json.planted").unlink()
    files.write_atomically(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["tuned.json"]
