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


def test_unknown_choice_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        weights.load_weights("no-such-file.pth")


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """A private torch.hub cache: nothing a test writes here can reach a real build."""
    monkeypatch.setattr(torch.hub, "_hub_dir", None)  # restored after the test
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    checkpoints = tmp_path / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    assert weights.hub_file(weights.imagenet_url()).parent == checkpoints
    return checkpoints


@pytest.fixture
def not_imagenet(hub_dir):
    """A random-init state_dict saved under torchvision's own file name for IMAGENET1K_V2."""
    path = hub_dir / "resnet50-11ad3fa6.pth"
    assert weights.hub_file(weights.imagenet_url()) == path
    torch.save(weights.load_weights("random").state_dict, path)
    return path


def no_download(*args, **kwargs):
    raise AssertionError("must not reach torch.hub with a cached file that fails its hash")


def test_a_cached_file_that_fails_its_hash_is_refused(not_imagenet, monkeypatch) -> None:
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    actual = weights.file_sha256(not_imagenet)[:8]
    with pytest.raises(RuntimeError, match="ImageNet weights could not be loaded") as err:
        weights.load_weights("imagenet")
    message = str(err.value)
    assert str(not_imagenet) in message and "11ad3fa6" in message and actual in message


def test_auto_falls_back_and_says_why_when_the_hash_fails(not_imagenet, monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    w = weights.load_weights("auto")
    assert w.kind == "random-init"
    assert "RANDOM INIT" in caplog.text and str(not_imagenet) in caplog.text
    # The reason travels into the store's metadata with the description.
    assert "WeightsHashMismatch" in w.description and str(not_imagenet) in w.description
    assert "11ad3fa6" in w.description


def test_a_cached_file_that_matches_its_hash_is_imagenet(hub_dir, monkeypatch) -> None:
    state = weights.load_weights("random").state_dict
    staged = hub_dir / "staged.pth"
    torch.save(state, staged)
    path = hub_dir / f"resnet50-{weights.file_sha256(staged)[:10]}.pth"
    staged.rename(path)
    monkeypatch.setattr(weights, "imagenet_url", lambda: f"https://download.pytorch.org/models/{path.name}")
    w = weights.load_weights("imagenet")
    assert w.kind == "imagenet"
    assert w.source_hash == weights.state_hash(state)


def test_an_absent_file_is_downloaded_with_its_hash_checked(hub_dir, monkeypatch) -> None:
    calls = []

    def download(url, **kwargs):
        calls.append((url, kwargs))
        raise OSError("offline")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", download)
    assert weights.load_weights("auto").kind == "random-init"
    assert calls == [(weights.imagenet_url(), {"progress": False, "check_hash": True})]


def test_weights_saved_requiring_grad_run_and_leave_no_tensor_of_the_callers(tmp_path) -> None:
    """torch_model.resnet50 copies each tensor out of autograd into a storage of its own, as load_state_dict did:
    BatchNorm's running stats requiring grad failed every forward outside inference_mode (the ONNX export)."""
    from torchvision.models import resnet50 as torchvision_resnet50

    from fastinfer.engines.torch_model import resnet50

    state = torchvision_resnet50(weights=None, num_classes=3).state_dict()
    for tensor in state.values():
        if tensor.is_floating_point():
            tensor.requires_grad_(True)
    torch.save(state, tmp_path / "w.pth")
    loaded = torch.load(tmp_path / "w.pth", weights_only=True)
    model = resnet50(loaded)
    assert not any(t.requires_grad or t.grad_fn is not None for t in model.buffers())
    pointers = {t.untyped_storage().data_ptr() for t in loaded.values()}
    assert not pointers & {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    with torch.no_grad():
        assert model(torch.zeros(1, 64, 64, 3, dtype=torch.uint8)).shape == (1, 3)
