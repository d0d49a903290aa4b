"""Turns under hostile use: failing engine calls and decodes, floods of decodes beside engine calls, failing
batches, and a lock folder that is gone."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastinfer.serving import turns
from fastinfer.serving.batching import MicroBatcher
from fastinfer.serving.cpu import CpuPool
from fastinfer.serving.turns import Turns


@pytest.fixture(autouse=True)
def lock_files(tmp_path: Path) -> None:
    """Made by the server's parent before its processes start (turns.new_server_dir)."""
    turns.make_lock_files(tmp_path)


def entered(enter) -> tuple[threading.Event, threading.Event]:
    inside, leave = threading.Event(), threading.Event()

    def run() -> None:
        with enter():
            inside.set()
            leave.wait(10)

    threading.Thread(target=run, daemon=True).start()
    return inside, leave


def test_an_engine_call_that_raises_releases_its_turn(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    with pytest.raises(RuntimeError, match="engine failed"), t.inferring():
        raise RuntimeError("engine failed")
    inside, leave = entered(Turns(True, tmp_path).decoding)  # another process's decode is not held back
    assert inside.wait(10)
    leave.set()
    with t.inferring():  # and the next engine call works
        pass
    assert t.overdue == 0 and t.active and not t._holding


def test_a_decode_that_raises_releases_its_turn_and_the_pool_goes_on(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(2, turns=t)

    def bad() -> None:
        raise ValueError("not an image")

    async def main() -> int:
        with pytest.raises(ValueError, match="not an image"):
            await pool.run(bad, decode=True)
        assert t._queued == 0
        with t.inferring():  # the failed decode let go of `work`: the engine call needs not wait for it
            pass
        return await pool.run(lambda: 7, decode=True)

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == 7
    finally:
        pool.close()
    assert t.overdue == 0 and t.active


def test_a_flood_of_decodes_beside_engine_calls_all_ends(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(2, turns=t)
    stop = threading.Event()
    calls = 0

    def engine() -> None:
        nonlocal calls
        while not stop.is_set():
            with t.inferring():
                time.sleep(0.002)
            calls += 1
            time.sleep(0.002)  # a gap between calls (a batcher forming its next batch)

    engine_thread = threading.Thread(target=engine, daemon=True)
    engine_thread.start()

    async def main() -> list[int]:
        def decode(i: int) -> int:
            time.sleep(0.001)
            return i

        return await asyncio.gather(*(pool.run(lambda i=i: decode(i), decode=True) for i in range(50)))

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == list(range(50))
    finally:
        stop.set()
        engine_thread.join(10)
        pool.close()
    assert not engine_thread.is_alive() and calls > 0 and t.overdue == 0 and t.active and t._queued == 0


def test_decodes_flooding_in_while_a_batcher_runs_back_to_back_all_end(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    pool = CpuPool(2, turns=t)

    def run(images: np.ndarray) -> np.ndarray:
        with t.inferring():
            time.sleep(0.002)
            return images + 1

    batcher = MicroBatcher(run, max_batch_size=4, max_latency_ms=0, before_batch=t.after_decodes)

    async def request(i: int) -> float:
        image = await pool.run(lambda: np.full((1, 1), float(i)), decode=True)
        return float((await batcher.submit(image))[0, 0])

    async def main() -> list[float]:
        return await asyncio.gather(*(request(i) for i in range(50)))

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == [i + 1.0 for i in range(50)]
    finally:
        pool.close()
    assert t.overdue == 0 and t.active and t._queued == 0


def test_a_failing_batch_fails_each_caller_and_the_next_batch_works(tmp_path: Path) -> None:
    t = Turns(True, tmp_path)
    fail = threading.Event()
    fail.set()

    def run(images: np.ndarray) -> np.ndarray:
        with t.inferring():
            if fail.is_set():
                raise RuntimeError("engine failed")
            return images * 2

    batcher = MicroBatcher(run, max_batch_size=8, max_latency_ms=20, before_batch=t.after_decodes)

    async def main() -> list[np.ndarray]:
        first = await asyncio.gather(*(batcher.submit(np.ones((1, 2))) for _ in range(4)), return_exceptions=True)
        assert len(first) == 4 and all(isinstance(r, RuntimeError) for r in first)
        fail.clear()
        return await asyncio.gather(*(batcher.submit(np.full((1, 2), i)) for i in range(4)))

    outputs = asyncio.run(asyncio.wait_for(main(), 10))
    assert [o.tolist() for o in outputs] == [[[2 * i, 2 * i]] for i in range(4)]
    assert t.overdue == 0 and t.active


def test_a_batcher_waits_for_nothing_on_a_folder_that_is_gone(tmp_path: Path) -> None:
    t = Turns(True, tmp_path / "gone")  # its files cannot be opened: turns suspended, and nobody waits

    async def main() -> float:
        t.decode_queued()
        started = time.monotonic()
        await t.after_decodes()
        t.decode_ended()
        return time.monotonic() - started

    assert asyncio.run(main()) < 1.0 and t.overdue == 1 and not t.active
