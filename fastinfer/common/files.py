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


def read_small(path: str | Path, max_bytes: int) -> bytes:
    """A regular file's bytes, at most ``max_bytes`` (else ValueError: a FIFO would block start-up, a device never
    end); OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        f = os.fdopen(fd, "rb")  # IsADirectoryError for a directory
    except OSError:
        os.close(fd)
        raise
    with f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    return data
