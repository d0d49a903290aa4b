"""Greedy micro-batching for one model in one process.

Not BentoML's adaptive batching: its dispatcher learns a "wait" from observed queueing and keeps it after a burst
(160 ms of runner time per lone request after a 10-client burst, against 58 ms here). This batcher never waits
when the model is idle (unless ``max_latency_ms`` asks it to); under load, requests that arrive while a batch runs
are taken together, up to ``max_batch_size`` rows. Every model call runs on one dedicated thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from fastinfer.serving.cpu import MODEL_THREAD, name_os_thread


class Expired(TimeoutError):
    """The caller's deadline passed (answered 504) before the model took its images."""


@dataclass
class _Job:
    images: np.ndarray
    future: asyncio.Future[np.ndarray]
    deadline: float = 0.0  # time.monotonic() by which the caller stops waiting, 0 = none
    enqueued: float = field(default_factory=time.perf_counter)

    def expired(self) -> bool:
        return 0.0 < self.deadline < time.monotonic()


class MicroBatcher:
    def __init__(self, run: Callable[[np.ndarray], np.ndarray], max_batch_size: int, max_latency_ms: float) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self._run = run
        self.max_batch_size = max_batch_size
        self.linger_s = max(0.0, max_latency_ms) / 1000
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="model", initializer=name_os_thread, initargs=(MODEL_THREAD,)
        )
        self._queue: deque[_Job] = deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self.expired_rows = 0  # images dropped because their deadline passed before the model took them

    async def run_now(self, images: np.ndarray, deadline: float = 0.0) -> np.ndarray:
        """One model call with exactly these images, on the model thread; Expired past ``deadline`` (0: none)."""

        def run() -> np.ndarray:
            if 0.0 < deadline < time.monotonic():
                self.expired_rows += len(images)
                raise Expired("the request's deadline passed before the model took it")
            return self._run(images)

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    async def submit(self, images: np.ndarray, deadline: float = 0.0) -> np.ndarray:
        """Queue ``images`` ([n,...]) to run in a batch with others: their n outputs; Expired past ``deadline``."""
        if getattr(images, "ndim", 0) < 1 or len(images) < 1:
            raise ValueError("submit needs an array of at least one row")
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        job = _Job(images, loop.create_future(), deadline)
        self._queue.append(job)
        assert self._wake is not None
        self._wake.set()
        return await job.future

    def _queued_rows(self) -> int:
        return sum(len(j.images) for j in self._queue if not j.future.done())

    async def _serve(self) -> None:
        assert self._wake is not None
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.linger_s > 0:
                deadline = self._queue[0].enqueued + self.linger_s
                while self._queued_rows() < self.max_batch_size and time.perf_counter() < deadline:
                    await asyncio.sleep(min(0.0005, max(0.0, deadline - time.perf_counter())))
            jobs = self._take()
            if jobs:
                await self._run_batch(jobs)

    async def _run_batch(self, jobs: list[_Job]) -> None:
        """Run the taken jobs as one batch; every one of them is resolved, whatever fails."""
        try:
            batch = jobs[0].images if len(jobs) == 1 else np.concatenate([j.images for j in jobs])
            outputs = await self.run_now(batch)
            if len(outputs) != len(batch):
                raise RuntimeError(f"the model returned {len(outputs)} rows for a batch of {len(batch)}")
        except Exception as exc:  # e.g. the model failed or the jobs' shapes differ: each caller learns why
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        start = 0
        for job in jobs:
            n = len(job.images)
            if not job.future.done():  # the caller may have gone away meanwhile
                job.future.set_result(outputs[start : start + n])
            start += n

    def _take(self) -> list[_Job]:
        """Queued jobs, oldest first, up to max_batch_size rows (one job even if larger)."""
        jobs: list[_Job] = []
        rows = 0
        while self._queue:
            job = self._queue[0]
            if job.future.done():  # cancelled by its caller: drop it
                self._queue.popleft()
                continue
            if job.expired():  # answered 504 already: nobody waits for it
                self._queue.popleft()
                self.expired_rows += len(job.images)
                job.future.set_exception(Expired("the request's deadline passed while it queued"))
                continue
            if jobs and rows + len(job.images) > self.max_batch_size:
                break
            jobs.append(self._queue.popleft())
            rows += len(job.images)
        return jobs
