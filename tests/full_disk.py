"""A real small filesystem that tests can fill: a tmpfs mounted for the test (root; skipped with the
reason where the mount is refused, e.g. in an unprivileged container)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_filesystem(path: Path, size_mb: int) -> Iterator[Path]:
    """``path`` as the mount point of a ``size_mb`` MB tmpfs for the duration."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: a full filesystem cannot be made")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs was refused ({done.stderr.strip() or done.returncode}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros into ``directory/name`` until its filesystem has not one block left."""
    filler = directory / name
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):  # ENOSPC: on to smaller writes
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    stat = os.statvfs(directory)
    assert stat.f_bavail == 0, f"{directory} still has {stat.f_bavail} blocks free"
    return filler
