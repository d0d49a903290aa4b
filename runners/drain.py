"""Runners leave last: on SIGTERM a runner keeps serving until the front beside it has drained, and links back the
Unix socket file ``bentoml serve`` deletes first (docs/overload.md, "Shutdown", says why not loopback TCP).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from types import FrameType
from typing import Any

import psutil

from fastinfer.compat.bentoml import socket_fd, worker_service

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
        if (name := worker_service(args)) and not name.startswith("runner-"):
            return True
    return False


def listening_socket_path() -> str | None:
    """The file of the Unix socket this worker serves, if any."""
    if (fd := socket_fd(sys.argv)) is None:
        return None
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            name = sock.getsockname() if sock.family == socket.AF_UNIX else None
    except OSError:
        return None
    return name if isinstance(name, str) and name else None


class SocketName:
    """A spare hard link to a Unix socket's file, to put the file back after someone deletes it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._spare_dir = tempfile.mkdtemp(prefix="fastinfer-runner-")  # private, like the original
        self._spare = os.path.join(self._spare_dir, "socket")
        os.link(path, self._spare)
        self.restored = False
        atexit.register(self.remove)

    def restore(self) -> None:
        """Link the socket back at its path if it is gone (its directory too, user-only)."""
        if os.path.exists(self.path):
            return
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another runner's restore raced ours: fine
            os.link(self._spare, self.path)
        self.restored = True

    def remove(self) -> None:
        if self.restored:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self.path))  # the last runner out removes the directory
        shutil.rmtree(self._spare_dir, ignore_errors=True)


def leave_after_front(max_wait_s: float) -> None:
    """From inside the running worker (an on_startup hook, once uvicorn has its handler): defer SIGTERM."""
    shut_down = signal.getsignal(signal.SIGTERM)
    if not callable(shut_down):  # no server handler to defer (not under uvicorn)
        return
    path = listening_socket_path()
    name = SocketName(path) if path else None
    loop = asyncio.get_running_loop()
    started: list[asyncio.Task[None]] = []  # the task must be referenced, or it may be collected

    async def drain(signum: int, frame: FrameType | None) -> None:
        deadline = time.monotonic() + max_wait_s
        while front_workers_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if name is not None:  # nobody will connect again (the process may end without atexit)
            name.remove()
        shut_down(signum, frame)

    def on_sigterm(signum: int, frame: FrameType | None) -> Any:
        if started:  # a second SIGTERM while draining: stop now
            return shut_down(signum, frame)
        if name is not None:
            name.restore()  # at once: `bentoml serve` deleted it just before signalling
        logger.info("SIGTERM: serving until the front has drained (at most %.0fs)", max_wait_s)
        loop.call_soon_threadsafe(lambda: started.append(loop.create_task(drain(signum, frame))))

    signal.signal(signal.SIGTERM, on_sigterm)
