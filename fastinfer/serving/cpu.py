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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class CpuPool:
    def __init__(self, workers: int, name: str = "cpu") -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on a pool thread; cancelling the caller drops it if it has not started."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
