"""Images for tests: real photos (scikit-image) and the odd formats clients send."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from fastinfer.measure import photos


def encode(img: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def photo_jpeg(width: int | None = None) -> bytes:
    return photos.photo_jpeg("chelsea.png", width=width)


def cmyk_jpeg() -> bytes:
    return encode(photos.load("coffee.png").convert("CMYK"), "JPEG", quality=90)


def png16() -> bytes:
    grey = photos.load("astronaut.png").convert("L")
    wide = Image.fromarray(np.asarray(grey).astype(np.uint16) * 257)  # mode I;16
    return encode(wide, "PNG")


def rgba_png() -> bytes:
    img = photos.load("chelsea.png").convert("RGBA")
    img.putalpha(128)
    return encode(img, "PNG")


def palette_gif() -> bytes:
    return encode(photos.load("chelsea.png").convert("P", palette=Image.Palette.ADAPTIVE), "GIF")


def animated_gif() -> bytes:
    frames = [photos.load(n).resize((300, 200)).convert("P") for n in ("chelsea.png", "coffee.png")]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buf.getvalue()


def exif_rotated_jpeg() -> bytes:
    """The photo stored sideways, with EXIF orientation 6 (rotate 90° clockwise to view)."""
    img = photos.load("chelsea.png").transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(img, "JPEG", quality=95, exif=exif.tobytes())


def tiny_png() -> bytes:
    return encode(Image.new("RGB", (1, 1), (200, 30, 30)), "PNG")


def bomb_png(side: int = 8000) -> bytes:
    """Few bytes, many pixels: a decompression bomb for a small FASTINFER_MAX_PIXELS."""
    return encode(Image.new("1", (side, side)), "PNG")


def truncated_jpeg() -> bytes:
    data = photo_jpeg()
    return data[: len(data) // 3]


# Extreme shapes: few bytes, few pixels, but a resize of the whole image would be enormous
# (a 1×20000 PNG resized to a short side of 232 is 232×4.6 M pixels).
EXTREME_SHAPES = {
    "1x20000 png": (1, 20000, "PNG"),
    "20000x1 png": (20000, 1, "PNG"),
    "2x30000 png": (2, 30000, "PNG"),
    "30000x2 png": (30000, 2, "PNG"),
    "1x20000 jpeg": (1, 20000, "JPEG"),
    "20000x1 jpeg": (20000, 1, "JPEG"),
    "2x60000 jpeg": (2, 60000, "JPEG"),
    "60000x2 jpeg": (60000, 2, "JPEG"),
}


def extreme_shape(width: int, height: int, fmt: str) -> bytes:
    """A striped image of that shape (stripes, so that a wrong crop would show)."""
    stripes = (np.arange(width * height, dtype=np.uint32) % 251).astype(np.uint8).reshape(height, width)
    return encode(Image.fromarray(stripes).convert("RGB"), fmt)
