"""Reading files: a content digest (the store's records, the build's weights check, OpenVINO's cache key) and
a small file read at start-up."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class TooLarge(ValueError):
    """A file over read_small's limit."""


def read_small(path: str | Path, max_bytes: int) -> bytes:
    """A regular file's bytes, at most ``max_bytes``, else ValueError; OSError when it cannot be read. Anything
    else is refused before it is opened: opening a FIFO releases its writer, a device may act on open."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for something else since the stat
            raise ValueError("not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(f"larger than {max_bytes} bytes")
    return data
