"""The current request's deadline, for the work it starts in other processes.

A runner the front already called cannot see its 504; so the runner call sends the seconds left (each process
measures on its own monotonic clock), and the runner drops work whose time is up before its model takes it.
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
    """Seconds left to answer the current request (at least a microsecond once due); 0.0 when none was set."""
    deadline = _DEADLINE.get()
    return 0.0 if deadline == 0.0 else max(_AT_LEAST, deadline - time.monotonic())


def monotonic_deadline(within_s: float) -> float:
    """A runner's side: ``within_s`` as sent (0 = none) → a deadline on this process's monotonic clock."""
    return time.monotonic() + within_s if within_s > 0 else 0.0
