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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

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
