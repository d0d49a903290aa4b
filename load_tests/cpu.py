"""CPU time of a running ``bentoml serve`` process tree, by role, and of the load generator, read around each
locust run: per request served, what the front workers, each runner and the rest cost. All share the cores.

Within the front and the backend's runner each thread (/proc/<pid>/task) goes to a cause: the event loop,
decoding (``fi-decode`` threads), or the engine and the runtime's own threads.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fastinfer.compat.bentoml import worker_service
from fastinfer.serving.cpu import DECODE_THREAD

FRONT = "front"
OTHER = "other"
LOAD_GENERATOR = "load_generator"
MACHINE = "machine"
STEAL = "steal"
MISSED = "missed processes"
NOT_SERVER = (LOAD_GENERATOR, MACHINE, STEAL, MISSED)
LOOP, DECODE, ENGINE = "event loop", "decode", "engine and other threads"
THREAD_KINDS = (LOOP, DECODE, ENGINE)


def role(cmdline: list[str]) -> str:
    """``front``, ``runner-<backend>`` or ``other``, from a process's command line."""
    name = worker_service(cmdline)  # "": a worker of a one-service server may carry no name
    if name is None:
        return OTHER
    return name if name.startswith("runner-") else FRONT


@dataclass
class Snapshot:
    """CPU seconds per process of one tree, keyed by (pid, start time) so that a reused pid is new."""

    processes: dict[tuple[int, float], tuple[str, float]] = field(default_factory=dict)
    children_s: float = 0.0  # reaped children of *this* process (the load generator), RUSAGE_CHILDREN
    machine_s: float = 0.0  # every core's busy time, whoever used it: what else ran is visible
    steal_s: float = 0.0  # time the hypervisor gave this machine's cores to someone else
    # (pid, start time, tid) → (role, thread kind, CPU seconds), for the front and runner processes
    threads: dict[tuple[int, float, int], tuple[str, str, float]] = field(default_factory=dict)
    taken: float = 0.0  # when it was read, on the start times' clock (_now); 0: unknown


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def snapshot(root_pid: int | None) -> Snapshot:
    """Read the tree under ``root_pid`` (skipped when None: a server we did not start)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = psutil.cpu_times()
    busy = sum(getattr(total, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    snap = Snapshot(
        children_s=usage.ru_utime + usage.ru_stime, machine_s=busy, steal_s=getattr(total, "steal", 0.0), taken=_now()
    )
    if root_pid is None:
        return snap
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return snap
    for proc in procs:
        try:
            with proc.oneshot():
                started, name = _started(proc), role(proc.cmdline())
                snap.processes[(proc.pid, started)] = (name, _cpu_s(proc))
        except psutil.Error:  # gone between listing and reading: its CPU is lost, not misattributed
            continue
        if name != OTHER:
            for tid, kind, seconds in _threads(proc.pid):
                snap.threads[(proc.pid, started, tid)] = (name, kind, seconds)
    return snap


def _started(proc: psutil.Process) -> float:
    """When ``proc`` started, as a key only a new process changes: seconds since boot (/proc/<pid>/stat), not
    psutil's ``create_time``, which moves when the wall clock is stepped. Raises psutil.NoSuchProcess where
    the file cannot be read."""
    if not psutil.LINUX:
        return proc.create_time()
    try:
        stat = Path(psutil.PROCFS_PATH, str(proc.pid), "stat").read_bytes()  # a name need not be UTF-8
        ticks = int(stat.rsplit(b")", 1)[1].split()[19])  # field 22; the name before ")" may hold anything
    except (OSError, IndexError, ValueError) as exc:
        raise psutil.NoSuchProcess(proc.pid) from exc
    return ticks / os.sysconf("SC_CLK_TCK")


def _now() -> float:
    """Now, on :func:`_started`'s clock: seconds since boot on Linux, the epoch elsewhere."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if psutil.LINUX else time.time()


# A process absent from the first snapshot that had started this long before it was missed by it (a start
# tick's rounding and a process starting while the tree is listed stay within it).
MISSED_MARGIN_S = 1.0


