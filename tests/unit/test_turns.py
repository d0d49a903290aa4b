"""Turns (FASTINFER_SCHEDULING): decoding and engine calls exclude each other, across threads and processes,
and no wait is unbounded."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
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


@pytest.fixture(autouse=True)
def lock_files(tmp_path: Path) -> None:
    """Made by the server's parent before its processes start (turns.new_server_dir)."""
    turns.make_lock_files(tmp_path)


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


def gate_held_exclusively(directory: Path) -> bool:
    """Wait (5 s at most) until an engine call holds `gate`: a shared lock on it is then refused."""
    return gate_held_exclusively_within(directory, 5)


def gate_held_exclusively_within(directory: Path, seconds: float) -> bool:
    fd = os.open(directory / "gate", os.O_RDWR | os.O_CREAT)
    try:
        give_up = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                return True
            if time.monotonic() >= give_up:
                return False
            time.sleep(0.01)
    finally:
        os.close(fd)


def test_an_engine_call_waits_for_the_decodes_under_way_and_goes_before_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns, "MAX_DECODE_WAIT_S", 30.0)
    t = Turns(True, tmp_path)
    first = entered_in_thread(t.decoding)
    assert first.wait(5)
    engine = entered_in_thread(t.inferring)
    assert gate_held_exclusively(tmp_path)  # the engine call is waiting, ahead of new decodes
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
    give_up = time.monotonic() + 5
    while t.overdue == 0 and time.monotonic() < give_up:  # the watchdog lets its turn go
        time.sleep(0.05)
    assert t.overdue == 1 and not gate_held_exclusively_within(tmp_path, 0)
    decode = Turns(True, tmp_path)
    with decode.decoding():
        pass
    assert decode.overdue == 0  # got its turn: the stuck call no longer holds it
    engine.leave.set()


def test_a_slow_decode_holds_an_engine_call_back_only_so_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns, "MAX_DECODE_WAIT_S", 0.3)
    decode = entered_in_thread(Turns(True, tmp_path).decoding)  # a 50 MP image, decoding for a second
    assert decode.wait(5)
    t = Turns(True, tmp_path)
    started = time.monotonic()
    with t.inferring():  # runs beside it, and still no new decode starts
        waited = time.monotonic() - started
        later = entered_in_thread(Turns(True, tmp_path).decoding)
        assert not later.wait(SETTLE_S)
    assert waited > 0.25 and t.overdue == 0 and t.active
    assert later.wait(5)
    started = time.monotonic()
    with t.inferring():  # the same decode still under way: the next call looks once and runs beside it
        assert time.monotonic() - started < 0.25
    decode.leave.set()
    later.leave.set()


def test_a_turn_that_does_not_come_suspends_turns_in_that_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(turns, "MAX_HOLD_S", 0.3)
    stopped = os.open(tmp_path / "gate", os.O_RDWR | os.O_CREAT)  # a runner stopped mid-call (SIGSTOP)
    fcntl.flock(stopped, fcntl.LOCK_EX)
    try:
        t = Turns(True, tmp_path)
        started = time.monotonic()
        with t.decoding():
            first = time.monotonic() - started
        started = time.monotonic()
        with t.decoding(), t.inferring():  # suspended: neither waits
            second = time.monotonic() - started
    finally:
        os.close(stopped)
    assert first > 0.25 and second < 0.2 and t.overdue == 1 and not t.active
    assert "serves as FASTINFER_SCHEDULING=shared" in caplog.text


def test_lock_files_that_are_gone_suspend_turns_rather_than_fail(tmp_path: Path) -> None:
    t = Turns(True, tmp_path / "gone")  # e.g. a temp cleaner removed the server's folder
    with t.decoding(), t.inferring():
        pass
    assert t.overdue == 1 and not t.active


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


