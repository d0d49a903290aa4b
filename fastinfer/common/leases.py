"""Leases: a file that every process of one server holds a shared ``flock`` on while it lives.

A pid says too little (workers outlive a killed supervisor, and pids are reused); a lock goes when the last
holder exits, however it exits. Another process asks by trying an exclusive lock without waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from pathlib import Path

_held: dict[str, int] = {}  # path → the descriptor that holds its lock, open for the life of the process
DRAFT = ".draft"  # a lease being written; one left by a process killed meanwhile is swept (sweep_drafts)


def create(path: Path, text: str) -> Path:
    """Write ``text`` at ``path``, held by this process before it appears: no one ever sees it unheld."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}{DRAFT}")
    fd = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.write(fd, text.encode())
        os.replace(draft, path)  # not a hard link: some shared filesystems (SMB, FUSE) have none
    except BaseException:
        os.close(fd)
        draft.unlink(missing_ok=True)
        raise
    _held[str(path)] = fd
    return path


def hold(path: Path, owner: int) -> bool:
    """Hold the lease at ``path`` for the rest of this worker's life; False when it is gone, cannot be opened, or
    ``owner`` is no longer this process's parent (the lease may have been taken for dead meanwhile)."""
    if str(path) in _held:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_SH)
    if os.getppid() != owner:
        os.close(fd)
        return False
    _held[str(path)] = fd
    return True


def held(path: Path) -> bool:
    """Whether a live process holds the lease at ``path``; what cannot be checked is never taken for dead."""
    if str(path) in _held:
        return True
    try:
        try:  # read-write where it may (NFS's emulated LOCK_EX needs it), else read-only: another user's lease
            fd = os.open(path, os.O_RDWR)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY)
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


def sweep_drafts(folder: Path, older_than_s: float = 60.0) -> None:
    """Remove the drafts in ``folder`` left by a process killed while it wrote a lease."""
    now = time.time()
    for draft in folder.glob(f".*{DRAFT}"):
        with contextlib.suppress(OSError):
            if now - draft.stat().st_mtime > older_than_s:
                draft.unlink()


def release(path: Path) -> None:
    """Stop holding the lease at ``path`` in this process (tests; a process that exits releases it anyway)."""
    if (fd := _held.pop(str(path), None)) is not None:
        os.close(fd)
