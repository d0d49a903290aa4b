"""Real photos shipped by scikit-image, for verification, calibration, tests and load tests.

No network: these files are part of the installed package.
"""

from __future__ import annotations

import io
from importlib.util import find_spec
from pathlib import Path

from PIL import Image

PHOTOS: tuple[str, ...] = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "retina.jpg",
    "hubble_deep_field.jpg",
    "ihc.png",
    "color.png",
    "camera.png",
    "brick.png",
)
"""Natural photos (colour and greyscale) in scikit-image's data directory."""


def photo_dir() -> Path:
    spec = find_spec("skimage.data")
    if spec is None or spec.origin is None:
        raise RuntimeError("scikit-image is not installed; its photos are FastInfer's sample set")
    return Path(spec.origin).parent


def load(name: str) -> Image.Image:
    """One sample photo as an RGB image."""
    with Image.open(photo_dir() / name) as img:
        return img.convert("RGB")


def encode(img: Image.Image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return buf.getvalue()


def photo_jpeg(name: str = "motorcycle_left.png", width: int | None = None, quality: int = 90) -> bytes:
    """A sample photo as JPEG bytes, optionally rescaled to ``width`` (aspect kept)."""
    img = load(name)
    if width is not None and width != img.width:
        img = img.resize((width, round(img.height * width / img.width)), Image.Resampling.LANCZOS)
    return encode(img, "JPEG", quality)


def benchmark_photo() -> bytes:
    """The ~1.5 MP photo used for headline latency numbers (motorcycle, 1500×1012, q90)."""
    return photo_jpeg("motorcycle_left.png", width=1500)