def _threads(pid: int) -> list[tuple[int, str, float]]:
    """(tid, kind, CPU seconds) of each thread of ``pid``; empty where /proc is not there (macOS)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            comm = (task / "comm").read_bytes().decode(errors="replace").strip()  # a name need not be UTF-8
            fields = (task / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
        tid = int(task.name)
        kind = LOOP if tid == pid else DECODE if comm.startswith(DECODE_THREAD) else ENGINE
        found.append((tid, kind, (int(fields[11]) + int(fields[12])) / tick))  # utime + stime
    return found


def _missed(before: Snapshot, key: tuple[int, float]) -> bool:
    """Whether the process ``key`` (pid, start) had started well before ``before`` but is not in it."""
    return key not in before.processes and bool(before.taken) and key[1] < before.taken - MISSED_MARGIN_S


def by_thread(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """CPU seconds between two snapshots per role and thread kind; a thread that ended meanwhile is lost
    (the pools' threads live as long as their process)."""
    used: dict[str, dict[str, float]] = {}
    for key, (name, kind, seconds) in after.threads.items():
        if _missed(before, (key[0], key[1])):  # as in delta: its threads' CPU in the window is unknown
            continue
        start = before.threads.get(key, (name, kind, 0.0))[2]
        used.setdefault(name, dict.fromkeys(THREAD_KINDS, 0.0))[kind] += max(0.0, seconds - start)
    return used


def delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds used between two snapshots, by role; ``load_generator`` from the reaped children. A process
    started in between counts whole; one missed by the first snapshot is counted in ``MISSED``."""
    used: dict[str, float] = {MISSED: 0.0}
    for key, (name, cpu) in after.processes.items():
        if _missed(before, key):
            used[MISSED] += 1  # read after the run only: its CPU in the window is unknown, not all of it
            continue
        start = before.processes.get(key, (name, 0.0))[1]
        used[name] = used.get(name, 0.0) + max(0.0, cpu - start)
    used[LOAD_GENERATOR] = max(0.0, after.children_s - before.children_s)
    used[MACHINE] = max(0.0, after.machine_s - before.machine_s)
    used[STEAL] = max(0.0, after.steal_s - before.steal_s)
    return used


def per_request(
    used: dict[str, float],
    runner: str,
    requests: int,
    wall_s: float,
    client_s: float | None = None,
    threads: dict[str, dict[str, float]] | None = None,
    client_wall_s: float | None = None,
) -> dict[str, object]:
    """What one request cost each part, in CPU ms (front, ``runner``, the rest, the load generator), and the cores
    each kept busy meanwhile. The client's cores are over its own test window (``client_wall_s``) where it
    measured one, so its start-up's idle time does not count."""
    if requests <= 0:
        return {}
    server = {k: v for k, v in used.items() if k not in NOT_SERVER}
    front = server.get(FRONT, 0.0)
    mine = server.get(runner, 0.0)
    rest = sum(server.values()) - front - mine
    client_all = used.get(LOAD_GENERATOR, 0.0)
    client = client_all if client_s is None else client_s
    elsewhere = max(0.0, used.get(MACHINE, 0.0) - sum(server.values()) - client_all)

    def ms(seconds: float) -> float:
        return round(1000 * seconds / requests, 2)

    def cores(seconds: float) -> float:
        return round(seconds / wall_s, 2) if wall_s > 0 else 0.0

    client_cores = round(client / client_wall_s, 2) if client_s is not None and client_wall_s else cores(client)

    split = {
        part: {kind: ms(seconds) for kind, seconds in (threads or {}).get(name, {}).items()}
        for part, name in (("front", FRONT), ("runner", runner))
        if name in (threads or {})
    }
    return {
        "runner": runner,
        "ms_per_request": {"front": ms(front), "runner": ms(mine), "other": ms(rest), "load_generator": ms(client)},
        "threads_ms_per_request": split,  # {front|runner: {event loop, decode, engine and other threads}}
        "seconds": {k: round(v, 3) for k, v in sorted(used.items()) if k != MISSED},  # raw: locust's incl. start-up
        "missed_processes": int(used.get(MISSED, 0)),  # read after the run only: left out of every figure
        "wall_s": round(wall_s, 2),
        "cores_busy": {
            "server": cores(sum(server.values())),
            "load_generator": client_cores,
            "rest_of_machine": cores(elsewhere),
            "steal": cores(used.get(STEAL, 0.0)),
        },
    }
