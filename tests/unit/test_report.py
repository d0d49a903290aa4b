"""BENCHMARKS.md's targets are rows judged from the data (met, NOT met, not judged, not measured), its first table
is results.json's rows, its sections show the data, and the HTTP cost and the ceilings are the arithmetic
docs/benchmarks.md says they are."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from fastinfer.measure import profile as prof
from fastinfer.measure.profile import PHOTO, POOL, StageCost
from load_tests.checks import batch_failure
from load_tests.report import _batch_section, _http_section, _served_section, render_targets, write_markdown
from load_tests.targets import Target, _share, best_backend, served_splits, speed_up_targets, targets

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


@pytest.mark.parametrize(
    ("front", "runner", "batching", "batch", "inference", "front_overhead", "runner_overhead", "http"),
    [
        (12.0, 19.0, True, 8, 15.0, 7.5, 4.0, 11.5),  # a batching runner: less b8 inference
        (12.0, 19.0, False, 1, 20.0, 7.5, -1.0, 6.5),  # without batching: less b1; an overhead kept as measured
        (4.0, 14.0, True, 8, 15.0, -0.5, -1.0, 0.0),  # the cost clamped at zero, its parts not
    ],
)
def test_http_cost_is_the_servers_cpu_less_the_pool_stages_and_the_inference_its_runner_ran(
    front, runner, batching, batch, inference, front_overhead, runner_overhead, http
) -> None:
    h = prof.http_cost(costs(), "onnx-int8", 10, 200, front_cpu_ms=front, runner_cpu_ms=runner, batching=batching)
    assert h is not None
    assert h.front_stages_ms == pytest.approx(3.0 + 1.0 + 0.5)  # decode + preprocess (pool) + postprocess
    assert (h.batch, h.inference_ms) == (batch, inference)
    assert (h.front_overhead_ms, h.runner_overhead_ms) == pytest.approx((front_overhead, runner_overhead))
    assert h.http_ms == pytest.approx(http)


def test_a_batching_runner_is_charged_the_cheapest_batch_within_its_max_and_the_pool_stages_are_needed() -> None:
    noisy = [*costs(), StageCost("inference", "onnx-int8 b16", 5.0, 5.0)]
    # b16 is cheaper but beyond the runner's max batch of 8: b8 stands.
    assert prof.subtracted_batch(noisy, "onnx-int8", True, max_batch=8) == 8
    # Where the profile measured b8 dearer than b1 (noise), the cheaper b1 is the least the model cost.
    flipped = [StageCost("inference", "x b1", 10.0, 10.0), StageCost("inference", "x b8", 11.0, 11.0)]
    assert prof.subtracted_batch(flipped, "x", True) == 1
    assert prof.subtracted_batch(costs(), "onnx-int8", True, max_batch=4) == 1
    assert prof.subtracted_batch(costs(), "pytorch", True) is None
    without_pool = [c for c in costs() if c.detail != POOL]  # and no HTTP cost without the pool's stages
    assert prof.http_cost(without_pool, "onnx-int8", 10, 1, 12.0, 19.0, True) is None


# ---- the ceilings ---------------------------------------------------------------------------------


def test_ceilings_use_the_pool_mix_and_the_measured_http_cost_with_its_label() -> None:
    ceils = {(c.backend, c.batch): c for c in prof.ceilings(costs(), 2, http={"onnx-int8": 11.5})}
    int8 = ceils[("onnx-int8", 8)]
    total = 3.0 + 1.0 + 0.5 + 11.5 + 15.0
    # 31 ms = front 12 + runner 19: with the HTTP cost measured from them (the http_cost table's first row), the
    # ceiling at b8 costs what the server measured
    assert int8.size_class == POOL and int8.cpu_ms_per_request == pytest.approx(total) == 12.0 + 19.0
    assert int8.req_per_s == pytest.approx(round(2000 / total, 1))
    assert (int8.http_ms, int8.http_source) == (11.5, "measured")
    assert int8.shares["http"] == pytest.approx(round(11.5 / total, 3))
    onnx = ceils[("onnx", 8)]  # not measured: the estimate, labelled so
    assert (onnx.http_ms, onnx.http_source) == (prof.HTTP_OVERHEAD_MS, "estimate")
    assert onnx.cpu_ms_per_request == pytest.approx(4.5 + prof.HTTP_OVERHEAD_MS + 76.0)


def test_with_http_recomputes_every_ceiling_and_keeps_the_size_classes() -> None:
    result = {"cores": 2, "http_overhead_ms": 3.0, "stages": STAGES, "ceilings": []}
    out = prof.with_http(result, {"onnx-int8": 11.5})
    assert out["http_measured_ms"] == {"onnx-int8": 11.5}
    every = {(b, n, source) for b, source in (("onnx-int8", "measured"), ("onnx", "estimate")) for n in (1, 8)}
    assert {(c["backend"], c["batch"], c["http_source"]) for c in out["ceilings"]} == every
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


def test_decode_from_the_run_within_drift() -> None:
    r = run("inference", "onnx-int8", 10, 92.0, cpu=threaded(8.0, 19.0, (3.5, 2.0), 3.5, 17.0))
    r["batching"] = {"enabled": True, "max_batch_size": 8, "mean_batch": 8.0}
    split = prof.served_split(costs(), 2, r)  # decode threads 3.5 of the profile's 4.0: drift
    assert split is not None and split.decode_ms == 3.5 and split.base_from_run == ("decode",)
    assert split.causes["decode beyond in-process"] == 0.0
    r["cpu"]["threads_ms_per_request"]["front"]["decode"] = 2.0  # half: not told apart, the profile stands
    split = prof.served_split(costs(), 2, r)
    assert split is not None and split.decode_ms == 4.0 and split.causes["decode beyond in-process"] == -2.0


def test_batch_answers_fail_on_status_count_errors_and_cache_hits() -> None:
    ok = {"results": [{"class": "cat", "cached": False}] * 8}
    assert batch_failure(200, ok, 8) is None
    assert batch_failure(503, None, 8) == "HTTP 503"
    assert batch_failure(200, {"results": ok["results"][:7]}, 8) == "7 results for 8 images"
    with_error = {"results": [*ok["results"][:7], {"error": {"code": "invalid_image", "message": "bad"}}]}
    assert "image 7" in (batch_failure(200, with_error, 8) or "")
    cached = {"results": [{"class": "cat", "cached": True}, *ok["results"][:7]]}
    assert "image 0: a cache hit" in (batch_failure(200, cached, 8) or "")


def row(results: dict, name: str) -> Target:
    """The one target row whose name starts with ``name``."""
    (found,) = [t for t in targets(results) if t.name.startswith(name)]
    return found


def targets_of(results: dict) -> tuple[Target, Target]:
    return row(results, "Served / ceiling without HTTP"), row(results, "Server CPU beyond decode + inference")


def test_best_backend_is_the_fastest_at_10_users_else_at_the_most_users() -> None:
    assert best_backend(bench([run("inference", "a", 10, 5.0), run("inference", "b", 10, 9.0)])) == "b"
    assert best_backend(bench([run("inference", "a", 4, 5.0), run("inference", "b", 2, 9.0)])) == "a"
    assert best_backend(bench([], [{"backend": "c", "median_ms": 3.0}, {"backend": "d", "median_ms": 2.0}])) == "d"


def test_cache_hit_target_is_the_ratio_to_bare_bentoml_with_both_figures_and_says_when_not_all_were_hits() -> None:
    results = bench([
        run("repeat", "onnx-int8", 10, 260.0, cpu=cpu(5.5, 0.0), cache_hit_share=1.0, cache_mode="redis"),
        run("bare", "onnx-int8", 10, 200.0, cpu=cpu(3.5, 0.0)),
    ])  # fmt: skip
    ratio, absolute = targets(results)
    assert ratio == Target("Cache-hit path vs a bare BentoML API", "1.30× (260.0 vs 200.0 req/s), 100% hits, 0 errors",
                           ">= 1.3×, all hits, zero errors", "met", f"{CPU}, 2 cores")  # fmt: skip
    assert (absolute.figure, absolute.goal, absolute.verdict) == ("260.0 req/s", ">= 400 req/s", "NOT met")
    results["runs"][1]["req_per_s"] = 201.0
    ratio = row(results, "Cache-hit path vs")
    assert ratio.verdict == "NOT met" and "1.29×" in ratio.figure
    results["runs"][1]["req_per_s"] = 100.0
    results["runs"][0]["cache_hit_share"] = 0.98  # not all hits: a miss is no cache-hit path
    assert row(results, "Cache-hit path vs").verdict == "NOT met"
    del results["runs"][1]
    assert row(results, "Cache-hit path vs").verdict == "not measured"
    runs = [  # a run that was not all hits says so
        run("repeat", "onnx-int8", 10, 14.4, cpu=cpu(11.96, 16.07), cache_hit_share=1.0, cache_errors=3),
        run("bare", "onnx-int8", 10, 281.2, cpu=cpu(3.52, 0.0)),
    ]
    figure = row(bench(runs), "Cache-hit path vs").figure
    assert "3 cache errors, the runner used 16.07 CPU ms per request: not every request was a hit" in figure
    runs[0].update(cpu=cpu(5.5, 0.0), cache_errors=0)
    assert "not every request" not in row(bench(runs), "Cache-hit path vs").figure


def test_single_client_target_is_on_the_best_backend_against_the_same_photo_in_process() -> None:
    # in-process, wall: decode 4.5 + preprocess 1.5 + inference b1 16.0 = 22.0 ms; limit 1.15× = 25.3 ms.
    runs = [run("inference", "onnx-int8", 10, 50.0), run("inference", "onnx", 10, 20.0)]
    seq = [{"backend": "onnx-int8", "median_ms": 25.0}, {"backend": "onnx", "median_ms": 50.0}]
    target = row(bench(runs, seq), "Single-client p50")
    assert target.name == "Single-client p50, best backend (`onnx-int8`)" and target.verdict == "met"
    assert target.figure == "runner process: 25 ms = 1.14× (sequential step); in process 22.0 ms"
    assert target.goal == "<= 1.15× in process (25.3 ms)"
    seq[0]["median_ms"] = 25.5
    target = row(bench(runs, seq), "Single-client p50")
    assert target.verdict == "NOT met" and "25.5 ms = 1.16×" in target.figure


def test_single_client_target_judges_each_placement_by_its_median_run() -> None:
    """The placement step measures one client on each fresh server too: the target is met where a placement
    the operator can choose meets it; a placement the step ran is judged on its rounds alone."""
    results = bench([run("inference", "onnx-int8", 10, 50.0)], [{"backend": "onnx-int8", "median_ms": 25.5}])
    results["placement"] = [
        {"placement": where, "round": r, "backend": "onnx-int8", "users": 10, "sequential": {"median_ms": ms}}
        for where, r, ms in [("runner process", 1, 26.0), ("front worker", 1, 23.0), ("front worker", 2, 25.4),
                             ("runner process", 2, 25.0)]
    ]  # fmt: skip
    target = row(results, "Single-client p50")
    # the runner: 26.0, 25.0 → the slower middle, 26.0; the front: 23.0, 25.4 → 25.4 (> 25.3)
    assert target.verdict == "NOT met"
    # judged on the fastest configuration, named first
    assert target.figure.startswith("best: front worker: 25.4 ms = 1.15× (median of 2 runs); runner process: 26 ms")
    results["placement"][2]["sequential"]["median_ms"] = 25.2  # the front worker's slower run now within
    assert row(results, "Single-client p50").verdict == "met"
    # a round whose one client failed, and rows from before the step measured one client, are left out
    results["placement"][1]["sequential"] = {"backend": "onnx-int8", "error": "ReadTimeout: timed out"}
    for r in results["placement"][::3]:
        del r["sequential"]
    target = row(results, "Single-client p50")
    assert "runner process: 25.5 ms = 1.16× (sequential step); front worker: 25.2 ms = 1.15× (one run)" in target.figure
    assert "front worker: one client failed in 1 round(s): ReadTimeout: timed out" in target.figure
    assert target.verdict == "NOT met"  # a placement whose one client failed cannot meet it
    results["placement"] = [
        {"placement": "front worker", "round": 1, "backend": "onnx-int8", "users": 10, "sequential": alone}
        for alone in ({"median_ms": 23.0}, {"backend": "onnx-int8", "error": "ReadTimeout: timed out"},
                      {"median_ms": float("nan")}, {"median_ms": -1.0})
    ]  # fmt: skip
    target = row(results, "Single-client p50")
    assert target.verdict == "NOT met" and "front worker: 23 ms = 1.05× (one run)" in target.figure
    assert "front worker: one client failed in 3 round(s): ReadTimeout: timed out; p50 nan; p50 -1.0" in target.figure
    results["sequential"] = []
    assert not [t for t in targets(results) if t.name.startswith("Single-client")]  # no sequential step: no row


def test_engine_targets_judge_each_placement_by_its_median_run() -> None:
    ceiling, beyond = targets_of(engine_bench(95.0))
    # base 19.5 ms → 102.6 req/s; the runner's runs 95 and 93: the lower middle, 93 = 91%; the front's 96, 97: 96
    assert ceiling.name == "Served / ceiling without HTTP, best backend (`onnx-int8`), 10 clients"
    assert (ceiling.goal, ceiling.verdict) == (">= 85%, zero errors", "met")
    assert ceiling.figure == ("best: front worker (median of 2 runs): 96.0 req/s = 94% of 102.6; runner process "
                              "(median of 2 runs): 93.0 req/s = 91% of 102.6; 0 errors")  # fmt: skip
    assert beyond.figure == "best: front worker (median of 2 runs): 2.1 ms; runner process (median of 2 runs): 2.6 ms"
    assert (beyond.goal, beyond.verdict) == ("<= 3 ms per request, zero errors", "met")
    ceiling, beyond = targets_of(engine_bench(85.0, front_loop=4.0, front_rps=84.0))
    assert (
        ceiling.verdict == "NOT met" and "83.0 req/s = 81%" in ceiling.figure and "84.0 req/s = 82%" in ceiling.figure
    )
    # the runner's 5.6 ms beyond misses; the front worker's 2.1 ms meets it: a placement the operator can choose
    assert beyond.verdict == "met" and "runner process (median of 2 runs): 5.6 ms" in beyond.figure
    _, beyond = targets_of(engine_bench(85.0, front_loop=4.0, front_total=25.0))
    assert beyond.verdict == "NOT met"  # the front worker's 5.6 ms too
    ceiling, _ = targets_of(engine_bench(99.0, failures=1))
    assert ceiling.verdict == "NOT met" and ceiling.figure.endswith("; 1 errors")


def test_a_profile_dearer_than_the_run_gives_way_to_the_run_within_drift() -> None:
    """Within drift the run's own figure is the base: the ceiling rises and the verdict stands on what the run
    measured. Far below, the threads' CPU went elsewhere (not told apart): the profile stands, and the run
    carries no verdict."""
    results = engine_bench(95.0, front_total=18.0)  # front engine 13 >= 0.75 × 15
    ceiling, beyond = targets_of(results)
    assert "front worker (median of 2 runs): 96.0 req/s = 84% of 114.3" in ceiling.figure
    assert "front worker (median of 2 runs): 0.6 ms" in beyond.figure and "not judged" not in ceiling.figure
    assert "114.3 (4 + 13 ms at b8, inference from the run)" in "\n".join(_served_section(results, "docs/bench"))
    results = engine_bench(95.0, front_total=10.0)  # front engine 5: a third of the profile
    ceiling, beyond = targets_of(results)
    assert "96.0 req/s = 94% of 102.6, not judged: figures below their base" in ceiling.figure
    assert ceiling.verdict == "met"  # judged on the runner's runs alone
    assert "| **-9.4** |" in "\n".join(_served_section(results, "docs/bench"))
    for r in [*results["placement"], results["runs"][0]]:
        del r["cpu"]["threads_ms_per_request"]  # no threads told apart (off Linux): the totals alone...
        r["cpu"]["ms_per_request"]["runner"] = 1.0  # ...now below the profile in every run: noise
    ceiling, beyond = targets_of(results)
    assert ceiling.verdict == beyond.verdict == "not judged"


def test_an_engine_cheaper_than_profiled_cannot_cancel_real_overhead_into_a_met() -> None:
    results = engine_bench(95.0)
    results["placement"] = [p for p in results["placement"] if p["placement"] == "runner process"]
    for step in results["placement"]:
        step["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = 12.0  # 3 below inference
        step["cpu"]["threads_ms_per_request"]["front"]["event loop"] = 6.5  # and 5 more in the event loop
    ceiling, beyond = targets_of(results)
    assert ceiling.verdict == "NOT met" and "= 77% of 121.2" in ceiling.figure
    assert beyond.verdict == "NOT met" and beyond.figure == "runner process (median of 2 runs): 5.6 ms"


def test_each_placement_keeps_its_own_runs_whatever_the_step_left_out() -> None:
    results = engine_bench(95.0)
    for step in results["placement"]:
        step.pop("round")  # written before rounds were numbered
    ceiling, _ = targets_of(results)
    assert "front worker (median of 2 runs): 96.0 req/s" in ceiling.figure and ceiling.verdict == "met"
    results = engine_bench(95.0)
    results["placement"] = [p for p in results["placement"] if p["placement"] == "front worker"][:1]
    ceiling, _ = targets_of(results)
    assert "runner process (one run): 95.0 req/s" in ceiling.figure  # the main run
    assert "front worker (one run): 96.0 req/s" in ceiling.figure
    results = engine_bench(95.0)
    results["placement"] = results["placement"][:3]  # runner twice, front once
    ceiling, _ = targets_of(results)
    assert "runner process (median of 2 runs)" in ceiling.figure and "front worker (one run)" in ceiling.figure


def scheduled(results: dict, front_engine: float = 15.4, runner_engine: float = 16.5) -> dict:
    """``results`` (engine_bench's) as a bench recorded them while FASTINFER_SCHEDULING existed (since removed; its
    results.json still reads): the bench's own server taking turns, and the placement step run under both
    schedulings: shared as it was, turns 2 req/s faster with the engine's threads at ``front_engine`` ms per
    request in the front worker; every engine in a runner at ``runner_engine``."""
    results |= {"scheduling": "turns", "decode_threads": 0}
    steps = [dict(r, scheduling="shared") for r in results["placement"]]
    turns = [json.loads(json.dumps(r)) | {"scheduling": "turns"} for r in steps]
    for r in turns:
        r["req_per_s"] += 2
        if r["placement"] == "front worker":  # engine_bench's front: 16.5 ms in its engine threads
            r["cpu"]["threads_ms_per_request"]["front"]["engine and other threads"] = front_engine
            r["cpu"]["ms_per_request"]["front"] -= 16.5 - front_engine
    for r in [*steps, *turns, results["runs"][0]]:
        if r.get("placement", "runner process") == "runner process":  # engine_bench's runner: 15 ms
            r["cpu"]["threads_ms_per_request"]["runner"]["engine and other threads"] = runner_engine
            r["cpu"]["ms_per_request"]["runner"] += runner_engine - 15.0
    results["placement"] = [x for pair in zip(steps, turns, strict=True) for x in pair]
    return results


def test_every_engine_target_is_judged_on_the_placement_and_scheduling_that_served_most_named_first() -> None:
    results = scheduled(engine_bench(95.0))
    assert [s["config"] for s in served_splits(results)] == ["runner process, turns"] + [
        f"{where}, {mode}"
        for _ in (1, 2)
        for where in ("runner process", "front worker")
        for mode in ("shared", "turns")
    ]  # the bench's own run is labelled with the scheduling it recorded
    engine = row(results, "Engine beyond in-process")
    assert engine.name == "Engine beyond in-process, best backend (`onnx-int8`), 10 clients"
    assert (engine.goal, engine.verdict) == ("<= 1 ms per request, zero errors", "met")
    # in its runner 16.5 of 15 ms in process (1.5 beyond); in the front, shared 16.5, turns 15.4 (0.4)
    assert engine.figure.startswith(
        "best: front worker, turns (median of 2 runs): 0.4 ms; runner process, turns "
        "(median of 2 runs): 1.5 ms; runner process, shared (median of 2 runs): 1.5 ms"
    )
    ceiling = row(results, "Served / ceiling without HTTP")  # front, turns: 98 and 99 → 98 = 96%
    assert ceiling.figure.startswith("best: front worker, turns (median of 2 runs): 98.0 req/s = 96% of 102.6;")
    beyond = row(results, "Server CPU beyond").figure  # the front's 2.1 ms less the engine's 1.1 saved by turns
    assert beyond.startswith(
        "best: front worker, turns (median of 2 runs): 1 ms; runner process, turns (median of 2 runs): 4.1 ms"
    )
    engine = row(scheduled(engine_bench(95.0), front_engine=16.2), "Engine beyond in-process")
    assert engine.verdict == "NOT met" and engine.figure.startswith("best: front worker, turns (median of 2 runs): 1.2")
    results = scheduled(engine_bench(95.0))
    for r in results["placement"]:
        r["failures"] = 1
    assert row(results, "Engine beyond in-process").verdict == "NOT met"  # zero errors, as every engine target
    results = scheduled(engine_bench(95.0))  # judged on the configuration that served most, not on a row's own best
    for r in results["placement"]:
        if (r["placement"], r["scheduling"]) == ("front worker", "turns"):
            r["req_per_s"] = 10.0  # the lowest engine figure, served least: a row may not pick it for itself
    engine = row(results, "Engine beyond in-process")
    assert engine.figure.startswith("best: ") and not engine.figure.startswith("best: front worker, turns")
    assert "front worker, turns (median of 2 runs): 0.4 ms" in engine.figure
    assert engine.verdict == "NOT met"  # met on front worker, turns alone (0.4 ms), which served least
    names = ("Engine beyond", "Server CPU beyond", "Served / ceiling without", "Served / ceiling on")
    tops = {row(results, name).figure.split(" (")[0] for name in names}
    assert len(tops) == 1  # one configuration for every row
    results = engine_bench(95.0)
    for r in [*results["placement"], results["runs"][0]]:
        del r["cpu"]["threads_ms_per_request"]  # no threads told apart: no engine figure at all
    engine = row(results, "Engine beyond in-process")
    assert engine.verdict == "not measured" and "runner process (median of 2 runs): not measured" in engine.figure


def test_the_served_table_names_each_runs_decode_pool_and_its_scheduling_only_where_recorded() -> None:
    text = "\n".join(_served_section(engine_bench(95.0) | {"decode_threads": 0}, "docs/bench"))
    assert "| decode threads |" in text and "| one per core |" in text and "scheduling" not in text
    text = "\n".join(_served_section(scheduled(engine_bench(95.0)), "docs/bench"))  # an earlier version's run
    assert "| scheduling (decode threads) |" in text and "| turns (one per core) |" in text


def test_served_on_the_servers_cores_leaves_out_the_load_generators_share() -> None:
    """2 cores, the load generator busy 0.3 of them while the requests ran: the server had 1.7, so its ceiling
    is 102.6 × 1.7 / 2 = 87.2 req/s."""
    results = engine_bench(80.0, front_rps=84.0)
    for r in [*results["placement"], results["runs"][0]]:
        r["cpu"]["cores_busy"]["load_generator"] = 0.3
    every, mine = row(results, "Served / ceiling without HTTP"), row(results, "Served / ceiling on the server's")
    assert every.verdict == "NOT met" and "84.0 req/s = 82% of 102.6" in every.figure  # all cores: < 85%
    assert mine.name == "Served / ceiling on the server's cores, best backend (`onnx-int8`), 10 clients"
    assert (mine.goal, mine.verdict) == (">= 90%, zero errors", "met")
    # the front's 84 of 87.2 = 96%; the runner's 78 = 89.4%, far enough from 90% for a whole percent
    assert mine.figure == ("best: front worker (median of 2 runs): 84.0 req/s = 96% of 87.2 (1.7 cores); runner "
                           "process (median of 2 runs): 78.0 req/s = 89% of 87.2 (1.7 cores)")  # fmt: skip
    results["placement"] = [r for r in results["placement"] if r["placement"] == "runner process"]
    assert row(results, "Served / ceiling on the server's").verdict == "NOT met"  # the runner's 78 of 87.2 alone
    for r in results["placement"]:
        r["cpu"]["cores_busy"]["load_generator"] = 0.45  # 1.55 cores: 79.5 req/s, the runner's 78 within
    assert row(results, "Served / ceiling on the server's").verdict == "met"
    for r in results["placement"]:
        r["cpu"]["cores_busy"]["load_generator"] = 2.0  # all the cores: the server had none, no ceiling to judge by
    assert row(results, "Served / ceiling on the server's").verdict == "not measured"
    for r in [*results["placement"], results["runs"][0]]:
        del r["cpu"]["cores_busy"]  # a results.json from before the load generator's cores were read
    mine = row(results, "Served / ceiling on the server's")
    assert mine.verdict == "not measured" and mine.figure == "runner process (median of 2 runs): not measured"
    assert "| — | — |" in "\n".join(_served_section(results, "docs/bench"))


def test_the_single_client_target_names_each_configuration_and_the_main_runs_scheduling() -> None:
    results = bench([run("inference", "onnx-int8", 10, 50.0)], [{"backend": "onnx-int8", "median_ms": 25.5}])
    results |= {"scheduling": "turns", "decode_threads": 0}
    results["placement"] = [
        {"placement": "front worker", "scheduling": mode, "round": 1, "backend": "onnx-int8", "users": 10,
         "sequential": {"median_ms": ms}} for mode, ms in (("shared", 26.0), ("turns", 25.0))
    ]  # fmt: skip
    target = row(results, "Single-client p50")
    assert target.verdict == "met" and target.figure.startswith(
        "best: front worker, turns: 25 ms = 1.14× (one run); runner process, turns: 25.5 ms = 1.16× (sequential step); "
        "front worker, shared: 26 ms = 1.18× (one run)"
    )


def test_a_run_whose_reading_missed_a_server_process_carries_no_engine_verdict() -> None:
    results = engine_bench(95.0)
    for r in [*results["placement"], results["runs"][0]]:
        r["cpu"]["missed_processes"] = 1
    ceiling, beyond = targets_of(results)
    assert ceiling.verdict == beyond.verdict == "not judged"
    assert "not judged: the CPU reading missed 1 server process(es)" in ceiling.figure


def test_a_share_is_never_rounded_up_to_the_target() -> None:
    assert _share(0.895) == "89.5%" and _share(0.905) == "90.5%" and _share(0.88) == "88%"
    assert _share(0.8549) == "85.5%" and _share(0.84) == "84%"  # near either goal (85% on all cores, 90%)
    ceiling, _ = targets_of(engine_bench(80.0, front_rps=87.17))  # 87.17 / (2000 / 19.5) = 0.84991
    assert ceiling.verdict == "NOT met" and "87.17 req/s = 84.9% of 102.6" in ceiling.figure
    ceiling, _ = targets_of(engine_bench(80.0, front_rps=87.19))  # 0.85010
    assert ceiling.verdict == "met" and "87.19 req/s = 85.0% of 102.6" in ceiling.figure
    ceiling, _ = targets_of(engine_bench(92.0, front_rps=91.9))  # 89.6%; far from the target: whole percents
    assert "91.9 req/s = 89.6% of 102.6" in ceiling.figure and "90.0 req/s = 88% of 102.6" in ceiling.figure


def test_decode_target_compares_the_pool_with_pillow_alone_in_the_same_run() -> None:
    results = bench([])
    results["profile"]["stages"] = [*STAGES, stage("decode", prof.POOL_PILLOW, 6.0)]
    target = row(results, "Decode + preprocess")  # (3 + 1) / (6 + 1) = 57%
    assert (target.figure, target.goal, target.verdict) == ("4.00 vs 7.00 CPU ms per photo = 57%", "<= 60%", "met")
    results["profile"]["stages"][-1] = stage("decode", prof.POOL_PILLOW, 5.0)
    assert row(results, "Decode + preprocess").verdict == "NOT met"


def test_the_default_backend_target_is_its_10_user_throughput_over_onnx_in_the_same_run() -> None:
    results = bench([run("inference", "onnx", 10, 10.0), run("inference", "openvino-int8", 10, 31.0),
                     run("inference", "openvino-int8", 1, 99.0)])  # fmt: skip
    results["default"] = {"backend": "openvino-int8", "requested": "auto", "source": "rule", "why": "x86"}
    target = row(results, "Default backend")
    assert target.figure == "`openvino-int8` (FASTINFER_DEFAULT_BACKEND=auto, rule: x86): 31.0 vs 10.0 req/s = 3.10×"
    assert target.verdict == "met" and target.machine == f"{CPU}, 2 cores"
    results["runs"][1]["req_per_s"] = 29.0
    assert row(results, "Default backend").verdict == "NOT met"
    del results["default"]  # a run that did not learn the server's default claims nothing
    assert not [t for t in targets(results) if t.name.startswith("Default")]


def test_openvino_targets_are_ratios_of_one_run_with_the_bf16_verdict() -> None:
    fidelity = [
        {"backend": "openvino", "precision": "bf16", "gate": "bf16", "gate_passed": True, "top1_agreement": 1.0,
         "top5_overlap": 0.99, "max_abs_error": 0.39},
    ]  # fmt: skip
    rps = {"onnx-int8": 40.0, "openvino-int8": 56.0, "onnx": 20.0, "openvino": 30.0}
    results = bench([run("inference", b, 10, r) for b, r in rps.items()])
    results["profile"]["fidelity"] = fidelity
    int8, bf16 = speed_up_targets(results, "here")
    assert (int8.name, int8.verdict) == ("`openvino-int8` vs `onnx-int8`, 10 clients", "met")
    assert int8.goal == ">= 1.3×, zero errors"
    assert int8.figure.startswith("1.40× (56.0 vs 40.0 req/s, 0 errors)")
    assert bf16.verdict == "NOT met" and "1.50× (30.0 vs 20.0 req/s" in bf16.figure
    assert "ran at bf16, BF16 gates passed (top-1 100.0%, top-5 99.0%)" in bf16.figure
    failing = bench([run("inference", "onnx-int8", 10, 40.0), run("inference", "openvino-int8", 10, 60.0, failures=2)])
    (int8,) = speed_up_targets(failing, "here")
    assert int8.verdict == "NOT met" and "2 errors" in int8.figure


def test_served_section_lists_every_backend_and_the_placement_runs() -> None:
    results = engine_bench(93.0)
    assert [(s["placement"], s["run_round"]) for s in served_splits(results)] == [
        ("runner process", 0),
        ("runner process", 1),
        ("front worker", 1),
        ("runner process", 2),
        ("front worker", 2),
    ]
    text = "\n".join(_served_section(results, "docs/bench"))
    assert "## Served vs the engine's ceiling" in text and "docs/benchmarks.md#the-ceiling-without-http" in text
    # the ceiling on the server's cores: 2 cores less the load generator's 0.2 → 102.6 × 1.8 / 2 = 92.3 req/s
    main = (
        "| `onnx-int8` | runner process | — | 10 | 93.0 | 102.6 (4 + 15 ms at b8) | **91%** | 92.3 (1.8) | **101%** |"
    )
    assert main + " 22.1 | **2.6** |" in text
    assert "| `onnx-int8` | front worker (placement step, round 1) | — | 10 | 96.0 |" in text


def test_http_section_shows_the_split_and_the_noise() -> None:
    runs = [run("inference", "onnx-int8", 10, 58.0, cpu=cpu(12.0, 19.0, client=3.25))]
    text = "\n".join(_http_section(bench(runs, http={"onnx-int8": 11.5}), "docs/bench"))
    assert "## The HTTP path, measured" in text
    # backend, users, front, runner, in-process front stages, inference (batch), overheads, HTTP, batch, client
    assert "| `onnx-int8` | 10 | 12.0 | 19.0 | 4.5 | 15.0 (b8) | 7.5 | 4.0 | **11.5** | — | 3.25 |" in text
    assert "Other work shared these cores" not in text and "missed a server process" not in text
    runs[0]["cpu"]["cores_busy"] |= {"rest_of_machine": 0.6, "steal": 0.0}
    runs[0]["cpu"]["missed_processes"] = 2
    text = "\n".join(_http_section(bench(runs, http={"onnx-int8": 11.5}), "docs/bench"))
    assert "during some runs: inference `onnx-int8` 10 users: 0.6 cores busy elsewhere, steal 0." in text
    assert "missed a server process: inference `onnx-int8` 10 users: 2 process(es)." in text


def test_batch_section_tabulates_images_per_second_beside_single_requests_of_the_same_run() -> None:
    single = run("inference", "openvino-int8", 10, 50.0, cpu=cpu(12.0, 20.0, client=3.0))
    batch = run("batch", "openvino-int8", 10, 8.0, images_per_request=8, images_per_s=64.0,
                cpu=cpu(80.0, 140.0, client=4.0))  # fmt: skip
    text = "\n".join(_batch_section(bench([single, batch]) | {"batch": {"backend": "openvino-int8"}}, "docs/bench"))
    assert "| batches of 8 | `openvino-int8` | 10 | 64.0 | 0 of 1000 | 10.0 | 17.5 | 0.5 |" in text
    assert "| one per request | `openvino-int8` | 10 | 50.0 | 0 of 1000 | 12.0 | 20.0 | 3.0 |" in text
    results = bench([]) | {"batch": {"skipped": "no inference run to pick a backend from"}}
    assert "Not measured in this run: no inference run to pick a backend from." in _batch_section(results, "")
    gone = run("batch", "onnx", 10, 0.0, images_per_request=8, images_per_s=0.0, failures=1000)
    gone["failure_example"] = "POST batch onnx: HTTP 404"  # a server without the route
    text = "\n".join(_batch_section(bench([single, gone]) | {"batch": {"backend": "onnx"}}, ""))
    assert "| batches of 8 | `onnx` | 10 | 0.0 | 1000 of 1000 (first: POST batch onnx: HTTP 404) | — | — | — |" in text


def test_the_first_table_is_the_rows_of_results_json(tmp_path, monkeypatch) -> None:
    """BENCHMARKS.md opens with the targets table and one plot; the table is results.json's rows, rendered."""
    runs = [
        run("inference", "onnx-int8", 10, 58.0, cpu=cpu(12.0, 19.0)),
        run("repeat", "onnx-int8", 10, 260.0, cpu=cpu(5.5, 0.0), cache_hit_share=1.0, cache_mode="redis"),
        run("bare", "onnx-int8", 10, 200.0, cpu=cpu(3.5, 0.0)),
    ]
    seq = [{"backend": "onnx-int8", "median_ms": 25.0, "p95_ms": 30.0,
            "stages_p50_ms": {"decode": 4.0, "preprocess": 1.0, "inference": 16.0}}]  # fmt: skip
    results = bench(runs, seq, http={"onnx-int8": 11.5}) | {"batch": {"skipped": "no endpoint"}}
    md, plots = tmp_path / "BENCHMARKS.md", tmp_path / "plots"
    write_markdown(results, md, tmp_path, plots)
    text, saved = md.read_text(), json.loads((plots / "results.json").read_text())
    first = next(block for block in text.split("\n\n") if block.startswith("|"))
    assert first == render_targets(saved["targets"]) and text.index(first) < text.index("](plots/")
    cells = [line.split(" | ") for line in first.split("\n")[2:]]
    assert [(c[0].lstrip("| "), c[3].strip("*")) for c in cells] == [
        (t["name"], t["verdict"]) for t in saved["targets"]
    ]
    assert {t["verdict"] for t in saved["targets"]} == {"met", "NOT met", "not measured"}  # no engine threads read
    assert [t["name"] for t in saved["targets"]][:3] == ["Cache-hit path vs a bare BentoML API",
                                                          "Cache-hit path, absolute", "Single-client p50, best "
                                                          "backend (`onnx-int8`)"]  # fmt: skip
    for heading in ("## Targets", "## The HTTP path, measured", "## Batch API", "## Where the time goes"):
        assert heading in text
    # the pool's ceiling, then each size class alone (small: 50 + 50 + 0.5 + 11.5 + 15 = 127 ms → 15.7 req/s)
    assert "| onnx-int8 | 8 | 31.0 | 64.5 | inference (48%) | 11.5 (measured) | 15.7 | 8.8 |" in text
    assert "| `onnx-int8` | 31.2 | 41.7 | ORT default CPU EP on a Xeon with AMX ~26 |" in text  # 1000 / 16 / 2
    assert "| onnx-int8 | 25.0 | 30.0 | — | 1.14× | 5.0 | 16.0 |" in text  # 25 ms ÷ 22 ms in process
    row_ = "| inference | onnx-int8 | 10 | 58.0 | 40.0 | 60.0 | 80.0 | 0 (0.0%) | 0% (bypassed) | 90% | 12, 19, 2 |"
    assert row_ in text
    # --report-only renders the same from the results.json beside the plots
    from load_tests.__main__ import main

    for name, value in (("BENTOML_HOME", str(tmp_path)), ("FASTINFER_TUNED", "off")):
        monkeypatch.setenv(name, value)  # what main sets, undone after the test
    again = tmp_path / "again.md"
    assert main(["--report-only", "--out", str(tmp_path / "x"), "--markdown", str(again), "--plots", str(plots)]) == 0
    assert again.read_text().replace("(plots/", "(") == text.replace("(plots/", "(")


