"""The libjpeg-turbo decode path (simplejpeg) gives Pillow's pixels, and Pillow still decides every
JPEG it does not take: the pixel gate of fastinfer/serving/preprocess.py's fast path."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common.errors import ImageTooLarge, InvalidImage
from fastinfer.measure import photos
from fastinfer.serving import preprocess
from fastinfer.serving.preprocess import prepare
from tests import images

SPEC = PreprocessSpec(resize_size=232, crop_size=224)
simplejpeg = pytest.importorskip("simplejpeg")


def encode(img: Image.Image, **options: object) -> bytes:
    return images.encode(img, "JPEG", **options)


def oriented(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photos.load("coffee.png"), quality=90, exif=exif.tobytes())


def variants() -> dict[str, bytes]:
    """Every JPEG the fast path takes, in the shapes clients send: each sample photo whole, as a 1.5 MP
    and a phone-size rescale (1/2, 1/4, 1/8 DCT scales), greyscale, progressive, each chroma
    subsampling, odd sizes, and every EXIF orientation."""
    out: dict[str, bytes] = {}
    for name in photos.PHOTOS:
        img = photos.load(name)
        stem = name.rsplit(".", 1)[0]
        out[f"{stem} whole"] = encode(img, quality=90)
        out[f"{stem} 1.5mp"] = photos.photo_jpeg(name, width=1500)
    out["phone 3520"] = photos.photo_jpeg("motorcycle_left.png", width=3520, quality=92)
    coffee = photos.load("coffee.png")
    out["greyscale"] = encode(coffee.convert("L"), quality=90)
    out["progressive"] = encode(coffee.resize((1201, 801)), quality=85, progressive=True)
    for subsampling in (0, 1, 2):  # 4:4:4, 4:2:2, 4:2:0
        out[f"subsampling {subsampling}"] = encode(coffee.resize((933, 611)), quality=90, subsampling=subsampling)
    out["odd size 1001x463"] = encode(coffee.resize((1001, 463)), quality=80)
    out["smaller than the crop"] = encode(coffee.resize((120, 90)), quality=90)
    for orientation in range(1, 9):
        out[f"exif orientation {orientation}"] = oriented(orientation)
    return out


VARIANTS = variants()


def pillow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preprocess, "simplejpeg", None)


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count calls into simplejpeg's decoder (the real one runs)."""
    calls: list[int] = []
    real = simplejpeg.decode_jpeg

    def decode_jpeg(*args: object, **kwargs: object) -> np.ndarray:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(preprocess.simplejpeg, "decode_jpeg", decode_jpeg)
    return calls


@pytest.mark.parametrize("name", list(VARIANTS))
def test_fast_path_gives_pillows_pixels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured on these photos: mean and max difference 0 grey levels, decoded image and model input alike
    (the same libjpeg-turbo, the same DCT scale, the same IDCT and upsampling)."""
    data = VARIANTS[name]
    calls = counting(monkeypatch)
    fast_img = preprocess.decode(data, 10**9, SPEC.resize_size)
    fast = prepare(data, SPEC, 10**9).pixels
    assert calls, "the fast path did not run"
    with monkeypatch.context() as m:
        pillow_only(m)
        slow_img = preprocess.decode(data, 10**9, SPEC.resize_size)
        slow = prepare(data, SPEC, 10**9).pixels
    assert fast_img.size == slow_img.size and fast_img.mode == slow_img.mode == "RGB"
    assert np.array_equal(np.asarray(fast_img), np.asarray(slow_img))
    assert np.array_equal(fast, slow)


def test_large_jpeg_is_decoded_at_reduced_scale_by_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch)
    img = preprocess.decode(VARIANTS["phone 3520"], 10**9, SPEC.resize_size)  # 3520×2375
    assert calls and min(img.size) >= 232 and img.width == 3520 // 8


@pytest.mark.parametrize(
    "make", [images.cmyk_jpeg, lambda: images.encode(photos.load("coffee.png"), "PNG")], ids=["cmyk", "png"]
)
def test_what_the_fast_path_leaves_is_pillows(make: Callable[[], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch)
    out = prepare(make(), SPEC, 10**9).pixels
    assert not calls and out.shape == (224, 224, 3)


def test_a_jpeg_simplejpeg_refuses_gets_pillows_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Truncated: simplejpeg (strict) refuses it, Pillow refuses it too, with its reason, as a 4xx."""
    calls = counting(monkeypatch)
    with pytest.raises(InvalidImage, match="could not be decoded"):
        prepare(images.truncated_jpeg(), SPEC, 10**9)
    assert calls


def test_a_jpeg_simplejpeg_cannot_read_falls_back_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever makes simplejpeg fail, the image is decoded by Pillow, with Pillow's pixels."""
    data = VARIANTS["coffee whole"]
    expected = prepare(data, SPEC, 10**9).pixels

    def refuse(*args: object, **kwargs: object) -> np.ndarray:
        raise ValueError("simulated refusal")

    monkeypatch.setattr(preprocess.simplejpeg, "decode_jpeg", refuse)
    assert np.array_equal(prepare(data, SPEC, 10**9).pixels, expected)


def test_pixel_limit_holds_before_the_fast_path_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting(monkeypatch)
    with pytest.raises(ImageTooLarge, match="not decoded"):
        prepare(VARIANTS["phone 3520"], SPEC, max_pixels=1_000_000)
    assert not calls


