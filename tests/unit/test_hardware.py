"""Device and execution-provider choice, checked with stand-ins for macOS and CUDA machines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastinfer.common import hardware

ALL = ["CoreMLExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("macos", "cuda", "available", "cpu_only", "chosen"),
    [
        (False, False, ALL, False, ["CPUExecutionProvider"]),  # Linux without a GPU
        (False, True, ALL, False, ["CUDAExecutionProvider", "CPUExecutionProvider"]),  # Linux with one: CUDA
        (True, False, ALL, False, ["CoreMLExecutionProvider", "CPUExecutionProvider"]),  # macOS: CoreML
        (True, True, ALL, True, ["CPUExecutionProvider"]),  # cpu_only ignores the accelerators
        (True, True, ["CPUExecutionProvider"], False, ["CPUExecutionProvider"]),  # one missing from the wheel
    ],
    ids=["linux", "linux with a gpu", "macos", "cpu only", "not in the wheel"],
)
def test_the_execution_providers_chosen(monkeypatch, macos, cuda, available, cpu_only, chosen) -> None:
    monkeypatch.setattr(hardware, "is_macos", lambda: macos)
    monkeypatch.setattr(hardware, "_cuda_device_present", lambda: cuda)
    assert hardware.onnx_providers(available, cpu_only=cpu_only) == chosen


def test_threads_split_the_cores_between_workers(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "cpu_count", lambda: 8)
    assert hardware.intra_op_threads(1) == 8
    assert hardware.intra_op_threads(3) == 2
    assert hardware.intra_op_threads(16) == 1
    assert hardware.intra_op_threads(2, override=5) == 5


def test_the_probe_says_what_amx_and_bf16_mean_for_the_backends(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "_cpu_linux", lambda: ("Xeon", {"avx512f", "avx512_vnni", "amx_int8", "amx_bf16"}))
    monkeypatch.setattr(hardware.platform, "system", lambda: "Linux")
    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    info = hardware.probe()
    assert {"amx_int8", "amx_bf16", "avx512_vnni"} <= set(info["isa"])
    assert "openvino-int8" in info["isa_meaning"]["amx_int8"] and "BF16" in info["isa_meaning"]["amx_bf16"]


# ---- the CPU budget: affinity capped by a container's cgroup CPU quota, read from files in tmp_path ----

V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def machine(tmp_path: Path, proc_cgroup: str, files: dict[str, str], mountinfo: str | None = V2_MOUNTINFO) -> Path:
    """A root folder with /proc/self/cgroup, /proc/self/mountinfo and cgroup files under /sys/fs/cgroup."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(proc_cgroup)
    if mountinfo is not None:
        (tmp_path / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        (tmp_path / "sys/fs/cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys/fs/cgroup" / path).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("cpu_max", "cores"), [("400000 100000\n", 4), ("150000 100000\n", 2), ("50000 100000\n", 1), ("1 100000", 1)]
)
def test_a_v2_quota_caps_the_cores_rounded_up(tmp_path, cpu_max: str, cores: int) -> None:
    root = machine(tmp_path, "0::/\n", {"cpu.max": cpu_max})
    budget = hardware.probe_cpu_budget(root, affinity=64)
    assert (budget.count, budget.affinity) == (cores, 64)
    assert budget.quota == int(cpu_max.split()[0]) / 100000
    assert budget.source == f"cgroup v2 cpu.max {cpu_max.split()[0]}/100000 → {cores} (CPU affinity 64)"


