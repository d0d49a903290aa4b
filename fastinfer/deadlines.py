"""The current request's deadline, for the work it starts in other processes.

The front (fastinfer/http.py) answers 504 at its deadline and cancels its handler, but a runner
it already called cannot see that: it would still run the images, for nobody. So the front sets the
deadline here for the request's task, the runner call sends it along, and the runner drops work
whose deadline has passed before its model takes it (fastinfer/batching.py).
"""

from __future__ import annotations

import time
from contextvars import ContextVar

_DEADLINE: ContextVar[float] = ContextVar("fastinfer_deadline", default=0.0)


def set_within(seconds: float) -> None:
    """This request (the current task and those it starts) must be answered within ``seconds``."""
    _DEADLINE.set(time.time() + max(0.0, seconds))


def current() -> float:
    """The wall-clock time (``time.time()``: other processes compare it) by which the current request
    must be answered; 0.0 when none was set (an in-process call)."""
    return _DEADLINE.get()
