"""A server's pinned model versions (fastinfer.catalog.store): what every process of one server loads and
names, whatever ``:latest`` becomes meanwhile, and what a rebuild must keep while it runs."""

from __future__ import annotations

import json
import os

import pytest

from fastinfer.catalog import holdings, store
from fastinfer.catalog.backends import unavailable_reason


@pytest.fixture()
def pinned(built_models, monkeypatch) -> dict[str, str]:
    pins, _ = holdings.pin(["resnet50-onnx", "resnet50-never-built"], "resnet50")
    monkeypatch.setenv(store.PINS_ENV, json.dumps(pins))
    return pins


def test_a_server_serves_its_pins_only(pinned, monkeypatch) -> None:
    assert pinned == {"resnet50-onnx": str(store.find("onnx").tag)}  # latest; never built: not pinned
    assert str(holdings.serving("onnx").tag) == pinned["resnet50-onnx"]
    assert holdings.serving("onnx-int8") is None  # not pinned: not stored when the server started
    reason = unavailable_reason("onnx-int8")
    assert reason is not None and "when this server started" in reason
    monkeypatch.setenv(store.PINS_ENV, json.dumps({"resnet50-onnx": "resnet50-onnx:gone0000version"}))
    with pytest.raises(store.PinnedModelGone, match=r"resnet50-onnx:gone0000version.*no longer in the model store"):
        holdings.serving("onnx")
    assert holdings.serving_or_none("onnx") is None
    assert "resnet50-onnx:gone0000version" in (unavailable_reason("onnx") or "")


def test_outside_a_server_latest_serves(built_models, monkeypatch) -> None:
    monkeypatch.delenv(store.PINS_ENV, raising=False)
    assert store.pins() is None
    assert str(holdings.serving("onnx-int8").tag) == str(store.find("onnx-int8").tag)


@pytest.mark.parametrize("raw", ["{bad", '"x"', '{"resnet50-onnx": 5}', "[]"])
def test_a_malformed_pin_variable_is_refused_saying_what_it_is(raw, monkeypatch) -> None:
    monkeypatch.setenv(store.PINS_ENV, raw)
    with pytest.raises(ValueError, match=r"set by `bentoml serve`.*unset it"):
        store.pins()


def test_a_stored_version_is_read_once_until_its_record_changes(tmp_path, monkeypatch) -> None:
    """store.get parses a version's model.yaml once per process (BentoML parses it on every call), and again
    once it is rewritten; ``latest`` is followed as it moves."""
    import bentoml

    from tests.conftest import model_store_at

    with model_store_at(tmp_path):
        with bentoml.models.create("cached-onnx", labels={"n": "1"}) as first:
            pass
        parsed = []
        real = bentoml.models.get
        monkeypatch.setattr(bentoml.models, "get", lambda tag: parsed.append(str(tag)) or real(tag))
        assert store.get("cached-onnx:latest") is store.get("cached-onnx") is store.get(str(first.tag))
        assert parsed == [str(first.tag)]
        record = tmp_path / "models" / "cached-onnx" / first.tag.version / "model.yaml"
        record.write_text(record.read_text().replace("n: '1'", "n: '20'"))  # rewritten in place
        assert store.get("cached-onnx:latest").info.labels == {"n": "20"} and len(parsed) == 2
        same = record.stat()  # same size, inode and mtime (cp -p, rsync --inplace -a): only its ctime moves
        record.write_text(record.read_text().replace("n: '20'", "n: '21'"))
        os.utime(record, ns=(same.st_atime_ns, same.st_mtime_ns))
        assert store.get("cached-onnx:latest").info.labels == {"n": "21"} and len(parsed) == 3
        kept = record.read_text()
        record.write_text("{ garbled")
        with pytest.raises(Exception):  # noqa: B017 (whatever BentoML raises for a bad record)
            store.get("cached-onnx:latest")
        record.write_text(kept)
        with bentoml.models.create("cached-onnx", labels={"n": "3"}) as second:
            pass
        assert store.get("cached-onnx:latest").tag == second.tag
        # Tags BentoML refuses stay refused once a version is read, even those naming its folder another way.
        folder = record.parent.parent
        for odd in (f"./cached-onnx:{second.tag.version}", f"cached-onnx:{second.tag.version}/",
                    f"another-onnx:{folder / second.tag.version}"):  # fmt: skip
            with pytest.raises(bentoml.exceptions.BentoMLException, match="Invalid Tag"):
                store.get(odd)
        with bentoml.models.create("another-onnx") as _:
            pass
        (tmp_path / "models" / "another-onnx" / "latest").write_text(str(folder / second.tag.version))
        # A `latest` naming another model's folder: whatever BentoML answers (it follows it), never from the cache.
        assert store.get("another-onnx:latest").tag == real("another-onnx:latest").tag == second.tag
        with pytest.raises(bentoml.exceptions.NotFound):
            store.get("never-built:latest")
