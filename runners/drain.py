"""Runners leave last: on SIGTERM a runner keeps serving until the front has drained.

`bentoml serve` (its process manager, circus) stops every worker at once. The front then finishes
the requests it holds (uvicorn's graceful shutdown), but a request still being uploaded or decoded
needs its runner *afterwards*, and the runner had already gone: "UnixClientConnectorError", a 503,
during every rolling update. So a runner defers its own shutdown until no front worker is left
beside it (or the request deadline has passed), then shuts down as usual. Only SIGTERM — what
docker stop and Kubernetes send — is deferred; Ctrl-C (SIGINT) still stops everything at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType
from typing import Any

import psutil

logger = logging.getLogger("fastinfer.runner")


def front_workers_alive() -> bool:
    """Whether a sibling worker that is not a runner (the front) still runs under `bentoml serve`."""
    me = psutil.Process()
    parent = me.parent()
    if parent is None:
        return False
    for proc in parent.children():
        try:
            if proc.pid == me.pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            args = proc.cmdline()
        except psutil.Error:  # exited meanwhile
            continue
        if "--service-name" in args[:-1]:
            name = args[args.index("--service-name") + 1]
            if not name.startswith("runner-"):
                return True
    return False


def leave_after_front(max_wait_s: float) -> None:
    """From inside the running worker (an on_startup hook, once uvicorn has its handler): defer SIGTERM."""
    shut_down = signal.getsignal(signal.SIGTERM)
    if not callable(shut_down):  # no server handler to defer (not under uvicorn)
        return
    loop = asyncio.get_running_loop()
    started: list[asyncio.Task[None]] = []  # the task must be referenced, or it may be collected

    async def drain(signum: int, frame: FrameType | None) -> None:
        deadline = time.monotonic() + max_wait_s
        while front_workers_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        shut_down(signum, frame)

    def on_sigterm(signum: int, frame: FrameType | None) -> Any:
        if started:  # a second SIGTERM while draining: stop now
            return shut_down(signum, frame)
        logger.info("SIGTERM: serving until the front has drained (at most %.0fs)", max_wait_s)
        loop.call_soon_threadsafe(lambda: started.append(loop.create_task(drain(signum, frame))))

    signal.signal(signal.SIGTERM, on_sigterm)
