"""Real photos shipped by scikit-image (no network), for verification, calibration, tests and load tests."""

from __future__ import annotations

import io
import stat
from importlib.util import find_spec
from pathlib import Path

import numpy as np
from PIL import Image

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common.errors import ApiError
from fastinfer.serving.preprocess import prepare

PHOTOS: tuple[str, ...] = (  # natural photos (colour and greyscale) in scikit-image's data directory
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


def photo_dir() -> Path:
    spec = find_spec("skimage.data")
    if spec is None or spec.origin is None:
        raise RuntimeError("scikit-image is not installed; its photos are FastInfer's sample set")
    return Path(spec.origin).parent


def load(name: str) -> Image.Image:
    with Image.open(photo_dir() / name) as img:
        return img.convert("RGB")


def encode(img: Image.Image, fmt: str = "JPEG", quality: int = 90) -> bytes:
    # PNG uncompressed: lossless at any level, and the default level (6) took 4x the calibration set's time.
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {"compress_level": 0}))
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


def size_class(width: int, height: int) -> str:
    """small (< 1 MP), medium (1-4 MP) or phone (>= 8 MP-ish, anything from 4 MP)."""
    mp = width * height / 1e6
    return "small" if mp < 1 else "medium" if mp < 4 else "phone"


def benchmark_pool(directory: Path | None = None) -> list[tuple[str, bytes]]:
    """60 distinct JPEGs: each photo whole, at 1.5 MP, at ~8.3 MP (a phone's), a 60% centre crop and at quality 75.
    Deterministic, in file-name order whether made or read back; cached in ``directory`` when given."""
    if directory is not None and directory.is_dir():
        files = sorted(directory.glob("*.jpg"))
        if len(files) == len(PHOTOS) * 5:
            return [(f.name, f.read_bytes()) for f in files]
    pool: list[tuple[str, bytes]] = []
    for name in PHOTOS:
        img = load(name)
        w, h = img.size
        stem = name.rsplit(".", 1)[0]
        variants = {
            "whole": (img, 90),
            "1.5mp": (img.resize((1500, round(h * 1500 / w)), Image.Resampling.BICUBIC), 90),
            "phone": (img.resize((3520, round(h * 3520 / w)), Image.Resampling.BICUBIC), 92),
            "crop": (img.crop((w // 5, h // 5, w - w // 5, h - h // 5)), 90),
            "q75": (img, 75),
        }
        for label, (variant, quality) in variants.items():
            pool.append((f"{stem}-{label}-{variant.width}x{variant.height}.jpg", encode(variant, "JPEG", quality)))
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        for filename, data in pool:
            (directory / filename).write_bytes(data)
    return sorted(pool)  # the order read back from ``directory``: the bench and its locust processes index it alike


class UnusablePhoto(ValueError):
    """A user's photo file the service would refuse (too large, not an image) or that cannot be read: why."""


def photo_pixels(path: Path, spec: PreprocessSpec, max_pixels: int) -> np.ndarray:
    """A user's photo file through the service's preprocessing, read as the server takes an upload: one larger than
    FASTINFER_MAX_BYTES is refused unread (a 3 GB file named .png was read whole). UnusablePhoto says why not."""
    from fastinfer.catalog.config import get_settings

    limit = get_settings().max_bytes
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block for ever, a device never end
            raise UnusablePhoto("not a regular file")
        with path.open("rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise UnusablePhoto(f"the file is larger than FASTINFER_MAX_BYTES ({limit:,} bytes); it was not read")
        return prepare(data, spec, max_pixels).pixels
    except ApiError as exc:  # the service's own verdict on the file (not an image, too large)
        raise UnusablePhoto(str(exc)) from exc
    except OSError as exc:  # unreadable: named, never a traceback
        raise UnusablePhoto(f"{type(exc).__name__}: {exc}") from exc