def test_the_decode_pool_takes_its_turn_and_hashing_never_waits(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(1, turns=t)  # one decode thread, taken by a decode waiting for its turn

    async def main() -> list[str]:
        order: list[str] = []
        with t.inferring():
            decodes = [asyncio.ensure_future(pool.run(lambda: order.append("decoded"), decode=True)) for _ in "ab"]
            await asyncio.sleep(SETTLE_S)
            await pool.run(lambda: order.append("hashed"))  # a cache lookup's hash does not wait behind them
            order.append("engine done")
        await asyncio.gather(*decodes)
        return order

    try:
        assert asyncio.run(main()) == ["hashed", "engine done", "decoded", "decoded"]
    finally:
        pool.close()


def test_a_decode_whose_caller_is_gone_does_nothing_when_its_turn_comes(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(1, turns=t)
    ran: list[str] = []

    async def main() -> None:
        with t.inferring():
            decode = asyncio.ensure_future(pool.run(lambda: ran.append("decoded"), decode=True))
            await asyncio.sleep(SETTLE_S)  # started: on the pool's thread, waiting for its turn
            decode.cancel()  # the request's deadline passed (504)
        await pool.run(lambda: None, decode=True)  # after it on the one decode thread

    try:
        asyncio.run(main())
    finally:
        pool.close()
    assert ran == []


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


def back_to_back_engine_calls(t: Turns, stop: threading.Event) -> threading.Thread:
    """Engine calls of 20 ms each with no pause between them (unbatched calls queued on a model thread)."""

    def calls() -> None:
        while not stop.is_set():
            with t.inferring():
                time.sleep(0.02)

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    return caller


def test_engine_calls_back_to_back_let_a_waiting_decode_in(tmp_path: Path) -> None:
    """A decode waiting at the gate gets a turn soon, not after MAX_HOLD_S with its process suspended to `shared`;
    through the engine's Turns or another one (its own open files: another process's view)."""
    engines, stop = Turns(True, tmp_path), threading.Event()
    caller = back_to_back_engine_calls(engines, stop)
    try:
        assert gate_held_exclusively(tmp_path)
        waits = []
        for decoder in (engines, Turns(True, tmp_path)):
            for _ in range(3):
                started = time.monotonic()
                with decoder.decoding():
                    waits.append(time.monotonic() - started)
    finally:
        stop.set()
        caller.join(5)
    assert max(waits) < 1.0 and engines.overdue == 0 and engines.active


def test_engine_calls_back_to_back_wait_for_nothing_when_no_decode_waits(tmp_path: Path) -> None:
    """The rows of one request, computed one call each, pay nothing for the decodes' turn when none waits."""
    t = Turns(True, tmp_path)
    with t.inferring():
        pass
    t.decode_queued()  # decodes queued elsewhere, but none waiting at the gate
    started = time.monotonic()
    for _ in range(40):
        with t.inferring():
            pass
    took = time.monotonic() - started
    t.decode_ended()
    assert took < 40 * turns.YIELD_S * 0.75


def test_two_engines_back_to_back_let_a_waiting_decode_in(tmp_path: Path) -> None:
    """Two runners (or backends) alternating: each lets go of the gate while decodes wait, not only its own
    thread's next call."""
    stop = threading.Event()
    callers = [back_to_back_engine_calls(Turns(True, tmp_path), stop) for _ in range(2)]
    decoder = Turns(True, tmp_path)
    try:
        assert gate_held_exclusively(tmp_path)
        waits = []
        for _ in range(5):
            started = time.monotonic()
            with decoder.decoding():
                waits.append(time.monotonic() - started)
    finally:
        stop.set()
        for caller in callers:
            caller.join(5)
    assert max(waits) < 1.0 and decoder.overdue == 0


def test_a_decode_whose_first_signal_a_probe_blocked_says_so_at_its_next_look(tmp_path: Path) -> None:
    engines, stop = Turns(True, tmp_path), threading.Event()
    probe = os.open(tmp_path / "waiting", os.O_RDWR)
    fcntl.flock(probe, fcntl.LOCK_EX)  # an engine's probe, preempted between its two system calls
    caller = back_to_back_engine_calls(engines, stop)
    try:
        assert gate_held_exclusively(tmp_path)
        decode = entered_in_thread(Turns(True, tmp_path).decoding)
        time.sleep(0.005)
        fcntl.flock(probe, fcntl.LOCK_UN)
        assert decode.wait(1.0)
        decode.leave.set()
    finally:
        stop.set()
        caller.join(5)
        os.close(probe)


def test_decodes_that_keep_waiting_hold_an_engine_call_back_only_so_long(tmp_path: Path) -> None:
    """A stream of decodes, each waiting at the gate in turn (or a stopped process holding `waiting`), delays an
    engine call by YIELD_S at most."""
    waiting = os.open(tmp_path / "waiting", os.O_RDWR)
    fcntl.flock(waiting, fcntl.LOCK_SH)
    t, took = Turns(True, tmp_path), []

    def engine_call() -> None:
        started = time.monotonic()
        with t.inferring():
            took.append(time.monotonic() - started)

    try:
        call = threading.Thread(target=engine_call, daemon=True)
        call.start()
        call.join(2)
    finally:
        os.close(waiting)
    assert took and took[0] < turns.YIELD_S + 0.1 and t.overdue == 0


def test_a_decode_dropped_before_a_thread_took_it_does_not_wait_for_a_turn(tmp_path: Path) -> None:
    from fastinfer.serving.cpu import _TurnJob

    t, ran = Turns(True, tmp_path), []
    engine = entered_in_thread(t.inferring)
    assert engine.wait(5)
    job = _TurnJob(t, lambda: ran.append(1))
    job.drop()  # its caller timed out (504) while the job sat in the pool's queue
    started = time.monotonic()
    assert job.run() is None
    assert time.monotonic() - started < SETTLE_S and ran == []
    engine.leave.set()


def test_a_busy_hold_missed_under_a_probe_is_taken_by_the_next_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turns, "MAX_DEFER_S", SETTLE_S)
    front, runner = Turns(True, tmp_path), Turns(True, tmp_path)

    async def batcher_waits() -> float:
        started = time.monotonic()
        await runner.after_decodes()
        return time.monotonic() - started

    probe = os.open(tmp_path / "busy", os.O_RDWR)
    fcntl.flock(probe, fcntl.LOCK_EX)  # a batcher's probe at the instant the first decode is queued
    front.decode_queued()
    fcntl.flock(probe, fcntl.LOCK_UN)
    os.close(probe)
    front.decode_queued()
    assert asyncio.run(batcher_waits()) >= SETTLE_S  # busy is held: the batcher waits for the decodes
    front.decode_ended()
    front.decode_ended()
    assert asyncio.run(batcher_waits()) < SETTLE_S


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="open files are counted in Linux's /proc")
def test_a_thread_that_ends_closes_its_lock_files(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)

    def one_decode() -> None:
        with t.decoding():
            pass

    before = open_fds()
    for _ in range(3):
        threads = [threading.Thread(target=one_decode) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5)
    assert open_fds() - before <= 1  # the watchdog's or the test's own, never 4 per thread


