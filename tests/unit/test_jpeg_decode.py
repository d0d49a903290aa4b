"""The libjpeg-turbo decode path (simplejpeg) gives Pillow's pixels, and Pillow still decides every
JPEG it does not take: the pixel gate of fastinfer/serving/preprocess.py's fast path."""

from __future__ import annotations

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
