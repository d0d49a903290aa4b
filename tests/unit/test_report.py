"""BENCHMARKS.md's target lines and sections say what was measured, limit and verdict in the right places,
and the HTTP cost and the ceilings are the arithmetic the report says they are."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from fastinfer.measure import profile as prof
from fastinfer.measure.profile import PHOTO, POOL, StageCost
from load_tests.checks import batch_failure
from load_tests.report import (
    _batch_section,
    _http_section,
    _openvino_targets,
    _per_core,
    _targets,
    batch_vs_single,
    best_backend,
    cache_vs_bare,
    write_markdown,
)
from load_tests.tuning import check

CPU = "Test CPU 9000"


def stage(name: str, detail: str, cpu_ms: float, wall_ms: float | None = None) -> dict:
    return {"stage": name, "detail": detail, "cpu_ms": cpu_ms, "wall_ms": cpu_ms if wall_ms is None else wall_ms}


# The pool mean differs from every size class, so that a sum that used a size class would show.
STAGES = [
    stage("decode", "medium", 100.0),
    stage("preprocess", "medium", 100.0),
    stage("decode", "small", 50.0),
    stage("preprocess", "small", 50.0),
    stage("decode", POOL, 3.0),
    stage("preprocess", POOL, 1.0),
    stage("decode", PHOTO, 4.0, 4.5),
    stage("preprocess", PHOTO, 1.2, 1.5),
    stage("postprocess", "softmax + top-5", 0.5),
    stage("inference", "onnx-int8 b1", 20.0, 16.0),
    stage("inference", "onnx-int8 b8", 15.0, 12.0),
    stage("inference", "onnx b1", 80.0, 40.0),
    stage("inference", "onnx b8", 76.0, 38.0),
]


def costs() -> list[StageCost]:
    return [StageCost(**s) for s in STAGES]


# ---- the HTTP cost, measured -------------------------------------------------------------------


def test_http_cost_subtracts_the_pool_stages_and_b8_inference_for_a_batching_runner() -> None:
    h = prof.http_cost(costs(), "onnx-int8", 10, 200, front_cpu_ms=12.0, runner_cpu_ms=19.0, batching=True)
    assert h is not None
    assert h.front_stages_ms == pytest.approx(3.0 + 1.0 + 0.5)  # decode + preprocess (pool) + postprocess
    assert h.batch == 8 and h.inference_ms == 15.0
    assert h.front_overhead_ms == pytest.approx(12.0 - 4.5)
    assert h.runner_overhead_ms == pytest.approx(19.0 - 15.0)
    assert h.http_ms == pytest.approx(7.5 + 4.0)


def test_http_cost_subtracts_b1_for_a_runner_without_batching() -> None:
    h = prof.http_cost(costs(), "onnx-int8", 10, 200, front_cpu_ms=12.0, runner_cpu_ms=19.0, batching=False)
    assert h is not None and h.batch == 1 and h.inference_ms == 20.0
    assert h.runner_overhead_ms == pytest.approx(-1.0)  # kept as measured
    assert h.http_ms == pytest.approx(7.5 - 1.0)


def test_http_cost_is_clamped_at_zero_but_its_parts_are_not() -> None:
    h = prof.http_cost(costs(), "onnx-int8", 10, 200, front_cpu_ms=4.0, runner_cpu_ms=14.0, batching=True)
    assert h is not None
    assert h.front_overhead_ms == pytest.approx(-0.5) and h.runner_overhead_ms == pytest.approx(-1.0)
    assert h.http_ms == 0.0


def test_a_batching_runner_is_charged_the_cheapest_batch_within_its_max() -> None:
    noisy = [*costs(), StageCost("inference", "onnx-int8 b16", 5.0, 5.0)]
    # b16 is cheaper but beyond the runner's max batch of 8: b8 stands.
    assert prof.subtracted_batch(noisy, "onnx-int8", True, max_batch=8) == 8
    # Where the profile measured b8 dearer than b1 (noise), the cheaper b1 is the least the model cost.
    flipped = [StageCost("inference", "x b1", 10.0, 10.0), StageCost("inference", "x b8", 11.0, 11.0)]
    assert prof.subtracted_batch(flipped, "x", True) == 1
    assert prof.subtracted_batch(costs(), "onnx-int8", True, max_batch=4) == 1
    assert prof.subtracted_batch(costs(), "pytorch", True) is None


def test_no_http_cost_without_the_pool_stages() -> None:
    without_pool = [c for c in costs() if c.detail != POOL]
    assert prof.http_cost(without_pool, "onnx-int8", 10, 1, 12.0, 19.0, True) is None


# ---- the ceilings ---------------------------------------------------------------------------------


def test_ceilings_use_the_pool_mix_and_the_measured_http_cost_with_its_label() -> None:
    ceils = {(c.backend, c.batch): c for c in prof.ceilings(costs(), 2, http={"onnx-int8": 11.5})}
    int8 = ceils[("onnx-int8", 8)]
    total = 3.0 + 1.0 + 0.5 + 11.5 + 15.0
    assert int8.size_class == POOL and int8.cpu_ms_per_request == pytest.approx(total)
    assert int8.req_per_s == pytest.approx(round(2000 / total, 1))
    assert (int8.http_ms, int8.http_source) == (11.5, "measured")
    assert int8.shares["http"] == pytest.approx(round(11.5 / total, 3))
    onnx = ceils[("onnx", 8)]  # not measured: the estimate, labelled so
    assert (onnx.http_ms, onnx.http_source) == (prof.HTTP_OVERHEAD_MS, "estimate")
    assert onnx.cpu_ms_per_request == pytest.approx(4.5 + prof.HTTP_OVERHEAD_MS + 76.0)


def test_the_measured_ceiling_at_b8_is_the_servers_measured_cpu_per_request() -> None:
    # stages + (front − stages) + (runner − inference at b8) = front + runner, as measured.
    h = prof.http_cost(costs(), "onnx-int8", 10, 200, front_cpu_ms=12.0, runner_cpu_ms=19.0, batching=True)
    assert h is not None
    ceils = prof.ceilings(costs(), 2, http={"onnx-int8": h.http_ms})
    (c,) = [c for c in ceils if (c.backend, c.batch) == ("onnx-int8", 8)]
    assert c.cpu_ms_per_request == pytest.approx(12.0 + 19.0)


def test_with_http_recomputes_every_ceiling_and_keeps_the_size_classes() -> None:
    result = {"cores": 2, "http_overhead_ms": 3.0, "stages": STAGES, "ceilings": []}
    out = prof.with_http(result, {"onnx-int8": 11.5})
    assert out["http_measured_ms"] == {"onnx-int8": 11.5}
    assert {(c["backend"], c["batch"], c["http_source"]) for c in out["ceilings"]} == {
        ("onnx-int8", 1, "measured"),
        ("onnx-int8", 8, "measured"),
        ("onnx", 1, "estimate"),
        ("onnx", 8, "estimate"),
    }
    small = next(c for c in out["ceilings_by_size"] if (c["size_class"], c["backend"], c["batch"]) == (
        "small", "onnx-int8", 8))  # fmt: skip
    assert small["cpu_ms_per_request"] == pytest.approx(50.0 + 50.0 + 0.5 + 11.5 + 15.0)
    assert {c["size_class"] for c in out["ceilings_by_size"]} == {"small", "medium"}  # no phone stage measured
    assert "MEASURED" in prof.http_note(out) and "ESTIMATED 3 ms" in prof.http_note(out)
    assert "MEASURED" not in prof.http_note(result | {"ceilings": [asdict(c) for c in prof.ceilings(costs(), 2)]})


def test_in_process_latency_is_decode_preprocess_and_b1_inference_of_the_photo_in_wall_time() -> None:
    assert prof.in_process_latency_ms(costs(), "onnx-int8") == pytest.approx(4.5 + 1.5 + 16.0)
    assert prof.in_process_latency_ms(costs(), "pytorch") is None


# ---- the report ---------------------------------------------------------------------------------


def cpu(front: float, runner: float, client: float = 2.0) -> dict:
    return {
        "runner": "runner-x",
        "ms_per_request": {"front": front, "runner": runner, "other": 0.1, "load_generator": client},
        "cores_busy": {"server": 1.7, "load_generator": 0.2},
    }


def run(scenario: str, backend: str, users: int, rps: float, failures: int = 0, **extra) -> dict:
    requests = 1000
    return {
        "scenario": scenario,
        "backend": backend,
        "users": users,
        "req_per_s": rps,
        "requests": requests,
        "failures": failures,
        "error_rate": failures / requests,
        "p50_ms": 40.0,
        "p95_ms": 60.0,
        "p99_ms": 80.0,
        **extra,
    }


def bench(runs: list[dict], sequential: list[dict] | None = None, http: dict[str, float] | None = None) -> dict:
    """A results.json as the bench writes it, with the ceilings measured for ``http``."""
    profile = prof.with_http(
        {"cores": 2, "http_overhead_ms": 3.0, "stages": STAGES, "ceilings": [], "pool": {"small": 34}}, http or {}
    )
    http_cost = [
        asdict(h) for b in (http or {}) if (h := prof.http_cost(costs(), b, 10, 1000, 12.0, 19.0, True)) is not None
    ]
    return {
        "hardware": {"cpu": CPU, "cores": 2, "os": "Linux", "isa": [], "cuda": False, "mps": False,
                     "neural_engine": False},
        "date": "today",
        "command": "python -m load_tests",
        "runs": runs,
        "sequential": sequential or [],
        "profile": profile,
        "http_cost": http_cost,
    }  # fmt: skip


def test_best_backend_is_the_fastest_at_10_users_else_at_the_most_users() -> None:
    assert best_backend(bench([run("inference", "a", 10, 5.0), run("inference", "b", 10, 9.0)])) == "b"
    assert best_backend(bench([run("inference", "a", 4, 5.0), run("inference", "b", 2, 9.0)])) == "a"
    assert best_backend(bench([], [{"backend": "c", "median_ms": 3.0}, {"backend": "d", "median_ms": 2.0}])) == "d"


def test_cache_hit_target_is_the_ratio_to_bare_bentoml_with_both_figures() -> None:
    results = bench([
        run("repeat", "onnx-int8", 10, 260.0, cpu=cpu(5.5, 0.0), cache_hit_share=1.0, cache_mode="redis"),
        run("bare", "onnx-int8", 10, 200.0, cpu=cpu(3.5, 0.0)),
    ])  # fmt: skip
    compared = cache_vs_bare(results)
    assert compared is not None and compared["ratio"] == 1.3 and compared["met"]
    (line,) = _targets(results)
    assert f"Cache-hit path >= 1.3× a bare BentoML API on {CPU}: met.**" in line
    assert "260.0 req/s vs the bare BentoML API" in line and "200.0 req/s" in line and "= 1.30×" in line
    assert "Front CPU per request: 5.5 ms (FastInfer) vs 3.5 ms (bare)" in line
    assert ">= 400 req/s on 2 cores: NOT met" in line
    results["runs"][1]["req_per_s"] = 201.0
    (line,) = _targets(results)
    assert ": NOT met.**" in line and "= 1.29×" in line


def test_single_client_target_is_on_the_best_backend_against_the_same_photo_in_process() -> None:
    # in-process, wall: decode 4.5 + preprocess 1.5 + inference b1 16.0 = 22.0 ms; limit 1.15× = 25.3 ms.
    runs = [run("inference", "onnx-int8", 10, 50.0), run("inference", "onnx", 10, 20.0)]
    seq = [{"backend": "onnx-int8", "median_ms": 25.0}, {"backend": "onnx", "median_ms": 50.0}]
    line = next(x for x in _targets(bench(runs, seq)) if "Single-client" in x)
    assert "best backend (`onnx-int8`) <= 1.15 × in-process decode + preprocess + inference (b1)" in line
    assert f"on {CPU}: met.**" in line
    assert "p50 25.0 ms = 1.14× its in-process 22.0 ms" in line and "limit 25.3 ms" in line
    assert "decode 4.5 + preprocess 1.5 + inference 16.0 ms" in line
    assert "`onnx` 1.09×" in line  # 50 / (4.5 + 1.5 + 40.0)
    seq[0]["median_ms"] = 25.5
    line = next(x for x in _targets(bench(runs, seq)) if "Single-client" in x)
    assert ": NOT met.** p50 25.5 ms = 1.16×" in line
    assert "Per placement" not in line  # one run of one placement: nothing more to say


def test_single_client_target_judges_each_placement_by_its_median_run() -> None:
    """The placement step measures one client on each fresh server too: the engine in the front worker
    saves the hop, and the target is met where a placement the operator can choose meets it. As for the
    engine targets, a placement the step ran is judged on its rounds alone."""
    runs = [run("inference", "onnx-int8", 10, 50.0)]
    seq = [{"backend": "onnx-int8", "median_ms": 25.5}]  # 1.16×: the runner alone misses
    results = bench(runs, seq)
    line = next(x for x in _targets(results) if "Single-client" in x)
    assert "NOT met.** p50 25.5 ms = 1.16×" in line and "placement step" not in line
    results["placement"] = [
        {"placement": where, "round": r, "backend": "onnx-int8", "users": 10, "sequential": {"median_ms": ms}}
        for where, r, ms in [("runner process", 1, 26.0), ("front worker", 1, 23.0), ("front worker", 2, 25.4),
                             ("runner process", 2, 25.0)]
    ]  # fmt: skip
    line = next(x for x in _targets(results) if "Single-client" in x)
    # the runner: 26.0, 25.0 → the slower middle, 26.0; the front: 23.0, 25.4 → 25.4 (> 25.3)
    assert ": NOT met.** engine in the runner process: p50 26 ms = 1.18× (placement step, median of 2 runs)" in line
    assert "engine in the front worker: p50 25.4 ms = 1.15× (placement step, median of 2 runs); against" in line
    assert "The sequential step (every backend, one server): p50 25.5 ms = 1.16×." in line
    results["placement"][2]["sequential"]["median_ms"] = 25.2  # the front worker's slower run now within
    line = next(x for x in _targets(results) if "Single-client" in x)
    assert ": met.**" in line and "p50 25.2 ms = 1.15× (placement step, median of 2 runs), met with the engine in " \
        "the front worker; against its in-process 22.0 ms" in line  # fmt: skip
    # a round whose one client failed, and rows from before the step measured one client, are left out
    results["placement"][1]["sequential"] = {"backend": "onnx-int8", "error": "ReadTimeout: timed out"}
    for row in results["placement"][::3]:
        del row["sequential"]
    line = next(x for x in _targets(results) if "Single-client" in x)
    assert "engine in the runner process: p50 25.5 ms = 1.16× (the sequential step)" in line
    assert "engine in the front worker: p50 25.2 ms = 1.15× (placement step, one run)" in line


def threaded(front: float, runner: float, loops: tuple[float, float], decode: float, engine: float) -> dict:
    """A run's CPU with per-thread figures: the front's event loop and decode threads, the runner's event
    loop and engine threads (CPU ms per request)."""
    out = cpu(front, runner)
    out["threads_ms_per_request"] = {
        "front": {"event loop": loops[0], "decode": decode, "engine and other threads": 0.0},
        "runner": {"event loop": loops[1], "decode": 0.0, "engine and other threads": engine},
    }
    return out


def test_inference_at_the_batch_formed_interpolates_between_the_profiled_sizes() -> None:
    assert prof.inference_at(costs(), "onnx-int8", 1) == 20.0 and prof.inference_at(costs(), "onnx-int8", 8) == 15.0
    # a + o/b through b1 (20) and b8 (15): o = 5 ÷ (1 − 1/8) = 40/7 shared per call, a = 15 − o/8 per image
    assert prof.inference_at(costs(), "onnx-int8", 4.5) == pytest.approx(15.0 - 5 / 7 + (40 / 7) / 4.5)
    assert prof.inference_at(costs(), "onnx-int8", 4.5) < 20.0 - 5.0 * 3.5 / 7  # below the straight line
    assert prof.inference_at(costs(), "onnx-int8", 12) == 15.0  # clamped to the largest profiled
    assert prof.inference_at(costs(), "pytorch", 4) is None


def test_served_split_is_the_ceiling_without_http_and_the_causes_sum_to_what_is_beyond() -> None:
    # front 8 (loop 3.5, decode 4.5), runner 19 (loop 2.0, engine 17.0), other 0.1; pool decode 3 + preprocess 1,
    # postprocess 0.5, inference at b8 15.0 → base 19.5, ceiling 2000 / 19.5 = 102.6 req/s.
    r = run("inference", "onnx-int8", 10, 92.0, cpu=threaded(8.0, 19.0, (3.5, 2.0), 4.5, 17.0))
    r["batching"] = {"enabled": True, "max_batch_size": 8, "mean_batch": 8.0}
    split = prof.served_split(costs(), 2, r)
    assert split is not None
    assert (split.decode_ms, split.inference_ms, split.ceiling_req_per_s) == (4.0, 15.0, 102.6)
    assert split.share == pytest.approx(round(92.0 / (2000 / 19.5), 3))
    assert split.server_ms == pytest.approx(27.1) and split.beyond_ms == pytest.approx(27.1 - 19.5)
    assert split.causes == pytest.approx(
        {
            "front event loop": 3.0,  # less postprocess, which the event loop runs
            "runner event loop": 2.0,
            "decode beyond in-process": 0.5,
            "engine beyond in-process": 2.0,
            "other": 27.1 - 19.5 - 7.5,
        }
    )
    assert split.base_from_run == ()  # the run spent more than the profile on both: the profile is the base
    r["batching"]["mean_batch"] = 1.0  # the runner formed no batches: b1's dearer inference is the base...
    r["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = 21.0
    assert prof.served_split(costs(), 2, r).inference_ms == 20.0  # type: ignore[union-attr]
    # ...unless the run's engine threads spent less (the machine ran faster than while profiling): then
    # the run's own figure, so that the ceiling is never below what the run did
    r["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = 17.0
    fast = prof.served_split(costs(), 2, r)
    assert fast is not None and fast.inference_ms == 17.0 and fast.base_from_run == ("inference",)
    assert fast.causes["engine beyond in-process"] == 0.0 and fast.ceiling_req_per_s == round(2000 / 21.5, 1)
    r["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = 0.0  # not told apart: the profile
    assert prof.served_split(costs(), 2, r).inference_ms == 20.0  # type: ignore[union-attr]
    del r["cpu"]["threads_ms_per_request"]
    blind = prof.served_split(costs(), 2, r)  # no per-thread figures (off Linux): the totals, no causes
    assert blind is not None and blind.causes == {} and blind.beyond_ms == pytest.approx(27.1 - 24.5)
    del r["cpu"]
    assert prof.served_split(costs(), 2, r) is None  # no CPU read at all (--url without --server-pid)


def test_served_split_in_the_front_counts_the_front_engine_threads_as_the_engine() -> None:
    r = run("inference", "onnx-int8", 10, 92.0, cpu=threaded(26.0, 0.0, (2.0, 0.0), 4.5, 0.0))
    r["cpu"]["threads_ms_per_request"] = {"front": {"event loop": 2.0, "decode": 4.5, "engine and other threads": 19.5}}
    r["batching"] = {"enabled": True, "max_batch_size": 8, "mean_batch": 8.0}
    split = prof.served_split(costs(), 2, r, "front worker")
    assert split is not None and split.placement == "front worker"
    assert split.causes["runner event loop"] == 0.0 and split.causes["engine beyond in-process"] == pytest.approx(4.5)


def engine_bench(runner_rps: float, front_loop: float = 1.0, failures: int = 0, front_rps: float = 96.0,
                 front_total: float = 21.5) -> dict:  # fmt: skip
    """The main run and the placement step: the engine in its runner, then in the front worker, two rounds
    each (the runner's second round 2 req/s slower, the front's 1 faster)."""
    batching = {"enabled": True, "max_batch_size": 8, "mean_batch": 8.0}

    def in_runner(rps: float, round_: int = 0) -> dict:
        spent = threaded(5.0 + front_loop, 16.0, (front_loop + 0.5, 0.5), 4.0, 15.0)
        r = run("inference", "onnx-int8", 10, rps, failures if not round_ else 0, cpu=spent, batching=batching)
        return r | ({"placement": "runner process", "round": round_} if round_ else {})

    def in_front(rps: float, round_: int) -> dict:
        spent = threaded(front_total, 0.0, (1.0, 0.0), 4.0, 0.0)
        spent["threads_ms_per_request"] = {
            "front": {"event loop": 1.0, "decode": 4.0, "engine and other threads": front_total - 5.0}
        }
        r = run("inference", "onnx-int8", 10, rps, cpu=spent, batching=batching)
        return r | {"placement": "front worker", "round": round_}

    steps = [in_runner(runner_rps, 1), in_front(front_rps, 1), in_runner(runner_rps - 2, 2), in_front(front_rps + 1, 2)]
    return bench([in_runner(runner_rps)]) | {"placement": steps}


def targets_of(results: dict) -> tuple[str, str]:
    (ceiling,) = [x for x in _targets(results) if "ceiling without HTTP" in x]
    (beyond,) = [x for x in _targets(results) if "beyond decode" in x]
    return ceiling, beyond


def test_engine_targets_judge_each_placement_by_its_median_run() -> None:
    ceiling, beyond = targets_of(engine_bench(95.0))
    # base 19.5 ms → 102.6 req/s; the runner's runs 95 and 93: the lower middle, 93 = 91%; the front's 96, 97: 96
    assert f">= 90% of the engine's ceiling without HTTP, zero errors, on {CPU}: met.**" in ceiling
    assert "`onnx-int8` (0 errors)" in ceiling
    assert (
        "runner process (median of 2 runs): 93.0 req/s = 91% of 102.6 (decode + preprocess 4 + inference 15 ms at "
        "b8), 2.6 ms beyond (front event loop 1," in ceiling
    )
    assert "engine in the front worker (median of 2 runs): 96.0 req/s = 94% of 102.6 (decode" in ceiling
    assert "b8), 2.1 ms beyond" in ceiling
    assert f"(best backend, 10 clients, zero errors) on {CPU}: met.** 2.6 ms with the engine in the runner" in beyond
    ceiling, beyond = targets_of(engine_bench(85.0, front_loop=4.0, front_rps=84.0))
    assert ": NOT met.**" in ceiling and "83.0 req/s = 81%" in ceiling and "84.0 req/s = 82%" in ceiling
    # the runner's 5.6 ms beyond misses; the front worker's 2.1 ms meets it: a placement the operator can choose
    assert ": met.** 5.6 ms with the engine in the runner process; 2.1 ms with the engine in the front worker" in beyond
    ceiling, beyond = targets_of(engine_bench(85.0, front_loop=4.0, front_total=25.0))
    assert ": NOT met.** 5.6 ms" in beyond  # the front worker's 5.6 ms too
    (ceiling, _) = targets_of(engine_bench(99.0, failures=1))
    assert ": NOT met.**" in ceiling and "(1 errors)" in ceiling


def test_a_profile_dearer_than_the_run_gives_way_to_the_run_within_drift() -> None:
    """The in-process inference is measured minutes before; on a shared machine it can cost more than the
    run's engine threads spent. Within drift the run's own figure is the base: the ceiling rises (the share
    is not flattered) and the verdict stands on what the run measured. Far below, the threads' CPU went
    elsewhere (not told apart): the profile stands, and the run carries no verdict."""
    ceiling, beyond = targets_of(engine_bench(95.0, front_total=18.0))  # front engine 13 >= 0.75 × 15
    assert (
        "96.0 req/s = 84% of 114.3 (decode + preprocess 4 + inference 13 ms at b8, inference from the run)" in ceiling
    )
    assert "0.6 ms with the engine in the front worker" in beyond and "not judged" not in ceiling
    ceiling, beyond = targets_of(engine_bench(95.0, front_total=10.0))  # front engine 5: a third of the profile
    assert "94% of 102.6 (decode + preprocess 4 + inference 15 ms at b8), -9.4 ms beyond" in ceiling
    assert "engine beyond in-process -10" in ceiling and "not judged" in ceiling
    assert ": met.**" in ceiling  # judged on the runner's runs alone
    results = engine_bench(95.0, front_total=10.0)
    for row in [*results["placement"], results["runs"][0]]:
        del row["cpu"]["threads_ms_per_request"]  # no threads told apart (off Linux): the totals alone...
        row["cpu"]["ms_per_request"]["runner"] = 1.0  # ...now below the profile in every run: noise
    ceiling, beyond = targets_of(results)
    assert ": not judged.**" in ceiling and ": not judged.**" in beyond


def test_decode_from_the_run_within_drift() -> None:
    r = run("inference", "onnx-int8", 10, 92.0, cpu=threaded(8.0, 19.0, (3.5, 2.0), 3.5, 17.0))
    r["batching"] = {"enabled": True, "max_batch_size": 8, "mean_batch": 8.0}
    split = prof.served_split(costs(), 2, r)  # decode threads 3.5 of the profile's 4.0: drift
    assert split is not None and split.decode_ms == 3.5 and split.base_from_run == ("decode",)
    assert split.causes["decode beyond in-process"] == 0.0
    r["cpu"]["threads_ms_per_request"]["front"]["decode"] = 2.0  # half: not told apart, the profile stands
    split = prof.served_split(costs(), 2, r)
    assert split is not None and split.decode_ms == 4.0 and split.causes["decode beyond in-process"] == -2.0


def test_a_share_just_below_the_target_never_reads_as_the_target() -> None:
    ceiling, _ = targets_of(engine_bench(92.0, front_rps=91.9))  # 91.9 / 102.6 = 89.6%
    assert "NOT met" in ceiling and "91.9 req/s = 89.6% of 102.6" in ceiling and "90.0 req/s = 87.7%" not in ceiling
    assert "90.0 req/s = 88% of 102.6" in ceiling  # far from the target: whole percents


def test_a_run_whose_first_reading_missed_a_process_says_so() -> None:
    from load_tests.report import _http_section

    results = bench([run("inference", "onnx-int8", 10, 50.0, cpu=cpu(8.0, 20.0))], [], http={"onnx-int8": 11.5})
    assert "missed a server process" not in "\n".join(_http_section(results))
    results["runs"][0]["cpu"]["missed_processes"] = 2
    text = "\n".join(_http_section(results))
    assert "missed a server process" in text and "inference `onnx-int8` 10 users: 2 process(es)" in text


def test_decode_target_compares_the_pool_with_pillow_alone_in_the_same_run() -> None:
    results = bench([])
    results["profile"]["stages"] = [*STAGES, stage("decode", prof.POOL_PILLOW, 6.0)]
    (line,) = [x for x in _targets(results) if "Pillow alone" in x]
    # (3 + 1) / (6 + 1) = 57%
    assert f"<= 60% of Pillow alone's, same photos, same run, on {CPU}: met.** 4.00 vs 7.00 CPU ms" in line
    results["profile"]["stages"][-1] = stage("decode", prof.POOL_PILLOW, 5.0)
    (line,) = [x for x in _targets(results) if "Pillow alone" in x]
    assert ": NOT met.**" in line and "= 67%" in line


def test_served_section_lists_every_backend_and_the_placement_runs(tmp_path) -> None:
    from load_tests.report import _served_section, served_splits

    results = engine_bench(93.0)
    assert [(s["placement"], s["run_round"]) for s in served_splits(results)] == [
        ("runner process", 0),
        ("runner process", 1),
        ("front worker", 1),
        ("runner process", 2),
        ("front worker", 2),
    ]
    text = "\n".join(_served_section(results, "docs/bench"))
    assert "## Served vs the engine's ceiling" in text and "docs/bench/served.png" in text
    assert "| `onnx-int8` | runner process | 10 | 93.0 | 102.6 (4 + 15 ms at b8) | **91%** | 22.1 | **2.6** |" in text
    assert "| `onnx-int8` | front worker (placement step, round 1) | 10 | 96.0 |" in text


def test_http_section_shows_the_split_and_the_cache_hit_front_cpu() -> None:
    runs = [
        run("inference", "onnx-int8", 10, 58.0, cpu=cpu(12.0, 19.0, client=3.25)),
        run("repeat", "onnx-int8", 10, 260.0, cpu=cpu(5.5, 0.0)),
        run("bare", "onnx-int8", 10, 200.0, cpu=cpu(3.5, 0.0)),
    ]
    text = "\n".join(_http_section(bench(runs, http={"onnx-int8": 11.5})))
    assert "## The HTTP path, measured" in text
    # backend, users, front, runner, in-process front stages, inference (batch), overheads, HTTP, batch, client
    assert "| `onnx-int8` | 10 | 12.0 | 19.0 | 4.5 | 15.0 (b8) | 7.5 | 4.0 | **11.5** | — | 3.25 |" in text
    assert "costs the front **5.5 CPU ms per request**" in text
    assert "the bare BentoML API, same body, 3.5 CPU ms per request" in text and "= 1.30×" in text
    assert "Other work shared these cores" not in text
    runs[0]["cpu"] = cpu(12.0, 19.0) | {"cores_busy": {"server": 1.2, "load_generator": 0.1, "rest_of_machine": 0.6,
                                                       "steal": 0.0}}  # fmt: skip
    text = "\n".join(_http_section(bench(runs, http={"onnx-int8": 11.5})))
    assert "during some runs" in text and "inference `onnx-int8` 10 users: 0.6 cores busy elsewhere" in text


def test_http_section_warns_when_the_cache_hit_run_was_not_all_hits() -> None:
    runs = [
        run("repeat", "onnx-int8", 10, 14.4, cpu=cpu(11.96, 16.07), cache_hit_share=1.0, cache_errors=3),
        run("bare", "onnx-int8", 10, 281.2, cpu=cpu(3.52, 0.0)),
    ]
    text = "\n".join(_http_section(bench(runs)))
    assert "the runner used 16.07 CPU ms per request in that run and the cache had 3 errors" in text
    assert "3 cache errors" in _targets(bench(runs))[0]
    runs[0].update(cpu=cpu(5.5, 0.0), cache_errors=0)
    assert "Not every cache-hit request was a hit" not in "\n".join(_http_section(bench(runs)))


def test_batch_section_compares_images_per_second_with_single_requests_of_the_same_run() -> None:
    single = run("inference", "openvino-int8", 10, 50.0, cpu=cpu(12.0, 20.0, client=3.0))
    batch = run("batch", "openvino-int8", 10, 8.0, images_per_request=8, images_per_s=64.0,
                cpu=cpu(80.0, 140.0, client=4.0))  # fmt: skip
    results = bench([single, batch]) | {"batch": {"backend": "openvino-int8", "users": 10}}
    compared = batch_vs_single(results)
    assert compared is not None
    assert (compared["batch_images_per_s"], compared["single_images_per_s"], compared["ratio"]) == (64.0, 50.0, 1.28)
    assert compared["cpu_ms_per_image"]["batch"] == {"front": 10.0, "runner": 17.5, "load_generator": 0.5}
    text = "\n".join(_batch_section(results))
    assert "**64.0 images/s** in batches of 8 vs 50.0 images/s one photo per request" in text
    assert "= **1.28×**" in text and "0 of 1000 batch requests failed." in text
    assert "| batches of 8 | 10.0 | 17.5 | 0.5 |" in text


def test_a_skipped_batch_step_says_why() -> None:
    results = bench([]) | {"batch": {"backend": "x", "skipped": "this server has no POST /classify/batch (HTTP 404)"}}
    assert "Not measured in this run: this server has no POST /classify/batch (HTTP 404)." in _batch_section(results)


def test_batch_answers_fail_on_status_count_errors_and_cache_hits() -> None:
    ok = {"results": [{"class": "cat", "cached": False}] * 8}
    assert batch_failure(200, ok, 8) is None
    assert batch_failure(503, None, 8) == "HTTP 503"
    assert batch_failure(200, {"results": ok["results"][:7]}, 8) == "7 results for 8 images"
    with_error = {"results": [*ok["results"][:7], {"error": {"code": "invalid_image", "message": "bad"}}]}
    assert "image 7" in (batch_failure(200, with_error, 8) or "")
    cached = {"results": [{"class": "cat", "cached": True}, *ok["results"][:7]]}
    assert "image 0: a cache hit" in (batch_failure(200, cached, 8) or "")


def test_the_whole_report_renders_the_new_sections(tmp_path) -> None:
    runs = [
        run("inference", "onnx-int8", 10, 58.0, cpu=cpu(12.0, 19.0)),
        run("repeat", "onnx-int8", 10, 260.0, cpu=cpu(5.5, 0.0), cache_hit_share=1.0, cache_mode="redis"),
        run("bare", "onnx-int8", 10, 200.0, cpu=cpu(3.5, 0.0)),
    ]
    seq = [{"backend": "onnx-int8", "median_ms": 25.0, "p95_ms": 30.0,
            "stages_p50_ms": {"decode": 4.0, "preprocess": 1.0, "inference": 16.0}}]  # fmt: skip
    results = bench(runs, seq, http={"onnx-int8": 11.5}) | {"batch": {"skipped": "no endpoint"}}
    md = tmp_path / "BENCHMARKS.md"
    write_markdown(results, md, tmp_path, tmp_path / "plots")
    text = md.read_text()
    for heading in ("## Targets", "## The HTTP path, measured", "## Batch API", "## Where the time goes"):
        assert heading in text
    assert f"{check.SECTION}\n\nNot run on this machine: `make tune-check`" in text
    assert not (tmp_path / "plots" / "tuning.png").exists()
    # the pool's ceiling, then each size class alone (small: 50 + 50 + 0.5 + 11.5 + 15 = 127 ms → 15.7 req/s)
    assert "| onnx-int8 | 8 | 31.0 | 64.5 | inference (48%) | 11.5 (measured) | 15.7 | 8.8 |" in text
    assert (
        "| inference | onnx-int8 | 10 | 58.0 | 40.0 | 60.0 | 80.0 | 0 (0.0%) | 0% (bypassed) | 90% | 12, 19, 2 |"
        in text
    )


def test_the_bench_shows_the_last_tune_check_with_its_own_plot(tmp_path) -> None:
    trial = {"label": "onnx-int8, runner", "config": {"backend": "onnx-int8"}, "req_per_s": 20.0, "p50_ms": 400,
             "p95_ms": 500, "failures": 0, "requests": 200, "error": "", "position": 0, "qualified": True}  # fmt: skip
    saved = {
        "format": check.FORMAT, "stage": "done", "command": "make tune-check", "date": "today",
        "hardware": {"cpu": "Other CPU", "cores": 2}, "goal": "throughput: most req/s at 10 clients",
        "backends": ["onnx-int8"], "seconds": 10, "share_in_sweep": 1.0, "share_head_to_head": None,
        "head_to_head": None, "head_to_head_best": None,
        "tune": {"elapsed_s": 240, "budget_s": 420, "trials": 3, "chosen": trial, "decisions": [], "skipped": []},
        "sweep": {"elapsed_s": 3000, "estimate_s": 2900, "configurations": 1, "servers": 1, "best": trial,
                  "trials": [trial]},
    }  # fmt: skip
    (tmp_path / "tuning.json").write_text(json.dumps(saved))
    results = bench([run("inference", "onnx-int8", 10, 58.0)])
    md = tmp_path / "BENCHMARKS.md"
    write_markdown(results, md, tmp_path, tmp_path / "plots")
    text = md.read_text()
    assert "**Measured on Other CPU, not on this run's CPU.**" in text and "](plots/tuning.png)" in text
    assert "In <= 1/4 of the sweep's time: **met**, 4.0 min" in text
    assert (tmp_path / "plots" / "tuning.png").stat().st_size > 10_000
    del saved["tune"]["skipped"]  # a hand-edited file: the bench still writes its report
    (tmp_path / "tuning.json").write_text(json.dumps(saved))
    write_markdown(results, md, tmp_path, tmp_path / "plots")
    assert "could not be read: KeyError" in md.read_text() and not (tmp_path / "plots" / "tuning.png").exists()


# ---- the earlier targets, kept ----------------------------------------------------------------------


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


def test_an_engine_cheaper_than_profiled_cannot_cancel_real_overhead_into_a_met() -> None:
    """A run whose engine threads spent less than the profile says inference costs: the run's figure is the
    base, so the saving is no negative cause that would cancel the event loops' real overhead."""
    results = engine_bench(95.0)
    results["placement"] = [p for p in results["placement"] if p["placement"] == "runner process"]
    for step in results["placement"]:
        step["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = 12.0  # 3 below inference
        step["cpu"]["threads_ms_per_request"]["front"]["event loop"] = 6.5  # and 5 more in the event loop
    ceiling, beyond = targets_of(results)
    assert ": NOT met.**" in ceiling and "= 77% of 121.2" in ceiling and "inference from the run" in ceiling
    assert ": NOT met.** 5.6 ms with the engine in the runner process" in beyond


def test_each_placement_keeps_its_own_runs_whatever_the_step_left_out() -> None:
    """A results.json whose placement rows carry no round (written before rounds were numbered) keeps them;
    a placement the step did not run falls back to the main run; each placement says how many runs it had."""
    results = engine_bench(95.0)
    for step in results["placement"]:
        step.pop("round")
    ceiling, _ = targets_of(results)
    assert "engine in the front worker (median of 2 runs): 96.0 req/s" in ceiling and ": met.**" in ceiling
    results = engine_bench(95.0)
    results["placement"] = [p for p in results["placement"] if p["placement"] == "front worker"][:1]
    ceiling, _ = targets_of(results)
    assert "engine in the runner process (one run): 95.0 req/s" in ceiling  # the main run
    assert "engine in the front worker (one run): 96.0 req/s" in ceiling
    results = engine_bench(95.0)
    results["placement"] = results["placement"][:3]  # runner twice, front once
    ceiling, _ = targets_of(results)
    assert "runner process (median of 2 runs)" in ceiling and "front worker (one run)" in ceiling


def test_the_default_backend_target_is_its_10_user_throughput_over_onnx_in_the_same_run() -> None:
    results = bench([run("inference", "onnx", 10, 10.0), run("inference", "openvino-int8", 10, 31.0),
                     run("inference", "openvino-int8", 1, 99.0)])  # fmt: skip
    results["default"] = {"backend": "openvino-int8", "requested": "auto", "source": "rule", "why": "x86"}
    (line,) = [t for t in _targets(results) if "default backend at 10 clients" in t]
    assert ": met.**" in line and "31.0 req/s vs `onnx` 10.0 req/s = 3.10×" in line and CPU in line
    assert "FASTINFER_DEFAULT_BACKEND=auto, rule: x86" in line
    results["runs"][1]["req_per_s"] = 29.0
    (line,) = [t for t in _targets(results) if "default backend at 10 clients" in t]
    assert "NOT met" in line and "2.90×" in line
    del results["default"]  # a run that did not learn the server's default claims nothing
    assert not [t for t in _targets(results) if "default backend" in t]


def test_a_run_whose_reading_missed_a_server_process_carries_no_engine_verdict() -> None:
    """Its figures leave that process's CPU out: they understate the server and could read "met"."""
    results = engine_bench(95.0)
    for row in results["placement"]:
        row["cpu"]["missed_processes"] = 1
    ceiling, beyond = targets_of(results)
    assert ": not judged.**" in ceiling and ": not judged.**" in beyond
    assert "the CPU reading missed 1 server process(es), so its figures understate, not judged" in ceiling


def test_a_share_is_never_rounded_up_to_the_target() -> None:
    from load_tests.report import _share

    assert _share(0.895) == "89.5%" and _share(0.905) == "90.5%" and _share(0.88) == "88%"
    ceiling, _ = targets_of(engine_bench(80.0, front_rps=92.26))  # 92.26 / (2000 / 19.5) = 0.89954
    assert ": NOT met.**" in ceiling and "92.26 req/s = 89.9% of 102.6" in ceiling


def test_a_placement_whose_one_client_failed_cannot_meet_the_single_client_target() -> None:
    results = bench([run("inference", "onnx-int8", 10, 50.0)], [{"backend": "onnx-int8", "median_ms": 25.5}])
    results["placement"] = [
        {"placement": "front worker", "round": 1, "backend": "onnx-int8", "users": 10, "sequential": alone}
        for alone in ({"median_ms": 23.0}, {"backend": "onnx-int8", "error": "ReadTimeout: timed out"},
                      {"median_ms": float("nan")}, {"median_ms": -1.0})
    ]  # fmt: skip
    line = next(x for x in _targets(results) if "Single-client" in x)
    assert ": NOT met.**" in line and "engine in the front worker: p50 23 ms = 1.05× (placement step, one run)" in line
    assert "With the engine in the front worker the one client failed in 3 round(s): ReadTimeout: timed out; " \
        "p50 nan; p50 -1.0." in line  # fmt: skip
