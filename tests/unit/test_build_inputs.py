"""What a build is given, refused in one line before the first export, and what it records, valid text: nothing
here builds more than one PyTorch model."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from build_models import build
from build_models.context import BuildContext, directory_images
from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure import photos
from tests.conftest import CLASSES, three_class_state
from tests.settings import settings_with
from tests.unit.test_build_family import SMALL, one_line_refusal, said_until_the_first_step

pytestmark = pytest.mark.heavy  # model builds


def odd(name: str) -> str:
    """``name`` with a byte that is not UTF-8 (0xff), as os.fsdecode gives it: U+DCFF."""
    return os.fsdecode(name.encode().replace(b"?", b"\xff"))


def texts_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in texts_in(k) + texts_in(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in texts_in(v)]
    return []


def not_text(value: Any) -> list[str]:
    """The strings in ``value`` that cannot be sent: UTF-8 refuses lone surrogates."""
    bad = []
    for text in texts_in(value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(text)
    return bad


def photo(path: Path, name: str = "chelsea.png") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(photos.photo_jpeg(name, width=320))
    return path


def huge_png_header(width: int = 30_000, height: int = 30_000) -> bytes:
    """A PNG whose header says ``width``×``height`` (1-bit grey) and whose pixels are cut short: a decoder that
    looks only at the header refuses it unharmed; one that decodes it fails (or, whole, needs 5 GB)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 4000))


# --- 2: everything a build records is valid text ------------------------------------------------------------


def test_a_calibration_folder_not_in_utf8_is_recorded_as_text(tmp_path) -> None:
    ctx = BuildContext(None, None, None, tmp_path / odd("cal?"))  # type: ignore[arg-type]
    assert not_text(ctx.calibration_source) == [] and ctx.calibration_source.endswith("cal\\xff")


def test_a_build_from_files_named_in_no_encoding_stores_only_valid_text(weights_file, labels_file, tmp_path) -> None:
    """Weights, eval and calibration folders whose names hold a byte that is not UTF-8: the stored model's
    labels and metadata are all text a server can send (a surrogate there would make /backends, /docs.json
    and /metrics answer 500)."""
    weights = tmp_path / odd("w?.pth")
    weights.symlink_to(weights_file)
    eval_dir, calibration = tmp_path / odd("eval?"), tmp_path / odd("cal?")
    for label, name in zip(CLASSES, ("chelsea.png", "coffee.png", "astronaut.png"), strict=True):
        photo(eval_dir / label / odd("p?.jpg"), name)
    photo(calibration / odd("c?.jpg"))
    said: list[str] = []
    build(
        str(weights),
        only=["pytorch"],
        family="bytes",
        labels_path=labels_file,
        eval_dir=eval_dir,
        calibration_dir=calibration,
        accuracy_json=tmp_path / "accuracy.json",
        progress=said.append,
        preprocess=SMALL,  # the names are tested, not the size: every photo through PyTorch at 64 px
    )
    info = store.find("pytorch", family_name="bytes").info
    assert not_text(info.labels) == [] and not_text(info.metadata) == []
    assert "w\\xff.pth" in info.metadata["weights_description"]
    assert info.metadata["accuracy"]["eval_dir"].endswith("eval\\xff")
    assert not_text(said) == []  # printed on a strict UTF-8 stdout, it would crash the build


# --- 3: weights that compute NaN or infinity --------------------------------------------------------------


@pytest.mark.parametrize(
    "fc, says",
    [
        (lambda fc: torch.full_like(fc, 1e37), "PyTorch computes NaN or infinite logits on 8 of 8 real photos"),
        (lambda fc: fc * 1e30, "beyond FP16's range"),
    ],
    ids=["overflow", "huge but finite"],
)
def test_weights_whose_logits_overflow_are_refused_before_anything_is_stored(labels_file, tmp_path, capsys, fc, says):
    """Finite weights pass the finite-values check; their logits (infinite, or near 1e28) must be refused before
    pytorch is stored (not by onnx's absolute tolerance, after)."""
    path = tmp_path / "overflow.pth"
    state = three_class_state()
    torch.save({**state, "fc.weight": fc(state["fc.weight"])}, path)
    argv = ["--weights", str(path), "--labels", str(labels_file), "--name", "refused", "--only", "pytorch,onnx"]
    said = one_line_refusal([*argv, "--resize", "64", "--crop", "64"], capsys)  # SMALL: photos of 64 px
    assert says in said and "Nothing stored" in said
    assert store.versions("refused-pytorch") == [] and store.versions("refused-onnx") == []