def test_lock_files_a_cleaner_removed_are_not_made_anew(tmp_path: Path) -> None:
    """A thread or process that opens them after a temp cleaner removed them serves as `shared` and says so:
    making new files would split the server in groups that exclude each other but not the rest."""
    early = Turns(True, tmp_path)
    engine = entered_in_thread(early.inferring)
    assert engine.wait(5)
    for name in turns.LOCK_FILES:
        (tmp_path / name).unlink()
    late = Turns(True, tmp_path)
    with late.decoding():
        pass
    decode = entered_in_thread(early.decoding)  # a new thread of a process that took turns before
    assert decode.wait(5)
    engine.leave.set()
    decode.leave.set()
    assert late.overdue == early.overdue == 1 and not late.active and not early.active
    assert list(tmp_path.iterdir()) == []


def test_a_new_server_folder_holds_its_lock_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(turns.DIR_ENV, "")  # unset, and set back after
    folder = turns.new_server_dir()
    try:
        assert os.environ[turns.DIR_ENV] == str(folder) and turns.shared_dir() == folder
        assert sorted(p.name for p in folder.iterdir()) == sorted(turns.LOCK_FILES)
    finally:
        shutil.rmtree(folder)


def test_a_failing_look_at_the_waiting_decodes_leaves_no_lock_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Turns(True, tmp_path)

    def fails(fd: int) -> bool:
        raise OSError(37, "No locks available")

    monkeypatch.setattr(Turns, "_held_elsewhere", staticmethod(fails))
    with t.inferring():
        pass
    assert t.overdue == 1 and not gate_held_exclusively_within(tmp_path, 0.1)
