"""Turns (FASTINFER_SCHEDULING): decoding and engine calls exclude each other, across threads and processes,
and no wait is unbounded."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fastinfer.catalog.config import Settings, get_settings
from fastinfer.serving import turns
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.turns import Turns

SETTLE_S = 0.2  # long enough for a thread that was not blocked to have entered


def entered_in_thread(enter) -> threading.Event:
    """Start a thread that runs ``enter`` (a context manager factory) and sets the event once inside."""
    inside = threading.Event()
    leave = threading.Event()

    def run() -> None:
        with enter():
            inside.set()
            leave.wait(5)

    threading.Thread(target=run, daemon=True).start()
    inside.leave = leave  # type: ignore[attr-defined]
    return inside


def test_a_decode_waits_while_an_engine_call_runs(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    with t.inferring():
        decode = entered_in_thread(t.decoding)
        assert not decode.wait(SETTLE_S)
    assert decode.wait(5)
    decode.leave.set()


def test_an_engine_call_waits_for_the_decodes_under_way_and_goes_before_new_ones(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    first = entered_in_thread(t.decoding)
    assert first.wait(5)
    engine = entered_in_thread(t.inferring)
    assert not engine.wait(SETTLE_S)  # the decode under way ends first
    later = entered_in_thread(t.decoding)
    assert not later.wait(SETTLE_S)  # a waiting engine call goes before a decode not yet started
    first.leave.set()
    assert engine.wait(5)
    assert not later.wait(SETTLE_S)
    engine.leave.set()
    assert later.wait(5)
    later.leave.set()


def test_decodes_run_together(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    a, b = entered_in_thread(t.decoding), entered_in_thread(t.decoding)
    assert a.wait(5) and b.wait(5)
    a.leave.set()
    b.leave.set()


HOLD = """
import sys, time
from pathlib import Path
from fastinfer.serving.turns import Turns
with Turns(True, Path(sys.argv[1])).inferring():
    print("holding", flush=True)
    time.sleep(60)
"""


def test_processes_take_turns_and_a_dead_one_lets_go(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        decode = entered_in_thread(Turns(True, tmp_path).decoding)
        assert not decode.wait(SETTLE_S)
        os.kill(child.pid, signal.SIGKILL)  # a crashed runner: its locks go with it
        assert decode.wait(5)
        decode.leave.set()
    finally:
        child.kill()
        child.wait()


def test_a_stuck_engine_call_loses_its_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns, "MAX_HOLD_S", 0.3)
    t = Turns(True, tmp_path)
    engine = entered_in_thread(t.inferring)  # an engine call that does not end
    assert engine.wait(5)
    started = time.monotonic()
    with Turns(True, tmp_path).decoding():
        waited = time.monotonic() - started
    assert 0.25 < waited < 3 and t.overdue == 1
    engine.leave.set()


def test_an_engine_call_waits_for_a_stopped_decode_only_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns, "MAX_HOLD_S", 0.3)
    decode = entered_in_thread(Turns(True, tmp_path).decoding)  # a front worker stopped mid-decode
    assert decode.wait(5)
    t = Turns(True, tmp_path)
    started = time.monotonic()
    with t.inferring():
        waited = time.monotonic() - started
    assert 0.25 < waited < 3 and t.overdue == 1
    decode.leave.set()


def test_off_takes_no_turn(tmp_path: Path) -> None:
    assert Turns(False).directory is None
    engine = entered_in_thread(Turns(True, tmp_path).inferring)
    assert engine.wait(5)
    decode = entered_in_thread(Turns(False, tmp_path).decoding)  # would wait while the engine call runs
    assert decode.wait(SETTLE_S)
    engine.leave.set()
    decode.leave.set()


@pytest.fixture
def fresh_settings(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FASTINFER_TUNED", "off")
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_the_setting(fresh_settings: pytest.MonkeyPatch) -> None:
    assert Settings.scheduling == "shared" and Settings.decode_threads == 0
    fresh_settings.setenv("FASTINFER_SCHEDULING", " Turns ")
    fresh_settings.setenv("FASTINFER_DECODE_THREADS", "1")
    settings = get_settings()
    assert settings.scheduling == "turns" and settings.decode_threads == 1
    get_settings.cache_clear()
    fresh_settings.setenv("FASTINFER_SCHEDULING", "sometimes")
    with pytest.raises(ValueError, match="FASTINFER_SCHEDULING must be one of shared, turns"):
        get_settings()


def test_the_decode_pool_takes_its_turn(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(2, turns=t)

    async def main() -> list[str]:
        order: list[str] = []
        with t.inferring():
            job = asyncio.ensure_future(pool.run(lambda: order.append("decoded"), decode=True))
            await pool.run(lambda: order.append("hashed"))  # no turn: a cache hit never waits for the engine
            await asyncio.sleep(SETTLE_S)
            order.append("engine done")
        await job
        return order

    try:
        assert asyncio.run(main()) == ["hashed", "engine done", "decoded"]
    finally:
        pool.close()


def test_a_batch_waits_for_the_decodes_queued_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns, "MAX_DEFER_S", 5.0)
    front, runner = Turns(True, tmp_path), Turns(True, tmp_path)  # two processes' views of one server

    async def main() -> tuple[float, float]:
        started = time.monotonic()
        await runner.after_decodes()  # nothing queued: at once
        idle = time.monotonic() - started
        front.decode_queued()
        front.decode_queued()
        asyncio.get_running_loop().call_later(SETTLE_S, front.decode_ended)
        asyncio.get_running_loop().call_later(2 * SETTLE_S, front.decode_ended)
        started = time.monotonic()
        await runner.after_decodes()
        return idle, time.monotonic() - started

    idle, waited = asyncio.run(main())
    assert idle < 0.05 and 2 * SETTLE_S <= waited < 2 * SETTLE_S + 0.5


def test_in_one_process_too_and_never_for_ever(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns, "MAX_DEFER_S", SETTLE_S)
    t = Turns(True, tmp_path)  # the engine in the front worker: one Turns decodes and batches

    async def main() -> float:
        t.decode_queued()  # never ends (a flood of decodes)
        started = time.monotonic()
        await t.after_decodes()
        return time.monotonic() - started

    assert SETTLE_S <= asyncio.run(main()) < SETTLE_S + 0.5
