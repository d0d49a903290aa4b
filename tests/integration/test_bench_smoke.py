"""A tiny smoke of the benchmark harness and the profiler: they run and produce parseable results
with the expected fields, the server's CPU split per request (the HTTP path's cost, measured) and the
bare BentoML baseline among them. No speed assertions (speed lives in BENCHMARKS.md, not in tests)."""

from __future__ import annotations

import json
import subprocess
import sys

from fastinfer import cli
from load_tests.service import ROOT


def test_load_test_harness_smoke(server, tmp_path) -> None:
    out, md, plots = tmp_path / "bench", tmp_path / "BENCHMARKS.md", tmp_path / "plots"
    # --server-pid: the fixture's `bentoml serve`, its processes' CPU accounted; --profile-repeats 1: the in-process
    # stages the measured split is computed against, quickly; --duration 1: each of the four locust runs (inference,
    # cache hits, batch, bare) has requests to count and CPU to split, which is all that is asserted of them
    cmd = [sys.executable, "-m", "load_tests", "--url", server.url, "--server-pid", str(server.process.pid)]
    cmd += ["--backends", "onnx-int8", "--users", "2", "--duration", "1", "--sequential", "3", "--profile-repeats", "1",
            "--no-fidelity", "--out", str(out), "--markdown", str(md), "--plots", str(plots)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    inference = [r for r in results["runs"] if r["scenario"] == "inference"]
    assert len(inference) == 1 and inference[0]["backend"] == "onnx-int8" and inference[0]["users"] == 2
    assert {"requests", "failures", "req_per_s", "p50_ms", "p95_ms", "p99_ms"} <= inference[0].keys()
    assert inference[0]["requests"] > 0 and inference[0]["failures"] == 0
    repeat = next(r for r in results["runs"] if r["scenario"] == "repeat")
    assert repeat["cache_hit_share"] > 0.9  # the repeat scenario really measures hits
    (seq,) = results["sequential"]
    assert seq["median_ms"] > 0 and {"decode", "inference"} <= seq["stages_p50_ms"].keys()
    # The server's CPU per request, by process role, around every run.
    split = inference[0]["cpu"]
    assert split["runner"] == "runner-onnx-int8"
    assert split["ms_per_request"]["front"] > 0 and split["ms_per_request"]["runner"] > 0
    assert split["ms_per_request"]["load_generator"] > 0
    assert repeat["cpu"]["ms_per_request"]["front"] > 0  # the cache-hit path: the whole HTTP path of the front
    # The HTTP cost, measured: the split less the in-process stages, and the ceilings recomputed with it.
    (http,) = results["http_cost"]
    assert http["backend"] == "onnx-int8" and http["users"] == 2 and http["batch"] in (1, 8)
    assert abs(http["front_overhead_ms"] - (http["front_cpu_ms"] - http["front_stages_ms"])) < 0.02
    assert http["http_ms"] >= 0
    ceilings = [c for c in results["profile"]["ceilings"] if c["backend"] == "onnx-int8"]
    assert ceilings and all(c["http_source"] == "measured" and c["http_ms"] == http["http_ms"] for c in ceilings)
    assert {c["size_class"] for c in results["profile"]["ceilings_by_size"]} == {"small", "medium", "phone"}
    # The bare BentoML baseline, same body, its front's CPU accounted too.
    bare = next(r for r in results["runs"] if r["scenario"] == "bare")
    assert bare["requests"] > 0 and bare["failures"] == 0 and bare["cpu"]["ms_per_request"]["front"] > 0
    # The batch step ran on the only backend, its failures (if any) recorded by locust.
    assert results["batch"] == {"backend": "onnx-int8", "users": 2}
    assert any(r["scenario"] == "batch" for r in results["runs"])
    text = md.read_text()
    assert "# FastInfer benchmarks" in text and "## Targets" in text and "Cache-hit path" in text
    assert "## The HTTP path, measured" in text and "| `onnx-int8` | 2 |" in text
    assert "a bare BentoML API" in text and "## Batch API" in text
    assert (plots / "throughput.png").stat().st_size > 1000 and (plots / "stages.png").exists()
    assert "[bench" in done.stderr  # progress was shown


def test_profile_smoke(built_models, tmp_path, capsys, monkeypatch) -> None:
    out, plot = tmp_path / "profile.json", tmp_path / "profile.png"
    # The backends asserted on, two runtimes: the profile loads and measures every backend switched on, and
    # measuring the other three proves nothing more of it.
    monkeypatch.setenv("FASTINFER_BACKENDS", "pytorch,onnx,onnx-int8")
    assert cli.main(["profile", "--batches", "1", "--repeats", "1", "--json", str(out), "--plot", str(plot)]) == 0
    result = json.loads(out.read_text())
    stages = {s["stage"] for s in result["stages"]}
    assert {"decode", "preprocess", "postprocess", "inference"} <= stages
    assert {s["detail"] for s in result["stages"] if s["stage"] == "decode"} >= {"small", "medium", "phone"}
    ceilings = {c["backend"]: c for c in result["ceilings"]}
    assert ceilings.keys() == {"pytorch", "onnx", "onnx-int8"}
    for c in ceilings.values():
        assert c["req_per_s"] > 0 and c["binding_stage"] in c["shares"]
        assert abs(sum(c["shares"].values()) - 1) < 0.01
    assert plot.stat().st_size > 1000
    assert "ceiling req/s" in capsys.readouterr().out