def test_the_tightest_limit_on_the_way_up_binds(tmp_path) -> None:
    # A Kubernetes pod's limit sits on the pod's cgroup; the container's own cgroup below says max.
    root = machine(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        {
            "cpu.max": "max 100000\n",  # the root cgroup has no cpu.max in the kernel, but must not matter
            "kubepods/cpu.max": "800000 100000\n",
            "kubepods/pod1/cpu.max": "300000 100000\n",
            "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        },
    )
    budget = hardware.probe_cpu_budget(root, affinity=64)
    assert budget.count == 3 and "300000/100000 in /kubepods/pod1 →" in budget.source
    # A deeper, tighter limit wins over a looser parent; a sibling's does not count.
    (root / "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max").write_text("200000 100000\n")
    (root / "sys/fs/cgroup/kubepods/pod2").mkdir()
    (root / "sys/fs/cgroup/kubepods/pod2/cpu.max").write_text("100000 100000\n")
    assert hardware.probe_cpu_budget(root, affinity=64).count == 2


@pytest.mark.parametrize(
    ("cgroup", "files", "mountinfo", "cores"),
    [
        # 5 CPUs above, 6 below, in other periods: the parent binds
        ("0::/a/b\n", {"a/cpu.max": "250000 50000\n", "a/b/cpu.max": "600000 100000\n"}, V2_MOUNTINFO, 5),
        # cgroup2 mounted elsewhere: not the 1 of a cpu.max outside the mount mountinfo names
        (
            "0::/svc\n",
            {"unified/svc/cpu.max": "200000 100000\n", "svc/cpu.max": "1 100000"},
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
            2,
        ),
        # a monitoring container with the host's cgroups at /host/sys/fs/cgroup, listed first: not ours
        (
            "0::/\n",
            {"cpu.max": "200000 100000\n"},
            "40 23 0:26 / /host/sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
            "41 23 0:27 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
            2,
        ),
    ],
    ids=["another period", "mounted elsewhere", "a host hierarchy listed first"],
)
def test_the_quota_is_read_where_the_mounts_say(tmp_path, cgroup: str, files: dict, mountinfo: str, cores: int) -> None:
    assert hardware.probe_cpu_budget(machine(tmp_path, cgroup, files, mountinfo), affinity=64).count == cores


def test_the_cgroup_mounted_as_the_namespace_root_is_found_through_mountinfo(tmp_path) -> None:
    # No cgroup namespace: /proc/self/cgroup names the host path, the container sees its own cgroup
    # mounted at /sys/fs/cgroup (mount root /docker/abc).
    mountinfo = "30 23 0:26 /docker/abc /sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw\n"
    root = machine(tmp_path, "0::/docker/abc\n", {"cpu.max": "200000 100000\n"}, mountinfo)
    assert hardware.probe_cpu_budget(root, affinity=64).count == 2
    # The process in a sub-cgroup of the container's: found at /sys/fs/cgroup/sub, not .../docker/abc/sub.
    (root / "proc/self/cgroup").write_text("0::/docker/abc/sub\n")
    (root / "sys/fs/cgroup/sub").mkdir()
    (root / "sys/fs/cgroup/sub/cpu.max").write_text("100000 100000\n")
    budget = hardware.probe_cpu_budget(root, affinity=64)
    assert budget.count == 1 and " in /docker/abc/sub →" in budget.source


def test_a_smaller_affinity_wins_over_the_quota(tmp_path) -> None:
    root = machine(tmp_path, "0::/\n", {"cpu.max": "400000 100000\n"})
    budget = hardware.probe_cpu_budget(root, affinity=2)
    assert (budget.count, budget.affinity, budget.quota) == (2, 2, 4.0)
    assert budget.source == "CPU affinity (2); cgroup v2 cpu.max 400000/100000 allows 4"


# cgroup v1 is not read: a v1 host's quota leaves the affinity alone.
V1_QUOTA = {"cpu,cpuacct/cpu.cfs_quota_us": "100000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
V1_MOUNTINFO = "33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
GARBLED = ["", "400000", "abc 100000", "400000 abc", "400000 0", "0 100000", "-5 100000", "400000 100000 7", "max"]


@pytest.mark.parametrize(
    ("cgroup", "files", "mountinfo"),
    [
        ("0::/\n", {"cpu.max": "max 100000\n"}, V2_MOUNTINFO),  # v2's "max"
        ("4:cpu,cpuacct:/\n", V1_QUOTA, V1_MOUNTINFO),  # v1: not read
        *(("0::/\n", {"cpu.max": garbled}, V2_MOUNTINFO) for garbled in GARBLED),
    ],
    ids=["v2 max", "v1 ignored", *(f"garbled {g!r}" for g in GARBLED)],
)
def test_no_quota_or_a_garbled_one_is_no_limit(tmp_path, cgroup: str, files: dict[str, str], mountinfo: str) -> None:
    budget = hardware.probe_cpu_budget(machine(tmp_path, cgroup, files, mountinfo), affinity=16)
    assert budget == hardware.CpuBudget(16, 16, None, "CPU affinity (16), no cgroup CPU limit")


def test_garbled_or_missing_files_are_no_limit_never_an_error(tmp_path) -> None:
    root = machine(tmp_path, "garbage\n::\n1:cpu\n", {"cpu.max": "100000 100000"})  # no cgroup line is usable
    assert hardware.probe_cpu_budget(root, affinity=8).count == 8
    (root / "proc/self/cgroup").write_bytes(b"0::/\xff\xfe\n")  # not UTF-8
    assert hardware.probe_cpu_budget(root, affinity=8).count == 8
    (root / "proc/self/cgroup").write_text("0::/\n")
    (root / "proc/self/mountinfo").write_text("nonsense - - -\n30 23 0:26\n")  # garbled: the fallback folder
    assert hardware.probe_cpu_budget(root, affinity=8).count == 1
    (root / "sys/fs/cgroup/cpu.max").write_bytes(b"\xff\xfe 100000")
    assert hardware.probe_cpu_budget(root, affinity=8).count == 8
    # A garbled file in the process's cgroup takes nothing from its parent's limit.
    (root / "proc/self/cgroup").write_text("0::/a/b\n")
    (root / "sys/fs/cgroup/a/b").mkdir(parents=True)
    (root / "sys/fs/cgroup/a/cpu.max").write_text("200000 100000\n")
    (root / "sys/fs/cgroup/a/b/cpu.max").write_bytes(b"\xff\xfe\x00 100000")
    assert hardware.probe_cpu_budget(root, affinity=8).count == 2
    assert hardware.probe_cpu_budget(tmp_path / "nothing", affinity=8).count == 8  # no /proc, no /sys: macOS
    assert hardware.probe_cpu_budget(tmp_path / "nothing", affinity=0).count == 1  # at least 1


def test_without_sched_getaffinity_the_os_core_count_stands(monkeypatch, tmp_path) -> None:
    monkeypatch.delattr(hardware.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: 10)
    budget = hardware.probe_cpu_budget(tmp_path)
    assert budget == hardware.CpuBudget(10, 10, None, "os.cpu_count() (10), no cgroup CPU limit")


def test_cpu_count_threads_and_the_probe_use_the_budget_probed_once(monkeypatch, tmp_path) -> None:
    root = machine(tmp_path, "0::/\n", {"cpu.max": "400000 100000\n"})
    calls, real = [], hardware.probe_cpu_budget

    def probe_here() -> hardware.CpuBudget:
        calls.append(1)
        return real(root, affinity=64)

    monkeypatch.setattr(hardware, "probe_cpu_budget", probe_here)
    hardware.cpu_budget.cache_clear()
    try:
        assert hardware.cpu_count() == 4 and hardware.intra_op_threads(2) == 2
        info = hardware.probe()
        assert info["cores"] == 4 and info["cores_source"] == "cgroup v2 cpu.max 400000/100000 → 4 (CPU affinity 64)"
        assert len(calls) == 1  # cached: the threads are sized often
    finally:
        hardware.cpu_budget.cache_clear()
    assert hardware.cpu_count() == hardware.probe_cpu_budget().count  # this machine again


def test_backends_show_where_the_core_count_came_from(monkeypatch) -> None:
    from fastinfer.catalog.config import Settings
    from fastinfer.front import inventory

    budget = hardware.CpuBudget(3, 64, 2.5, "cgroup v2 cpu.max 250000/100000 → 3 (CPU affinity 64)")
    monkeypatch.setattr(hardware, "cpu_budget", lambda: budget)
    answer = inventory.backends({}, {}, {}, {}, Settings(), hardware.probe()).model_dump(mode="json")
    assert answer["hardware"]["cores"] == 3 and answer["hardware"]["cores_source"] == budget.source
