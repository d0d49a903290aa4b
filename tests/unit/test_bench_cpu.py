"""The bench's CPU accounting of a server's process tree: roles from command lines, deltas, per request."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from load_tests import cpu

WORKER = ["/venv/bin/python", "-m", "_bentoml_impl.worker.service", "service:FastInfer"]


def test_roles_come_from_the_worker_command_lines() -> None:
    assert cpu.role([*WORKER, "--fd", "12", "--service-name", "fastinfer", "--worker-id", "1"]) == "front"
    assert cpu.role([*WORKER, "--service-name", "runner-onnx-int8", "--fd", "7"]) == "runner-onnx-int8"
    assert cpu.role(["/venv/bin/python", "-m", "_bentoml_impl.worker.service", "bare_service:Bare"]) == "front"
    assert cpu.role(["/venv/bin/python", "/venv/bin/bentoml", "serve", "service:FastInfer"]) == "other"
    assert cpu.role([*WORKER, "--service-name"]) == "front"  # a truncated line is not an IndexError


def test_delta_counts_new_processes_whole_and_a_reused_pid_as_new() -> None:
    before = cpu.Snapshot({(10, 1.0): ("front", 2.0), (11, 1.0): ("runner-x", 5.0), (12, 1.0): ("other", 1.0)}, 3.0)
    after = cpu.Snapshot(
        {
            (10, 1.0): ("front", 2.5),
            (11, 1.0): ("runner-x", 7.0),
            (12, 9.0): ("other", 0.25),  # pid 12 ended and was reused: all of the new one's CPU is in the window
            (13, 5.0): ("front", 0.5),  # a second front worker started in the window
        },
        4.5,
    )
    used = cpu.delta(before, after)
    assert used == pytest.approx(
        {"front": 1.0, "runner-x": 2.0, "other": 0.25, "load_generator": 1.5, "machine": 0.0, "steal": 0.0}
        | {cpu.MISSED: 0}
    )


def test_a_process_the_first_snapshot_missed_is_left_out_not_counted_whole() -> None:
    """A process that had started well before the first snapshot but is not in it was missed (a failed
    read): all of its lifetime's CPU is not the run's. One started during the run counts whole."""
    before = cpu.Snapshot({(10, 1.0): ("front", 2.0)}, taken=100.0)
    after = cpu.Snapshot({(10, 1.0): ("front", 2.5), (11, 50.0): ("runner-x", 30.0), (12, 100.5): ("front", 0.5)})
    used = cpu.delta(before, after)
    assert used["front"] == pytest.approx(1.0) and "runner-x" not in used and used[cpu.MISSED] == 1
    shares = cpu.per_request(used, "runner-x", 10, 1.0)
    assert shares["ms_per_request"]["runner"] == 0.0 and shares["cores_busy"]["server"] == 1.0  # type: ignore[index]
    assert shares["missed_processes"] == 1 and cpu.MISSED not in shares["seconds"]  # type: ignore[operator]
    # its threads likewise: none of their lifetime's CPU lands in the causes
    before.threads = {(10, 1.0, 10): ("front", cpu.LOOP, 1.0)}
    after.threads = {(10, 1.0, 10): ("front", cpu.LOOP, 1.5), (11, 50.0, 11): ("runner-x", cpu.LOOP, 20.0)}
    assert cpu.by_thread(before, after) == {"front": {cpu.LOOP: 0.5, cpu.DECODE: 0.0, cpu.ENGINE: 0.0}}


def test_per_request_splits_front_runner_rest_client_and_the_rest_of_the_machine() -> None:
    used = {"front": 1.2, "runner-onnx-int8": 3.0, "runner-onnx": 0.1, "other": 0.1, "load_generator": 0.4}
    out = cpu.per_request(used, "runner-onnx-int8", 200, 2.0)
    assert out["ms_per_request"] == {"front": 6.0, "runner": 15.0, "other": 1.0, "load_generator": 2.0}
    assert out["cores_busy"] == {"server": 2.2, "load_generator": 0.2, "rest_of_machine": 0.0, "steal": 0.0}
    assert cpu.per_request(used, "runner-onnx-int8", 0, 2.0) == {}
    # The client charged its in-test CPU; the rest of the machine is what remains.
    used = {"front": 1.0, "runner-x": 2.0, "load_generator": 1.0, "machine": 5.0, "steal": 0.2}
    out = cpu.per_request(used, "runner-x", 100, 2.0, client_s=0.5)
    assert out["ms_per_request"]["load_generator"] == 5.0  # 0.5 s in the test, not the 1.0 s with start-up
    # machine 5.0 − server 3.0 − all of locust's 1.0 = 1.0 s of someone else's work over 2 s
    assert out["cores_busy"] == {"server": 1.5, "load_generator": 0.25, "rest_of_machine": 0.5, "steal": 0.1}

    # with its own test window too: its cores while the requests ran, not diluted by its start-up's wall time
    out = cpu.per_request(used, "runner-x", 100, 2.0, client_s=0.5, client_wall_s=1.25)
    assert out["cores_busy"]["load_generator"] == 0.4 and out["cores_busy"]["server"] == 1.5
    assert cpu.per_request(used, "runner-x", 100, 2.0, client_wall_s=1.25)["cores_busy"]["load_generator"] == 0.5


def test_a_snapshot_reads_a_real_process_tree() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
    try:
        before = cpu.snapshot(os.getpid())
        child.stdin.write(b"\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        child.wait(timeout=30)
        after = cpu.snapshot(os.getpid())
    finally:
        child.kill()
    assert len(before.processes) >= 2  # this process and the child
    used = cpu.delta(before, after)
    # The child burnt its 0.3 s before the first snapshot and then ended: reaped, its CPU moves to this
    # process's children, i.e. the load generator's column, not to a server role.
    assert used["load_generator"] >= 0.25
    assert cpu.snapshot(None).processes == {}  # --url: nothing to read


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="start ticks are read from Linux's /proc")
def test_a_stepped_wall_clock_does_not_make_old_processes_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's create_time is boot time + start ticks, and the boot time moves when the wall clock is
    stepped: every process of the tree then looked new, and its whole lifetime's CPU landed in one run."""
    import psutil._pslinux as pslinux

    before = cpu.snapshot(os.getpid())
    real_boot = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real_boot() + 1.0)  # a clock stepped by one second
    after = cpu.snapshot(os.getpid())
    assert before.processes.keys() == after.processes.keys()
    assert cpu.delta(before, after)[cpu.OTHER] < 0.5  # this process's CPU between the two, not all of it


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="start ticks are read from Linux's /proc")
@pytest.mark.parametrize("name", [b"x) 1 2 (3) R", b"\xff worker"])
def test_a_process_named_with_parentheses_or_bytes_that_are_not_utf8_is_read_and_a_gone_one_is_gone(name) -> None:
    """/proc/<pid>/stat shows the name in parentheses, and a name is bytes (prctl): a reading must parse past
    it, and neither drop the process nor crash on it."""
    import psutil

    code = f"open('/proc/self/comm', 'wb').write({name!r}); print('ok', flush=True); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ok"  # type: ignore[union-attr]
        proc = psutil.Process(child.pid)
        assert os.fsencode(proc.name()) == name
        # psutil's own start, before it adds the boot time (seconds since boot)
        assert cpu._started(proc) == pytest.approx(proc._proc.create_time(monotonic=True))
        assert cpu._started(proc) < cpu._now()  # one clock: a snapshot's time compares with starts
        assert [pid for pid, _ in cpu.snapshot(child.pid).processes] == [child.pid]
        assert child.pid in [tid for tid, _, _ in cpu._threads(child.pid)]  # its main thread, named so
    finally:
        child.kill()
        child.wait()
    with pytest.raises(psutil.NoSuchProcess):  # no fallback to the epoch-based time, which moves
        cpu._started(proc)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are read from Linux's /proc")
