"""Each assumption fastinfer/compat/prometheus.py makes about prometheus_client (its docstring numbers them),
checked against the installed prometheus_client: an upgrade that breaks one fails here, naming it."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import prometheus_client.values
import pytest

from fastinfer.compat.prometheus import HEADER, INITIAL_MMAP_SIZE, MmapedDict, use_mmaped_dict


def test_1_each_metric_file_is_opened_by_the_class_values_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus_client.values, "MmapedDict", prometheus_client.values.MmapedDict)  # restored
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    opened: list[str] = []

    class Recording(MmapedDict):
        def __init__(self, filename: str, read_mode: bool = False) -> None:
            opened.append(os.path.basename(filename))
            super().__init__(filename, read_mode)

    value_class = prometheus_client.values.MultiProcessValue(lambda: 4242)
    use_mmaped_dict(Recording)
    value_class("counter", "requests", "requests_total", [], [], "Requests").inc(1)
    assert opened == ["counter_4242.db"], (
        "assumption 1: in multiprocess mode each metric file is opened as "
        "prometheus_client.values.MmapedDict(filename), looked up when the file is opened"
    )


def test_2_an_open_file_keeps_its_state_in_these_attributes(tmp_path: Path) -> None:
    path = str(tmp_path / "counter_1.db")
    d = MmapedDict(path)
    state = {name: getattr(d, name, None) for name in ("_f", "_m", "_capacity", "_used", "_positions", "_fname")}
    assert isinstance(state["_m"], mmap.mmap) and state["_f"] is not None and state["_fname"] == path, (
        "assumption 2: MmapedDict keeps its file in _f, its map in _m and its path in _fname"
    )
    assert state["_capacity"] == INITIAL_MMAP_SIZE == os.path.getsize(path) == len(state["_m"]), (
        "assumption 2: a new file and its map are INITIAL_MMAP_SIZE bytes, held in _capacity"
    )
    assert (state["_used"], state["_positions"]) == (HEADER, {}), (
        "assumption 2: _used counts the bytes in use and _positions maps each key to its value's offset"
    )
    d.write_value("key", 1.5, 0.0)
    assert struct.unpack_from("dd", d._m, d._positions["key"]) == (1.5, 0.0)
    d.close()


def test_3_a_new_key_is_added_by_init_value_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = MmapedDict(str(tmp_path / "counter_1.db"))
    for key in ("k", "a-longer-key", "é" * 9):
        used = d._used
        d._init_value(key)
        assert d._used - used <= 4 + len(key.encode()) + 8 + 16 and key in d._positions, (
            "assumption 3: _init_value(key) adds an entry of at most 4 + len(key) + 8 + 16 bytes"
        )
    assert d._capacity == os.path.getsize(d._fname) == INITIAL_MMAP_SIZE, (
        "assumption 3: _init_value grows the file only when the entry does not fit in _capacity"
    )
    d._f.close()
    d._f = None
    d.close()  # a map without a file (the guard's, in memory) is left alone
    assert d._m is not None and not d._m.closed, "assumption 3: close() leaves the map alone when _f is None"

    monkeypatch.setattr(prometheus_client.values, "MmapedDict", prometheus_client.values.MmapedDict)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    value_class = prometheus_client.values.MultiProcessValue(lambda: 4243)
    cells = (cell.cell_contents for cell in value_class.inc.__closure__)
    lock = dict(zip(value_class.inc.__code__.co_freevars, cells, strict=True))
    held: list[bool] = []

    class Watching(MmapedDict):
        def __getattribute__(self, name: str) -> Any:
            if name in ("_init_value", "read_value", "write_value"):
                held.append(lock["lock"].locked())
            return super().__getattribute__(name)

    use_mmaped_dict(Watching)
    value_class("counter", "requests", "requests_total", [], [], "Requests").inc(1)
    assert held and all(held), "assumption 3: prometheus_client calls MmapedDict's methods under its lock"


def test_4_a_file_begins_with_its_used_length_and_padding(tmp_path: Path) -> None:
    d = MmapedDict(str(tmp_path / "counter_1.db"))
    d.write_value("key", 2.0, 0.0)
    d.close()
    data = (tmp_path / "counter_1.db").read_bytes()
    used = struct.unpack_from("i", data, 0)[0]
    assert used > HEADER and struct.unpack_from("i", data, HEADER)[0] == len("key"), (
        f"assumption 4: a metric file begins with its used length (4 bytes) and padding: {HEADER} bytes, then entries"
    )
    assert [k for k, *_ in MmapedDict.read_all_values_from_file(str(tmp_path / "counter_1.db"))] == ["key"]
