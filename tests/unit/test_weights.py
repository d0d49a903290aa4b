"""The weights story: auto falls back to a labelled, seeded random init when ImageNet cannot be had."""

from __future__ import annotations

import pytest
import torch

from build_models import weights


def test_auto_falls_back_to_seeded_random_init(monkeypatch, caplog) -> None:
    def offline() -> None:
        raise OSError("no network")

    monkeypatch.setattr(weights, "_imagenet", offline)
    w = weights.load_weights("auto")
    assert w.kind == "random-init"
    assert "RANDOM INIT" in caplog.text
    assert w.source_hash == weights.load_weights("random").source_hash  # seeded: reproducible


def test_imagenet_without_fallback_fails_loudly(monkeypatch) -> None:
    monkeypatch.setattr(weights, "_imagenet", lambda: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(RuntimeError, match="ImageNet weights could not be loaded"):
        weights.load_weights("imagenet")


def test_local_state_dict_file(tmp_path) -> None:
    state = weights.load_weights("random").state_dict
    path = tmp_path / "resnet50.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    w = weights.load_weights(str(path))
    assert w.kind == "file"
    assert w.source_hash == weights.state_hash(state)


def test_unknown_choice_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        weights.load_weights("no-such-file.pth")
