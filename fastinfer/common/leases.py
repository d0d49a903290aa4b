"""Leases: a file that every process of one server holds a shared ``flock`` on while it lives.

A server is a supervisor (``bentoml serve``) and its workers. Whether it still runs is not whether its
supervisor's pid answers: after a ``kill -9`` of the supervisor its workers keep serving, unsupervised,
and a pid can be reused by an unrelated process. The kernel knows the answer: a lock goes when the last
process holding it exits, however it exits. So the supervisor creates the lease already locked, each
worker takes the same shared lock at start, and another process asks whether anyone holds it by trying
an exclusive lock without waiting.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

_held: dict[str, int] = {}  # path → the descriptor that holds its lock, open for the life of the process


def create(path: Path, text: str) -> Path:
    """Write ``text`` at ``path``, held by this process before it appears: no one ever sees it unheld."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}.draft")
    fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.write(fd, text.encode())
        os.replace(draft, path)
    except BaseException:
        os.close(fd)
        draft.unlink(missing_ok=True)
        raise
    _held[str(path)] = fd
    return path


def hold(path: Path) -> bool:
    """Hold the lease at ``path`` for the rest of this process's life (a worker of the server that
    created it); False when it is gone or cannot be opened."""
    if str(path) in _held:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_SH)
    _held[str(path)] = fd
    return True


def held(path: Path) -> bool:
    """Whether a live process holds the lease at ``path`` (this one included). A file that cannot be
    opened to ask is held, unless it is gone: what cannot be checked is never taken for dead."""
    if str(path) in _held:
        return True
    try:
        fd = os.open(path, os.O_RDWR)  # read-write: where flock is emulated with POSIX locks (NFS), LOCK_EX needs it
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock, if this took it
    return False


def release(path: Path) -> None:
    """Stop holding the lease at ``path`` in this process (tests; a process that exits releases it anyway)."""
    if (fd := _held.pop(str(path), None)) is not None:
        os.close(fd)
