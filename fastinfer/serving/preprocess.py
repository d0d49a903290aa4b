"""Image bytes → uint8 HWC S×S×3 RGB, resized and centre-cropped as the stored model's PreprocessSpec says
(the model's graph normalises). CPU-bound and synchronous.

JPEGs are decoded at the smallest DCT scale that keeps the shorter side >= the resize target, colour and
greyscale ones by simplejpeg (the same pixels as Pillow: docs/api.md); Pillow decodes everything else and
every JPEG simplejpeg refuses, so a broken file gets Pillow's verdict.
"""

from __future__ import annotations

import io
import math
import re
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

try:  # libjpeg-turbo with DCT scaling; wheels for Linux, macOS and Windows. Pillow decodes without it.
    import simplejpeg
except ImportError:  # pragma: no cover - a platform without simplejpeg's wheels
    simplejpeg = None

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common.errors import ImageTooLarge, InvalidImage, one_line

# Pillow checks every size it reads before decoding (an image's, a GIF frame's, which may exceed its screen): over
# its MAX_IMAGE_PIXELS (ours, set per call) it warns, and the warning is an error here.
warnings.filterwarnings("error", category=Image.DecompressionBombWarning)


@dataclass(frozen=True)
class Prepared:
    pixels: np.ndarray  # uint8 [crop, crop, 3]
    decode_ms: float
    preprocess_ms: float


def decode(data: bytes | memoryview, max_pixels: int, target_short_side: int, fast_jpeg: bool = True) -> Image.Image:
    """Decode to an RGB image, at reduced JPEG scale when the target allows it; ``fast_jpeg=False``: Pillow alone."""
    if not data:
        raise InvalidImage("The image is empty (0 bytes).")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = open_checked(data, max_pixels)
            width, height = img.size
            if width < 1 or height < 1:
                raise InvalidImage(f"The image has no pixels ({width}×{height}).")
            if img.format in JPEG_FORMATS:
                scale = target_short_side / min(width, height)
                img.draft(None, (math.ceil(width * scale), math.ceil(height * scale)))
                if fast_jpeg and (fast := decode_jpeg_turbo(data, img)) is not None:
                    return upright(fast, orientation(img))  # a JPEG's header holds its EXIF: nothing is decoded
            img.load()
            # After loading: reading PNG's EXIF decodes it, and Pillow's TIFF loader turns the picture upright.
            return to_rgb(upright(img, orientation(img)))
    except (InvalidImage, ImageTooLarge):
        raise
    except UnidentifiedImageError as exc:
        raise InvalidImage(NOT_AN_IMAGE) from exc
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        size = re.search(r"\((\d+) pixels\)", str(exc))
        holds = f"holds a picture of {int(size.group(1)):,} pixels" if size else "holds a larger picture"
        raise ImageTooLarge(
            f"The image {holds}; the limit is {max_pixels:,} (FASTINFER_MAX_PIXELS). It was not decoded."
        ) from exc
    except Exception as exc:
        # Pillow's format plugins raise whatever bad data leads them to (OSError, but also NotImplementedError,
        # TypeError, struct.error, ...: scripts/fuzz_decode.py): all of it is the client's file, never a 500.
        raise InvalidImage(f"The image could not be decoded: {one_line(exc, 200, named=False)}") from exc


_PILLOW_LIMIT = threading.Lock()


def open_checked(data: bytes | memoryview, max_pixels: int) -> Image.Image:
    """``Image.open`` with Pillow's own size checks at ``max_pixels``. Its limit is a global: set, used and put back
    under a lock, so that two decodes never see each other's (opening reads headers only: decodes still overlap)."""
    with _PILLOW_LIMIT:
        before, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, max_pixels
        try:
            return Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
        finally:
            Image.MAX_IMAGE_PIXELS = before


# The formats photos come in, each decoded by a C library after its header is checked (why not the others:
# docs/api.md).
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")  # a phone's MPO opens as JPEG
NOT_AN_IMAGE = "The body is not an image in a format this service reads (JPEG, PNG, WebP, GIF, BMP, TIFF, AVIF)."
JPEG_FORMATS = ("JPEG", "MPO")  # a phone's MPO is a JPEG followed by others: the first is the photo


def upright(img: Image.Image, orientation: int) -> Image.Image:
    """``img`` as the viewer should see it, given its EXIF orientation (1-8; anything else: as stored)."""
    method = ORIENTATION_TRANSPOSE.get(orientation)
    return img if method is None else img.transpose(method)


