"""A bounded pool for the front's CPU work (reading, hashing, decoding), one thread per core.

Not anyio's ``to_thread`` with a CapacityLimiter: a cancelled caller (a 504) releases its token while its decode
still runs, so timeouts piled up threads. Here a started job keeps its worker until it ends, one not started is
dropped, and there are never more threads than workers.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from fastinfer.serving.turns import Turns

T = TypeVar("T")


# OS names of the threads that decode and that call the model: the benchmark reads each one's CPU from /proc.
DECODE_THREAD = "fi-decode"
MODEL_THREAD = "fi-model"
_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (at most 15 bytes) in Linux's /proc, ps and top -H; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # no libc to ask (a static build): the name is only cosmetic
        return


class CpuPool:
    """``turns``: decodes wait for their turn with engine calls (fastinfer/serving/turns.py); other work (hashing
    for a cache lookup) then has a thread of its own, so that it never waits behind them."""

    def __init__(
        self, workers: int, name: str = "cpu", os_name: str = DECODE_THREAD, turns: Turns | None = None
    ) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self.turns = turns if turns is not None and turns.enabled else None
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=name, initializer=name_os_thread, initargs=(os_name,)
        )
        self._other = self._executor
        if self.turns is not None:
            self._other = ThreadPoolExecutor(1, f"{name}-other", initializer=name_os_thread, initargs=(os_name,))

    async def run(self, work: Callable[[], T], *, decode: bool = False) -> T:
        """``work()`` on a pool thread; cancelling the caller drops it if it has not started (nor got its turn)."""
        loop = asyncio.get_running_loop()
        if self.turns is None or not decode:
            return await loop.run_in_executor(self._other, work)
        job = _TurnJob(self.turns, work)
        self.turns.decode_queued()
        try:
            return await loop.run_in_executor(self._executor, job.run)
        except asyncio.CancelledError:
            job.drop()
            raise
        finally:
            self.turns.decode_ended()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._other.shutdown(wait=False, cancel_futures=True)


class _TurnJob(Generic[T]):
    """A decode that waits for its turn on a pool thread; its caller may give up meanwhile (a 504): then, once its
    turn comes, it does nothing."""

    def __init__(self, turns: Turns, work: Callable[[], T]) -> None:
        self.turns, self.work = turns, work
        self._lock = threading.Lock()
        self._state = "waiting"  # → running | dropped

    def run(self) -> T | None:
        if self._state == "dropped":  # its caller gave up before a pool thread took it: no turn to wait for
            return None
        with self.turns.decoding():
            with self._lock:
                if self._state == "dropped":
                    return None
                self._state = "running"
            return self.work()

    def drop(self) -> None:
        with self._lock:
            if self._state == "waiting":
                self._state = "dropped"
