"""A bounded pool for the front's CPU work (reading, hashing, decoding), one thread per core.

Why not ``anyio.to_thread.run_sync`` with a CapacityLimiter? When the awaiting request is
cancelled (a 504), anyio abandons the thread *and releases its token*, so the next request
starts another thread while the abandoned decode still runs: repeated timeouts piled up threads
beyond the core count. Here a started job keeps its worker until it ends (Pillow cannot be
interrupted), a job that has not started is dropped when its caller is cancelled, and there are
never more threads than workers — the work behind timed-out requests is bounded.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


DECODE_THREAD = "fi-decode"
MODEL_THREAD = "fi-model"
"""OS names of the threads that decode and that call the model: the benchmark reads each thread's CPU from
/proc and tells the causes apart by them (Python 3.11 names its threads for Python only)."""
_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (at most 15 bytes) where the OS shows it to others: Linux's
    /proc/<pid>/task/<tid>/comm, ps, top -H. Elsewhere nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # no libc to ask (a static build): the name is only cosmetic
        return


class CpuPool:
    def __init__(self, workers: int, name: str = "cpu", os_name: str = DECODE_THREAD) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=name, initializer=name_os_thread, initargs=(os_name,)
        )

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on a pool thread; cancelling the caller drops it if it has not started."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