def orientation(img: Image.Image) -> int:
    """An image's EXIF orientation; 1 where there is none or it is malformed (never an error, unlike
    Pillow's ``exif_transpose``)."""
    try:
        value = img.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:
        return 1
    return value if isinstance(value, int) else 1


TURBO_MODES = ("RGB", "L")  # JPEG modes libjpeg-turbo turns into RGB exactly as Pillow does (not CMYK/YCCK)


def decode_jpeg_turbo(data: bytes | memoryview, header: Image.Image) -> Image.Image | None:
    """A JPEG decoded by simplejpeg at the DCT scale Pillow's ``draft`` chose for ``header``, not yet upright;
    None where Pillow should decode it instead (simplejpeg missing, another mode, any complaint)."""
    if simplejpeg is None or header.mode not in TURBO_MODES:
        return None
    width, height = header.size  # the draft's scaled size: the smallest libjpeg-turbo gives at >= it
    try:
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=height, min_width=width)
    except Exception:  # any refusal: Pillow's path decides
        return None
    if pixels.shape != (height, width, 3):  # not the scale Pillow would decode at: keep Pillow's pixels
        return None
    return Image.fromarray(pixels)


ORIENTATION_TRANSPOSE = {  # EXIF orientation → the transpose that shows the picture upright
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode → 8-bit RGB, transparency composited onto white, with at most one full-size copy between."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        # 16-bit greyscale: round(v / 257) in integers and in place, instead of Pillow's clipping at 255.
        v = np.array(img, dtype=np.uint32)
        v *= 2
        v += 257
        v //= 514
        return Image.fromarray(v.astype(np.uint8)).convert("RGB")
    if img.mode in ("I", "F"):
        arr = np.array(img, dtype=np.float32)  # one copy, then scaled in place
        if img.mode == "I":
            if arr.max() > 255:  # 32-bit samples holding a 16-bit range
                arr *= 255.0 / 65535.0
            arr += 0.5
        np.clip(arr, 0, 255, out=arr)
        return Image.fromarray(arr.astype(np.uint8)).convert("RGB")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img if img.mode == "RGBA" else img.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba)  # the alpha band is the mask
        return white
    return img.convert("RGB")


WHOLE_RESIZE_MAX_CROPS = 16  # beyond this many crops (or the source's size) only the crop is resampled


def resize_and_crop(img: Image.Image, spec: PreprocessSpec) -> np.ndarray:
    """Shorter side to ``resize_size`` (bilinear, antialiased), then a centre crop. Where an extreme aspect ratio
    would make the resized image huge, only the cropped region is resampled (Pillow's ``box``; off by a grey
    level at most, so ordinary images keep the whole resize and match torchvision exactly)."""
    width, height = img.size
    crop = spec.crop_size
    # torchvision's arithmetic: the short side becomes resize_size, the long one is truncated.
    if width <= height:
        new_w, new_h = spec.resize_size, int(spec.resize_size * height / width)
    else:
        new_w, new_h = int(spec.resize_size * width / height), spec.resize_size
    left, top = round((new_w - crop) / 2.0), round((new_h - crop) / 2.0)
    if new_w * new_h > max(width * height, WHOLE_RESIZE_MAX_CROPS * crop * crop) and min(new_w, new_h) >= crop:
        sx, sy = width / new_w, height / new_h  # source pixels per resized pixel
        box = (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy)
        img = img.resize((crop, crop), Image.Resampling.BILINEAR, box=box)
        return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))
    if (new_w, new_h) != img.size:
        img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
    if min(img.size) < crop:  # only for resize_size < crop_size; pad like torchvision
        img = ImageOps.pad(img, (max(crop, img.width), max(crop, img.height)), color=(0, 0, 0))
        left, top = round((img.width - crop) / 2.0), round((img.height - crop) / 2.0)
    img = img.crop((left, top, left + crop, top + crop))
    return np.ascontiguousarray(np.asarray(img, dtype=np.uint8))


def prepare(data: bytes | memoryview, spec: PreprocessSpec, max_pixels: int) -> Prepared:
    """Bytes → the model's uint8 input for one image, with stage timings."""
    t0 = time.perf_counter()
    img = decode(data, max_pixels, spec.resize_size)
    t1 = time.perf_counter()
    pixels = resize_and_crop(img, spec)
    t2 = time.perf_counter()
    return Prepared(pixels, (t1 - t0) * 1000, (t2 - t1) * 1000)