def test_the_committed_report_opens_with_the_rows_its_results_json_judges() -> None:
    """BENCHMARKS.md's first table is docs/bench/results.json's rows, and those rows are what the data says."""
    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "docs" / "bench" / "results.json").read_text())
    first = next(block for block in (root / "BENCHMARKS.md").read_text().split("\n\n") if block.startswith("|"))
    assert first == render_targets(saved["targets"])
    assert [asdict(t) for t in targets(saved)] == saved["targets"]


def test_results_rebuilt_from_tables_draw_no_plot_and_keep_the_runs_own(tmp_path) -> None:
    """A results.json rebuilt from printed tables (``rebuilt`` lists its estimates) renders the report, but its
    estimates never draw a plot: in a fresh folder the report links none, and the run's own stay."""
    plots, md = tmp_path / "plots", tmp_path / "B.md"
    results = bench([run("inference", "onnx-int8", 10, 58.0)]) | {"rebuilt": ["req/s x 20 s"]}
    write_markdown(results, md, tmp_path, plots)
    assert "](plots/" not in md.read_text() and not list(plots.glob("*.png"))
    for name in ("throughput.png", "latency.png"):
        (plots / name).write_bytes(b"the run's own")
    write_markdown(results, md, tmp_path, plots)
    assert {p.name: p.read_bytes() for p in plots.glob("*.png")} == dict.fromkeys(
        ("throughput.png", "latency.png"), b"the run's own"
    )
    assert "](plots/throughput.png)" in md.read_text()
    write_markdown(results | {"rebuilt": []}, md, tmp_path, plots)  # a run's own results: drawn again
    assert (plots / "throughput.png").read_bytes() != b"the run's own"


def test_a_table_cell_stays_in_its_cell() -> None:
    """An error message in a cell (a failed trial's locust stderr) neither ends the row nor splits the cell."""
    from fastinfer.measure.plots import table

    assert table(["a", "b"], [["x|y", "one\ntwo"]]).splitlines()[2] == "| x\\|y | one two |"
