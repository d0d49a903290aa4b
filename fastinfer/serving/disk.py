"""A full disk under BENTOML_HOME: a degraded state, not a crash loop (docs/overload.md, "A full disk").

:func:`guard_metric_files` swaps prometheus_client's ``MmapedDict`` for one that gives its sparse file real blocks
(``os.posix_fallocate``) before any page is mapped, so a full disk is an ``OSError`` to catch, not a SIGBUS; the
process's values live in anonymous memory until space returns. :meth:`DiskHealth.reason` is what ``/readyz`` says.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import re
import shutil
import struct
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from psutil import pid_exists

from fastinfer.common import leases
from fastinfer.common.home import bentoml_home
from fastinfer.compat.bentoml import set_prometheus_dir
from fastinfer.compat.prometheus import HEADER, INITIAL_MMAP_SIZE, MmapedDict, use_mmaped_dict

logger = logging.getLogger("fastinfer.disk")

RETRY_S = 5.0  # a file held in memory tries to get its blocks back at most this often
CHECK_S = 1.0  # free space is looked up at most this often (each /readyz asks)
_FILE_NAME = re.compile(r"(?P<kind>[a-z_]+)_(?P<pid>\d+)\.db")


class DiskHealth:
    """Why the disk makes this process degraded, or None: metric files that could not get disk blocks,
    or less than ``min_free_bytes`` free where BentoML writes (BENTOML_HOME, the Prometheus directory)."""

    def __init__(self, min_free_bytes: int, paths: Callable[[], list[str]]) -> None:
        self.min_free_bytes = min_free_bytes
        self.paths = paths
        self.in_memory: weakref.WeakSet[GuardedMmapedDict] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.checked_at = -CHECK_S
        self.low_space: str | None = None

    def reason(self) -> str | None:
        """One sentence for a client (no server paths), or None when the disk is fine."""
        reasons = []
        if self.in_memory:
            reasons.append(
                "the disk under BENTOML_HOME is full: this worker's metrics cannot be written there and are "
                "held in memory (missing from /metrics until space returns)"
            )
        if (low := self._low_space()) is not None:
            reasons.append(low)
        return "; ".join(reasons) or None

    def _low_space(self) -> str | None:
        now = time.monotonic()
        if self.min_free_bytes <= 0 or now - self.checked_at < CHECK_S:
            return self.low_space
        self.checked_at = now
        low = None
        for path in self.paths():
            with contextlib.suppress(OSError):  # a path not there (yet): nothing to say about its disk
                stat = os.statvfs(path)
                if (free := stat.f_bavail * stat.f_frsize) < self.min_free_bytes:
                    low = (
                        f"less than {self.min_free_bytes // 2**20} MB free on the disk under BENTOML_HOME "
                        f"({free // 2**20} MB; FASTINFER_MIN_FREE_DISK_MB)"
                    )
                    if self.low_space is None:
                        logger.error(
                            "disk: %s has %d bytes free (FASTINFER_MIN_FREE_DISK_MB): /readyz answers 503", path, free
                        )
                    break
        if low is None and self.low_space is not None:
            logger.warning("disk: free space is back above FASTINFER_MIN_FREE_DISK_MB")
        self.low_space = low
        return low

    def moved_to_memory(self, metric_file: GuardedMmapedDict, filename: str, exc: OSError) -> None:
        with self.lock:
            first = not self.in_memory
            self.in_memory.add(metric_file)
        if first:  # once per episode, not once per file or per request
            logger.error(
                "disk: cannot give %s disk blocks (%s): metrics of this process are held in memory (missing "
                "from /metrics) until space returns; /readyz answers 503 meanwhile",
                filename,
                exc,
            )

    def back_on_disk(self, metric_file: GuardedMmapedDict) -> None:
        with self.lock:
            self.in_memory.discard(metric_file)
            last = not self.in_memory
        if last:
            logger.warning("disk: space is back; metrics are written to their files again")


def _default_paths() -> list[str]:
    return [p for p in (os.environ.get("PROMETHEUS_MULTIPROC_DIR"), str(bentoml_home())) if p]


HEALTH = DiskHealth(0, _default_paths)


def _allocate(fd: int, size: int) -> None:
    """Give the first ``size`` bytes of the file real blocks (and that length): ENOSPC here, not SIGBUS later."""
    os.posix_fallocate(fd, 0, size)


def _open_allocated(filename: str, capacity: int) -> BinaryIO:
    """The file, with blocks for its first ``capacity`` bytes and all it holds (a file made before the disk filled
    has holes); else OSError, and a file left empty is removed (/metrics cannot read one)."""
    file = open(filename, "a+b")  # noqa: SIM115 - the caller keeps it open
    try:
        _allocate(file.fileno(), max(capacity, os.fstat(file.fileno()).st_size))
    except OSError:
        if os.fstat(file.fileno()).st_size == 0:
            with contextlib.suppress(OSError):
                os.unlink(filename)
        file.close()
        raise
    return file


class GuardedMmapedDict(MmapedDict):
    """prometheus_client's MmapedDict (fastinfer/compat/prometheus.py), never mapping a page without a disk block
    behind it: without one, the values are held in anonymous memory and tried on the file again every RETRY_S.
    Every method but ``__init__`` runs under prometheus_client's lock, so a move cannot race with a write."""

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        self._retry_at = 0.0
        if not read_mode:
            try:
                _open_allocated(filename, INITIAL_MMAP_SIZE).close()
            except OSError as exc:
                self._f, self._fname, self._used, self._positions = None, filename, HEADER, {}
                self._m = struct.pack("ii", HEADER, 0)
                self._retry_at = time.monotonic() + RETRY_S
                HEALTH.moved_to_memory(self, filename, exc)
                self._remap(INITIAL_MMAP_SIZE)
                return
        super().__init__(filename, read_mode)

    def _init_value(self, key: str) -> None:
        # Room for the entry first (an upper bound of the one prometheus_client writes: length, key padded
        # to 8 bytes, two doubles), so that its own growth by truncate (sparse) never runs.
        needed = self._used + 4 + len(key.encode("utf-8")) + 8 + 16
        if needed > self._capacity:
            capacity = self._capacity
            while needed > capacity:
                capacity *= 2
            self._remap(capacity)
        super()._init_value(key)

    def write_value(self, key: str, value: float, timestamp: float) -> None:
        if self._f is None and time.monotonic() >= self._retry_at:
            self._remap(self._capacity)
        super().write_value(key, value, timestamp)

    def _remap(self, capacity: int) -> None:
        """Move the values to ``capacity`` bytes of the file where it gets their blocks (once in memory, tried at
        most every RETRY_S), else of anonymous memory; the file keeps its last consistent values meanwhile."""
        file = None
        if self._f is not None or time.monotonic() >= self._retry_at:
            try:
                file = _open_allocated(self._fname, capacity)
            except OSError as exc:
                self._retry_at = time.monotonic() + RETRY_S
                HEALTH.moved_to_memory(self, self._fname, exc)
        mapped = mmap.mmap(-1 if file is None else file.fileno(), capacity)
        # Entries first, the used count last: a /metrics scrape reading meanwhile sees old or new, whole.
        mapped[HEADER : self._used] = self._m[HEADER : self._used]
        mapped[:HEADER] = self._m[:HEADER]
        if self._f is not None:
            self._m.close()
            self._f.close()
        elif file is not None:
            HEALTH.back_on_disk(self)
        self._f, self._m, self._capacity = file, mapped, capacity