# --- 6: inputs that got a traceback ----------------------------------------------------------------------


def test_an_unknown_backend_is_refused_in_one_line_before_anything_else(capsys) -> None:
    from build_models.__main__ import main

    assert main(["--weights", "random", "--name", "refused", "--only", "pytorch,foo"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--only foo: no such backend; choose from pytorch, onnx" in err


@pytest.mark.parametrize(
    "folder, says",
    [("absent", "absent: no such folder"), ("cal", "none of its 1 image file(s) can be used (first: ")],
)
def test_a_calibration_folder_without_images_is_refused_before_anything_is_stored(tmp_path, capsys, folder, says):
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "notes.png").write_text("not an image")
    argv = ["--weights", "random", "--name", "refused", "--only", "pytorch,onnx,onnx-int8"]
    said = one_line_refusal([*argv, "--calibration-dir", str(tmp_path / folder)], capsys)
    assert says in said and (said.endswith(says) if folder == "absent" else "notes.png: " in said), said
    assert store.versions("refused-pytorch") == []


def test_a_non_image_in_the_calibration_folder_is_skipped_and_named(tmp_path) -> None:
    """As in the eval folder: a file that is no image is left out and named; the others calibrate."""
    folder = tmp_path / "cal"
    photo(folder / "good.jpg")
    (folder / "notes.png").write_text("not an image")
    said = said_until_the_first_step("random", only=["onnx-int8"], family="skips", calibration_dir=folder)
    warned = [line for line in said if line.startswith("WARNING: calibration: skipped ")]
    assert len(warned) == 1 and "notes.png: " in warned[0] and "not an image in a format" in warned[0], said
    assert f"calibration: 1 images in {folder}" in said


# --- 7: the calibration folder's pixel limit is the server's ----------------------------------------------


def test_calibration_decodes_no_image_over_the_servers_pixel_limit(tmp_path) -> None:
    """A 30000×30000 PNG (900 MP) is refused from its header at FASTINFER_MAX_PIXELS (50 MP), never decoded."""
    photo(tmp_path / "good.jpg")
    (tmp_path / "huge.png").write_bytes(huge_png_header())
    found = directory_images(tmp_path, PreprocessSpec())
    assert len(found.images) == 1
    ((path, why),) = found.skipped
    assert path.endswith("huge.png") and "900,000,000 pixels" in why and "50,000,000 (FASTINFER_MAX_PIXELS)" in why, why


def test_calibration_follows_the_servers_pixel_setting(tmp_path, monkeypatch) -> None:
    photo(tmp_path / "small.jpg", "coffee.png").parent.joinpath("big.png").write_bytes(
        photos.encode(photos.load("chelsea.png"), "PNG")  # 451×300: 135,300 pixels
    )
    settings_with(monkeypatch, FASTINFER_MAX_PIXELS="120000")  # small.jpg: 320×213 = 68,160
    said = said_until_the_first_step("random", only=["onnx-int8"], family="skips", calibration_dir=tmp_path)
    assert f"calibration: 1 images in {tmp_path}" in said, said
    (warned,) = [line for line in said if line.startswith("WARNING: calibration: skipped ")]
    assert "big.png: The image holds a picture of 135,300 pixels; the limit is 120,000" in warned, warned


def test_a_calibration_file_over_the_servers_byte_limit_is_skipped_unread(tmp_path, monkeypatch) -> None:
    """A 3 GB file named .png is not read whole to find that it is not an image."""
    folder = tmp_path / "cal"
    photo(folder / "cat.png")
    with (folder / "huge.png").open("wb") as f:
        f.truncate(50_000_000)  # sparse: no disk used
    settings_with(monkeypatch, FASTINFER_MAX_BYTES="10000000")
    found = directory_images(folder, PreprocessSpec())
    assert len(found.images) == 1
    ((name, why),) = found.skipped
    assert name.endswith("huge.png") and "larger than FASTINFER_MAX_BYTES (10,000,000 bytes); it was not read" in why