def test_each_thread_is_read_with_its_kind() -> None:
    """The main thread is the event loop; a thread named as the decode pool names its threads is decode."""
    import threading
    import time

    from fastinfer.serving.cpu import DECODE_THREAD, name_os_thread

    def decode_burn() -> None:
        name_os_thread(DECODE_THREAD)
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass
        done.wait()

    done = threading.Event()
    worker = threading.Thread(target=decode_burn)
    worker.start()
    try:
        time.sleep(0.05)
        while worker.is_alive() and not any(
            kind == cpu.DECODE and seconds >= 0.25 for _, kind, seconds in cpu._threads(os.getpid())
        ):
            time.sleep(0.05)
        kinds = {tid: kind for tid, kind, _ in cpu._threads(os.getpid())}
    finally:
        done.set()
        worker.join()
    assert kinds[os.getpid()] == cpu.LOOP and kinds[worker.native_id] == cpu.DECODE


def test_thread_deltas_by_role_and_kind() -> None:
    before = cpu.Snapshot(threads={(10, 1.0, 10): ("front", cpu.LOOP, 1.0), (10, 1.0, 11): ("front", cpu.DECODE, 2.0)})
    after = cpu.Snapshot(
        threads={
            (10, 1.0, 10): ("front", cpu.LOOP, 1.5),
            (10, 1.0, 11): ("front", cpu.DECODE, 2.25),
            (11, 1.0, 12): ("runner-x", cpu.ENGINE, 3.0),  # a thread (or process) started in the window: whole
        }
    )
    used = cpu.by_thread(before, after)
    assert used["front"] == {cpu.LOOP: 0.5, cpu.DECODE: 0.25, cpu.ENGINE: 0.0}
    assert used["runner-x"][cpu.ENGINE] == 3.0
    out = cpu.per_request({"front": 0.75, "runner-x": 3.0}, "runner-x", 100, 1.0, threads=used)
    assert out["threads_ms_per_request"]["front"] == {cpu.LOOP: 5.0, cpu.DECODE: 2.5, cpu.ENGINE: 0.0}
    assert out["threads_ms_per_request"]["runner"][cpu.ENGINE] == 30.0
