"""The current request's deadline, for the work it starts in other processes.

The front (fastinfer/front/http.py) answers 504 at its deadline and cancels its handler, but a runner
it already called cannot see that: it would still run the images, for nobody. So the front sets the
deadline here for the request's task, the runner call sends the seconds left, and the runner drops
work whose time is up before its model takes it (fastinfer/serving/batching.py). Seconds left, not a time
of day: each process measures on its own monotonic clock, which a clock step cannot move.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

_DEADLINE: ContextVar[float] = ContextVar("fastinfer_deadline", default=0.0)
_AT_LEAST = 1e-6  # "no time left" is still a limit: 0 means none


def set_within(seconds: float) -> None:
    """This request (the current task and those it starts) must be answered within ``seconds``."""
    _DEADLINE.set(time.monotonic() + max(0.0, seconds))


def remaining() -> float:
    """Seconds left to answer the current request (at least a microsecond once it is due); 0.0 when no
    deadline was set (an in-process call)."""
    deadline = _DEADLINE.get()
    return 0.0 if deadline == 0.0 else max(_AT_LEAST, deadline - time.monotonic())


def monotonic_deadline(within_s: float) -> float:
    """A runner's side: ``within_s`` as sent (0 = none) → a deadline on this process's monotonic clock."""
    return time.monotonic() + within_s if within_s > 0 else 0.0