# Metadata blocks found by a hostile review's fuzzing of EXIF bytes: Pillow's exif_transpose raised on the
# first three after rotating (a 500), and the last one's TIFF header is not a TIFF header at all.
BROKEN_EXIF = {
    "bad offset": "4578696600004d4d002a000000080006010f0002000000060000005601100002000000060000005c011200030000000100"
    "060000011a0005000000010000006201170002000000037377000087690004000000010f00006a000000004d616b6572004d6f64656c"
    "00000000480000000100019003000200000014a000007c00000000323032303a30313a30312030303a30303a303000",
    "bad count": "4578696600004d4d002a00000008e706011b0002000000060000005601100002000000060000005c011200030000000100"
    "060000011a0005000000010000006201310002000000037377000087690004000000010000006a000000004d616b6572004d6f64656c"
    "000000004800000001000190030002000091140000007c00000000323032303a30313a30312030303a30303a303000",
    "bad type": "4578696600004d4d002a000000080006010f0002000000060000005601100005000000060000005c011200030000000100"
    "060000011a0005000000010000006201310002000000037377000087690004000000010000006a000000004d616b6572194d6f64656c"
    "000000004800000001000190030002000000140000007c00000000323032303a30313a30312030303a30303a303000",
    "not a TIFF header": "4578696600005858002a676172626167652d6e6f742d74696666",
}


@pytest.mark.parametrize("name", list(BROKEN_EXIF))
@pytest.mark.parametrize("tail", [b"", b"\x00\x01\x02"], ids=["clean", "bytes before EOI"])
def test_a_broken_metadata_block_never_costs_the_answer(name: str, tail: bytes) -> None:
    """Either path, whether simplejpeg or Pillow decodes (extra bytes before the end marker make simplejpeg
    refuse): the same pixels, upright where the orientation (6) can still be read, as stored where it
    cannot; never an exception (Pillow's exif_transpose raises rewriting the block: a 500)."""
    exif = bytes.fromhex(BROKEN_EXIF[name])  # the APP1 payload, "Exif\0\0" included
    clean = encode(photos.load("coffee.png").resize((300, 200)), quality=80, exif=exif, dpi=(72, 72))
    data = clean[:-2] + tail + clean[-2:]
    fast, pillow = (np.asarray(preprocess.decode(data, 10**9, SPEC.resize_size, fast_jpeg=f)) for f in (True, False))
    assert np.array_equal(fast, pillow)
    assert fast.shape == ((200, 300, 3) if name == "not a TIFF header" else (300, 200, 3))
    assert prepare(data, SPEC, 10**9).pixels.shape == (224, 224, 3)


def test_a_multi_picture_file_is_decoded_at_reduced_scale_as_its_first_picture(monkeypatch) -> None:
    """A phone's MPO (a JPEG, then more pictures): DCT-scaled like any JPEG, the first picture's pixels."""
    first = photos.load("coffee.png").resize((2400, 1600))
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[photos.load("chelsea.png")], quality=90)
    mpo = buf.getvalue()
    assert Image.open(io.BytesIO(mpo)).format == "MPO"
    calls = counting(monkeypatch)
    img = preprocess.decode(mpo, 10**9, SPEC.resize_size)
    assert calls and img.size == (600, 400)  # 1/4 scale
    alone = encode(first, quality=90)
    assert np.array_equal(prepare(mpo, SPEC, 10**9).pixels, prepare(alone, SPEC, 10**9).pixels)


@pytest.mark.skipif(shutil.which("jpegtran") is None, reason="needs jpegtran (libjpeg-turbo-progs) to write one")
def test_an_arithmetic_coded_jpeg_is_read_by_the_fast_path() -> None:
    """Pillow's incremental reading refuses arithmetic coding past its first buffer ("broken data stream");
    libjpeg-turbo reads the whole file at once. A valid JPEG: classified, no longer a 400."""
    source = encode(photos.load("motorcycle_left.png").resize((1500, 1012)), quality=90)
    data = subprocess.run(["jpegtran", "-arithmetic"], input=source, capture_output=True, check=True).stdout
    with pytest.raises(InvalidImage):
        preprocess.decode(data, 10**9, SPEC.resize_size, fast_jpeg=False)
    out = prepare(data, SPEC, 10**9).pixels
    diff = np.abs(out.astype(np.int16) - prepare(source, SPEC, 10**9).pixels.astype(np.int16))
    assert diff.max() == 0  # arithmetic coding is lossless over the same coefficients


@pytest.mark.parametrize("fmt", ["TIFF", "PNG", "WEBP"])
@pytest.mark.parametrize("value", [1, 3, 6, 8])
def test_other_formats_are_turned_upright_once(fmt: str, value: int) -> None:
    """The orientation is read after Pillow loads the picture: its TIFF loader turns a TIFF upright itself
    (and drops the tag), which a read before the load would have applied a second time."""
    stored = photos.load("coffee.png").resize((300, 200))
    exif = Image.Exif()
    exif[0x0112] = value
    data = images.encode(stored, fmt, exif=exif.tobytes(), **({"lossless": True} if fmt == "WEBP" else {}))
    got = np.asarray(preprocess.decode(data, 10**9, SPEC.resize_size))
    expected = np.asarray(preprocess.upright(stored, value))
    assert got.shape == expected.shape and np.abs(got.astype(int) - expected.astype(int)).max() <= 1
