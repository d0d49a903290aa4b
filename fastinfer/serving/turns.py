"""Turns: decoding and inference take the cores one after the other instead of preempting each other
(``FASTINFER_SCHEDULING=turns``).

On few cores an engine call spreads over every core in a parallel region that ends when its slowest thread ends;
a decode thread that preempts one of those threads makes all of them wait, spinning. Taking turns costs only the
wait for a decode under way (a few ms) and gives each kind of work the whole machine while it runs.

Every process of one server shares lock files (``flock``, so a process that dies releases its locks):

- an engine call holds ``gate`` exclusively (no decode starts), then ``work`` exclusively (the decodes under way
  end), runs, and releases both;
- a decode holds ``gate`` shared just long enough to take ``work`` shared, and ``work`` while it decodes; while it
  waits for ``gate`` it holds ``waiting`` shared (taken at its next look where a probe held it that instant).

So engine calls also take turns with each other, and a waiting engine call goes before decodes not yet started
(``flock`` alone would let a stream of shared holders starve it). An engine call that takes ``gate`` while decodes
wait for it lets it go again for an instant, for at most ``YIELD_S``, so that they get in: engine calls back to
back (unbatched calls queued, another runner's) would otherwise retake it before a waiting decode looks again. Before a
batch is formed the batcher also waits, at most ``MAX_DEFER_S``, while any front worker has decodes queued or
running (each holds ``busy`` shared meanwhile): the images being decoded join the batch instead of waiting a whole
engine call.

A ``flock`` belongs to an open file, so each thread opens its own (closed when the thread ends; the event loop's
hold on ``busy`` has one more): threads of one process exclude each other as processes do. No wait is unbounded:
an engine call waits at most ``MAX_DECODE_WAIT_S`` for the decodes under way (a huge image must not stall
everyone), and one that holds its turn past ``MAX_HOLD_S`` loses it to a watchdog. A process whose turn does not
come within ``MAX_HOLD_S`` (a stopped process holds one) or whose lock files are gone (a temp cleaner) serves as
``shared`` for ``SUSPEND_S``, then tries again; each suspension says so in its log.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from fastinfer.catalog.config import get_settings

logger = logging.getLogger("fastinfer.turns")
LOCK_FILES = ("gate", "work", "waiting", "busy")
DIR_ENV = "FASTINFER_TURNS_DIR"  # set once per `bentoml serve` (service.py): its processes share the files there
MAX_HOLD_S = 5.0  # longer than any engine call here; past it the other side goes on anyway
MAX_DECODE_WAIT_S = 0.1  # an engine call waits this long at most for decodes under way (a photo takes ~5 ms)
SUSPEND_S = 60.0  # a process that could not take its turn serves as `shared` this long
MAX_DEFER_S = 0.05  # a batch waits at most this for decodes (~10 photos' on 2 cores): a flood cannot starve it
DEFER_POLL_S = 0.002  # how often a waiting batcher looks: each look wakes its event loop
IN_TRANSIT_S = 0.001  # after decodes end, their images' way to the runner's queue (a loopback hop)
YIELD_S = 0.004  # an engine call lets decodes waiting at the gate in first, this long at most
_YIELD_POLL_S = 0.0005  # how long it lets the gate go each time: a waiting decode looks every 1 ms at most
_DECODE_POLL_S = 0.001
_FIRST_POLL_S, _LAST_POLL_S = 0.0001, 0.002  # a waiting turn looks again after 0.1 ms, backing off to 2 ms


def new_server_dir() -> Path:
    """A folder of lock files for one server, named to the processes it starts (DIR_ENV); removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="fastinfer-turns-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    make_lock_files(path)
    os.environ[DIR_ENV] = str(path)
    return path


def make_lock_files(directory: Path) -> Path:
    """The lock files, made once, before the server's processes start: they only open them, so that where a temp
    cleaner removed them a process suspends its turns (and says so) instead of locking new files of its own."""
    for name in LOCK_FILES:
        os.close(os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o600))
    return directory


def shared_dir() -> Path:
    """The lock files' folder: the server's (DIR_ENV), else a new one for this process and its children."""
    return Path(os.environ[DIR_ENV]) if os.environ.get(DIR_ENV) else new_server_dir()


@functools.cache
def this_server() -> Turns:
    """This process's turns, as FASTINFER_SCHEDULING says (``shared`` where no lock folder can be made)."""
    try:
        return Turns(get_settings().scheduling == "turns")
    except OSError as exc:
        logger.warning("FASTINFER_SCHEDULING=turns: no folder for its lock files (%s): serving as shared", exc)
        return Turns(False)