def remove_stale_files(directory: str) -> int:
    """Delete the metric files of dead processes that count towards no total: empty ones and live gauges (what
    ``mark_process_dead`` deletes, never called by a killed process). Counts stay, so counters never go back."""
    removed = 0
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            match = _FILE_NAME.fullmatch(entry.name)
            if match is None or not _is_pid(match["pid"]) or pid_exists(int(match["pid"])):
                continue
            try:
                if match["kind"].startswith("gauge_live") or _holds_nothing(entry.path):
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue  # another process removed it first, or it is unreadable: left alone
    return removed


def _is_pid(name: str) -> bool:
    """A folder name a server gave (its pid), not one someone else put there ("²", twenty digits)."""
    return name.isascii() and name.isdigit() and 0 < int(name) <= 4_194_304  # Linux's largest pid_max


def _holds_nothing(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) < 4 or struct.unpack("i", head)[0] <= HEADER


METRICS_ROOT = "fastinfer-metrics"
"""Under BENTOML_HOME: one metric directory per running server, ``<supervisor pid>/``. BentoML's default is
one directory per home that every ``bentoml serve`` empties at start: a second server on the home (or
``fastinfer tune``'s servers) blanked the first one's /metrics."""
LEASE = ".server"  # in a server's metric directory: held by each of its processes (fastinfer.common.leases)


_own_dir: Path | None = None  # the metric directory own_metrics_dir gave this supervisor


def own_metrics_dir() -> None:
    """In ``bentoml serve``'s supervisor, before it prepares the metric directory: make it this server's
    own (its workers are given it as PROMETHEUS_MULTIPROC_DIR). In a worker, nothing: it has its server's."""
    global _own_dir
    root = bentoml_home() / METRICS_ROOT
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given and Path(given).parent == root:
        return
    _own_dir = root / str(os.getpid())
    set_prometheus_dir(str(_own_dir))


def claim_metrics_dir() -> None:
    """In the supervisor, once BentoML has made the directory: hold this server's lease on it, and remove
    the directories of servers that are gone (no process holds their lease, their supervisor is dead)."""
    if _own_dir is None or not _own_dir.is_dir():
        return
    with contextlib.suppress(OSError):
        leases.create(_own_dir / LEASE, str(os.getpid()))
    atexit.register(shutil.rmtree, _own_dir, ignore_errors=True)  # a clean stop leaves nothing behind
    with contextlib.suppress(OSError), os.scandir(_own_dir.parent) as entries:
        for entry in entries:
            gone = _is_pid(entry.name) and not pid_exists(int(entry.name)) and not leases.held(Path(entry.path) / LEASE)
            if gone and entry.path != str(_own_dir):
                shutil.rmtree(entry.path, ignore_errors=True)


def guard_metric_files(min_free_bytes: int) -> DiskHealth:
    """Install :class:`GuardedMmapedDict` for the metric files this process opens from now on, clear the files
    dead processes left, and return the health ``/readyz`` consults. Call before any metric is recorded."""
    HEALTH.min_free_bytes = min_free_bytes
    use_mmaped_dict(GuardedMmapedDict)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        if _is_pid(Path(directory).name):  # a worker keeps its server's metrics while it lives
            leases.hold(Path(directory) / LEASE, int(Path(directory).name))
        early = [p.name for p in Path(directory).glob(f"*_{os.getpid()}.db")]
        if early:
            logger.warning("disk: metric files opened before the guard (not covered): %s", ", ".join(early))
        if removed := remove_stale_files(directory):
            logger.info("disk: removed %d metric files left by dead processes", removed)
    return HEALTH
