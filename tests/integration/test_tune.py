"""`fastinfer tune` for real: real `bentoml serve`s over the test store, locust and the benchmark pool,
within a small budget; what it writes is what a fresh server then serves with; an interrupted tune stops
its servers and leaves the previous tuned file as it was. No speed assertions: which configuration
wins on a shared 2-core VM is the report's business, not a test's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from fastinfer.catalog import choice
from fastinfer.catalog.backends import BACKENDS, SPECS, unavailable_reason
from fastinfer.common import hardware
from fastinfer.measure import photos
from tests.servers import NO_CACHE, serve, service_pids


def as_in_a_terminal() -> None:
    """Ctrl-C as a terminal's foreground job gets it: a suite started in the background (``make test &``,
    nohup) hands every child SIGINT ignored, and the interrupt would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it ended (or is a zombie not yet reaped) between listing and reading
        return []


def tune_env(tuned: Path) -> dict[str, str]:
    # Its own tuned file: the test servers started over the same store must never read it.
    return {**os.environ, "FASTINFER_TUNED": str(tuned)}


def test_tune_serves_for_real_and_the_next_server_serves_what_it_chose(built_models, tmp_path) -> None:
    tuned = tmp_path / "tuned" / "tuned.json"
    tuned_backends = "onnx-int8"  # one backend: choosing among several is tests/unit/test_tune_search.py's
    # ~20 s here: each server serves one runner (FASTINFER_BACKENDS), so trials start in seconds. The budget affords
    # the backend stage alone (one server, one run), however fast the machine: none of the later stages is asserted.
    argv = ["--backends", tuned_backends, "--budget", "20", "--seconds", "1", "--clients", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "fastinfer.cli", "tune", *argv],
        cwd=tmp_path,  # from anywhere: it finds the store through BENTOML_HOME, like every command
        env=tune_env(tuned),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[tune " in done.stderr and "█" in done.stderr  # progress all along
    data = json.loads(tuned.read_text())
    chosen = data["settings"]["FASTINFER_DEFAULT_BACKEND"]
    assert chosen == "onnx-int8" and data["chosen"]["requests"] > 0 and data["decisions"]
    report = (tuned.parent / "report.md").read_text()
    assert "★" in report and "| backend |" in report and (tuned.parent / "tuned.png").stat().st_size > 10_000
    result = json.loads((tuned.parent / "report.json").read_text())
    assert set(result["in_process"]) == {"onnx-int8"}  # measured in process, then served
    served = {t["config"]["backend"] for t in result["trials"] if t["stage"] == "backend" and not t["error"]}
    assert served == {"onnx-int8"} and not result["dropped"]

    # Without the test limits (base={}): the settings are the tuned file's, on the test store (BENTOML_HOME);
    # it serves the backend tuned (FASTINFER_BACKENDS is no tuned setting: the environment's).
    env = {"FASTINFER_TUNED": str(tuned), "FASTINFER_BACKENDS": tuned_backends}
    with serve(tmp_path, env, base={}) as server:
        info = httpx.get(f"{server.url}/backends", timeout=30).json()
        assert info["tuned"]["status"] == "in force", info["tuned"]
        assert info["default"] == chosen and info["default_choice"]["source"] == "tuned"
        for name in data["settings"]:
            assert info["configuration"][name]["source"] == "tuned", name
        photo = photos.photo_jpeg("astronaut.png")
        answer = httpx.post(f"{server.url}/classify", files={"image": ("p.jpg", photo, "image/jpeg")},
                            headers=NO_CACHE, timeout=60)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["backend"] == chosen  # no backend named: the tuned one


# Backends no rule names (fastinfer/catalog/choice.py): served beside this machine's choice, the server passes it over.
NEVER_BY_RULE = ("onnx-int8-dynamic", "pytorch")


def test_a_server_without_settings_serves_this_machines_choice(built_models, tmp_path, monkeypatch) -> None:
    """FASTINFER_DEFAULT_BACKEND unset (auto) and no tuned file: the rule's (or a bench's) choice, used. The choice
    among every backend this machine runs is made here, in process, as `fastinfer` commands make it; the server
    serves it and a backend no rule names (no runner process for the others: a start in seconds), and must choose
    it, as its own recommendation, over the other."""
    monkeypatch.setenv("FASTINFER_TUNED", "off")  # FASTINFER_DEFAULT_BACKEND and FASTINFER_BACKENDS: unset here
    expected = choice.default_choice(kept=False)
    assert expected.requested == "auto" and expected.source in ("rule", "measured"), expected
    # The recommendation among every backend (what /backends of a server of them all says): the default equals it.
    hw = hardware.probe()
    runnable = [name for name in BACKENDS if unavailable_reason(name) is None]
    assert choice.recommend(hw, runnable, *choice.measurements(hw))["backend"] == expected.backend, expected
    # Measured best, or first by rule: a backend measured no faster, and named by no rule, cannot beat it.
    other = next(name for name in NEVER_BY_RULE if name != expected.backend)
    env = {"FASTINFER_TUNED": "off", "FASTINFER_DEFAULT_BACKEND": ""}
    env["FASTINFER_BACKENDS"] = f"{expected.backend},{other}"
    with serve(tmp_path, env, base={}) as server:
        info = httpx.get(f"{server.url}/backends", timeout=30).json()
        chosen = info["default_choice"]
        assert chosen["requested"] == "auto" and chosen["source"] == expected.source and chosen["why"]
        assert info["default"] == chosen["backend"] == info["recommended"]["backend"] == expected.backend
        shown = info["configuration"]["FASTINFER_DEFAULT_BACKEND"]
        assert shown == {"value": chosen["backend"], "source": chosen["source"]}
        photo = photos.photo_jpeg("chelsea.png")
        answer = httpx.post(f"{server.url}/classify", files={"image": ("p.jpg", photo, "image/jpeg")},
                            headers=NO_CACHE, timeout=60)  # fmt: skip
        assert answer.status_code == 200 and answer.json()["backend"] == chosen["backend"]
        assert f"default backend: `{chosen['backend']}` (FASTINFER_DEFAULT_BACKEND=auto" in server.log.read_text()
        # Untuned, with one front worker, the default backend's engine runs in it, where it serves most.
        runner = SPECS[chosen["backend"]].runner_name
        assert info["configuration"]["FASTINFER_IN_FRONT"] == {"value": runner, "source": "default"}
        (row,) = [b for b in info["backends"] if b["name"] == chosen["backend"]]
        assert row["runs_on"]["placement"] == "front worker", row
        assert not service_pids(server, f"runner-{runner}")  # no process started for it


def test_an_interrupted_tune_stops_every_server_and_keeps_the_previous_file(built_models, tmp_path) -> None:
    tuned = tmp_path / "tuned" / "tuned.json"
    tuned.parent.mkdir()
    tuned.write_text('{"previous": true}')
    argv = ["--backends", "onnx-int8", "--budget", "300", "--seconds", "20"]
    tune = subprocess.Popen(
        # Through `fastinfer tune`, which becomes the tuner: the signal reaches the process that owns the servers.
        [sys.executable, "-m", "fastinfer.cli", "tune", *argv],
        env=tune_env(tuned),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_in_a_terminal,
    )
    try:
        servers: list[psutil.Process] = []
        deadline = time.monotonic() + 240
        while not servers and time.monotonic() < deadline:  # wait for its `bentoml serve` to be under load
            time.sleep(0.2)
            children = psutil.Process(tune.pid).children(recursive=True)
            if any("locust" in " ".join(cmdline(c)) for c in children):
                servers = [c for c in children if "bentoml" in " ".join(cmdline(c)[:3]) and "serve" in cmdline(c)]
        assert servers, "the tune never got a server under load"
        server_tree = [p for s in servers for p in [s, *s.children(recursive=True)]]
        tune.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = tune.communicate(timeout=120)
    finally:
        if tune.poll() is None:
            tune.kill()
    assert tune.returncode == 130, err[-2000:]
    assert "interrupted; the previous tuned file is as it was" in err
    assert tuned.read_text() == '{"previous": true}'
    assert not [p.pid for p in server_tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