class Turns:
    """The locks, opened per thread. ``enabled=False``: today's scheduling, where nothing waits. Not re-entrant: a
    thread takes one turn at a time (a pool thread one decode, a model thread one engine call), since a nested turn
    on the same open file would release the outer one."""

    def __init__(self, enabled: bool, directory: Path | None = None) -> None:
        self.enabled = enabled
        self.directory = directory if directory is not None or not enabled else shared_dir()
        self._local = threading.local()
        self.overdue = 0  # turns not taken in time (the work then ran as if `shared`)
        self._suspended_until = 0.0
        self._holding: dict[int, tuple[float, tuple[int, ...]]] = {}  # engine thread → (since, its locks)
        self._holding_lock = threading.Lock()
        self._slow_decode = False  # an engine call found a decode under way after MAX_DECODE_WAIT_S
        self._watchdog: threading.Thread | None = None
        self._queued = 0  # this process's decodes queued or running (event-loop thread only)
        self._busy_fd: int | None = None  # the open file of `busy` that holds it for this process's decodes
        self._busy_held = False

    @property
    def active(self) -> bool:
        """Taking turns now: enabled, and not suspended after a turn that did not come."""
        return self.enabled and time.monotonic() >= self._suspended_until

    @contextlib.contextmanager
    def inferring(self) -> Iterator[None]:
        """Hold the cores for one engine call: decodes already waiting go first (at most YIELD_S), then no decode
        starts, and those under way end first (or within MAX_DECODE_WAIT_S)."""
        held = self._engine_turn() if self.active else ()
        try:
            yield
        finally:
            self._release(held)

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """Hold a share of the cores for one decode: waits while an engine call runs or waits to run."""
        held = self._decode_turn() if self.active else ()
        try:
            yield
        finally:
            self._release(held)

    def _engine_turn(self) -> tuple[int, ...]:
        held: tuple[int, ...] = ()
        try:
            files = self._files()
            if not self._gate_for_engine(files):
                return self._suspend("an engine call did not get its turn (another stopped holding it?)")
            held = (files.gate,)
            # A decode that outlasted one wait is still under way: the next calls look once, and run beside it.
            if self._take(files.work, fcntl.LOCK_EX, 0.0 if self._slow_decode else MAX_DECODE_WAIT_S):
                held = (files.work, files.gate)
            self._slow_decode = len(held) == 1
            self._watch(*held)
        except Exception as exc:
            self._release(held)
            if not isinstance(exc, OSError):
                raise
            return self._suspend(f"its lock files cannot be used ({exc})")
        return held

    def _gate_for_engine(self, files: _ThreadFiles) -> bool:
        """Take `gate` exclusively; while decodes wait for it (`waiting` held elsewhere), let it go again for an
        instant so that they get in, for YIELD_S at most from the first time it was taken. False: not taken
        within MAX_HOLD_S."""
        yield_until = 0.0
        while True:
            if not self._take(files.gate, fcntl.LOCK_EX, MAX_HOLD_S):
                return False
            now = time.monotonic()
            yield_until = yield_until or now + YIELD_S
            try:
                if now >= yield_until or not self._held_elsewhere(files.waiting):
                    return True
            except BaseException:  # the caller releases only what it was given: never leave `gate` held
                fcntl.flock(files.gate, fcntl.LOCK_UN)
                raise
            fcntl.flock(files.gate, fcntl.LOCK_UN)
            time.sleep(_YIELD_POLL_S)

    def _decode_turn(self) -> tuple[int, ...]:
        said = False  # this decode holds `waiting`: it waits for `gate`
        try:
            files = self._files()
            try:
                give_up, pause = time.monotonic() + MAX_HOLD_S, _FIRST_POLL_S
                while not self._try(files.gate, fcntl.LOCK_SH):
                    said = said or self._try(files.waiting, fcntl.LOCK_SH)  # a probe may hold it an instant
                    if time.monotonic() > give_up:
                        return self._suspend("a decode did not get its turn (an engine call stopped holding it?)")
                    time.sleep(pause)
                    pause = min(pause * 2, _DECODE_POLL_S)
                try:
                    fcntl.flock(files.work, fcntl.LOCK_SH)  # at once: an engine holds `work` only with `gate`
                finally:
                    fcntl.flock(files.gate, fcntl.LOCK_UN)
            finally:
                if said:
                    fcntl.flock(files.waiting, fcntl.LOCK_UN)
        except OSError as exc:
            return self._suspend(f"its lock files cannot be used ({exc})")
        return (files.work,)

    def _release(self, held: tuple[int, ...]) -> None:
        if held:
            with self._holding_lock:
                self._holding.pop(threading.get_ident(), None)
                for fd in held:
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def _suspend(self, why: str) -> tuple[int, ...]:
        self.overdue += 1
        self._suspended_until = time.monotonic() + SUSPEND_S
        logger.warning("turns: %s; this process serves as FASTINFER_SCHEDULING=shared for %g s", why, SUSPEND_S)
        return ()

    def decode_queued(self) -> None:
        """A decode was queued (call from the event loop): this process is busy decoding until decode_ended."""
        if self.enabled:
            self._queued += 1
            if self.active and not self._busy_held:  # where a probe holds it this instant, the next one retries
                self._busy_held = self._hold_busy(fcntl.LOCK_SH | fcntl.LOCK_NB)

    def decode_ended(self) -> None:
        if self.enabled:
            self._queued -= 1
            if self._queued == 0 and self._busy_held:
                self._hold_busy(fcntl.LOCK_UN)
                self._busy_held = False

    async def after_decodes(self) -> None:
        """Wait (at most MAX_DEFER_S) while any process has decodes queued or running, then for their images to
        arrive: a batch formed now takes them. Nothing to wait for: returns at once (one client pays nothing)."""
        if not self.active:
            return
        give_up = time.monotonic() + MAX_DEFER_S
        waited = False
        try:
            while self._held_elsewhere(self._files().busy) and time.monotonic() < give_up:
                waited = True
                await asyncio.sleep(DEFER_POLL_S)
        except OSError as exc:
            self._suspend(f"its lock files cannot be used ({exc})")
        if waited:
            await asyncio.sleep(IN_TRANSIT_S)

    @classmethod
    def _held_elsewhere(cls, fd: int) -> bool:
        """Whether another open file holds this lock: probed by taking it and letting it go at once."""
        if not cls._try(fd, fcntl.LOCK_EX):
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False

    def _hold_busy(self, operation: int) -> bool:
        """``flock`` on `busy` through the open file that holds it for this process's decodes; False where it would
        block. A hint for batchers only: where it cannot be used, nobody waits for this process's decodes."""
        try:
            if self._busy_fd is None:
                self._busy_fd = os.open(self._path("busy"), os.O_RDWR)
            fcntl.flock(self._busy_fd, operation)
        except BlockingIOError:
            return False
        except OSError:
            return True
        return True

    def _files(self) -> _ThreadFiles:
        """This thread's open lock files (OSError where they cannot be opened: a temp cleaner removed them)."""
        files = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = _ThreadFiles(self._path)
        return files

    def _path(self, name: str) -> Path:
        assert self.directory is not None
        return self.directory / name

    @staticmethod
    def _try(fd: int, mode: int) -> bool:
        """Take the lock if it is free now."""
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    @classmethod
    def _take(cls, fd: int, mode: int, wait_s: float) -> bool:
        """Take the lock, polling with a short back-off; False (not taken) after ``wait_s``."""
        give_up, pause = time.monotonic() + wait_s, _FIRST_POLL_S
        while not cls._try(fd, mode):
            if time.monotonic() > give_up:
                return False
            time.sleep(pause)
            pause = min(pause * 2, _LAST_POLL_S)
        return True

    def _watch(self, *fds: int) -> None:
        """Let the watchdog release this engine call's turn if it outlasts MAX_HOLD_S (a flock is the open
        file's, so another thread may release it)."""
        with self._holding_lock:
            if self._watchdog is None:
                watchdog = threading.Thread(target=self._release_overdue, name="fi-turns", daemon=True)
                watchdog.start()
                self._watchdog = watchdog
            self._holding[threading.get_ident()] = (time.monotonic(), fds)

    def _release_overdue(self) -> None:
        while True:
            time.sleep(min(1.0, MAX_HOLD_S / 2))
            released = 0
            with self._holding_lock:
                for thread, (since, fds) in list(self._holding.items()):
                    if time.monotonic() - since > MAX_HOLD_S:
                        del self._holding[thread]
                        released += 1
                        for fd in fds:  # `work` first, as _release: a decode past `gate` takes `work` at once
                            with contextlib.suppress(OSError):  # the watchdog must outlive any one failure
                                fcntl.flock(fd, fcntl.LOCK_UN)
            if released:
                self.overdue += released
                logger.warning("turns: an engine call held its turn over %g s (stuck?): decoding goes on beside it",
                               MAX_HOLD_S)  # fmt: skip


class _ThreadFiles:
    """One thread's open lock files, all or none; closed when the thread ends (its ``threading.local`` goes)."""

    def __init__(self, path: Callable[[str], Path]) -> None:
        fds: list[int] = []
        try:
            for name in LOCK_FILES:
                fds.append(os.open(path(name), os.O_RDWR))  # never made here: make_lock_files
        except OSError:
            _close_all(fds)
            raise
        self.gate, self.work, self.waiting, self.busy = fds  # as LOCK_FILES
        # Not at exit: threads still running then may be mid-turn; the process's end closes them anyway.
        weakref.finalize(self, _close_all, fds).atexit = False


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
