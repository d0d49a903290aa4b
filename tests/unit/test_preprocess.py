"""fastinfer.serving.preprocess against torchvision's own reference transforms, and every odd input mode."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common.errors import ImageTooLarge, InvalidImage
from fastinfer.measure import photos
from fastinfer.serving.preprocess import prepare
from tests import images

SPEC = PreprocessSpec(resize_size=232, crop_size=224)
ROOT = Path(__file__).resolve().parents[2]


def reference(data: bytes) -> np.ndarray:
    """The original FastInfer API's pipeline: full decode, RGB, torchvision's IMAGENET1K_V2 resize + centre crop."""
    import io

    from torchvision.models import ResNet50_Weights
    from torchvision.transforms import v2

    t = ResNet50_Weights.IMAGENET1K_V2.transforms()
    pipeline = v2.Compose([v2.Resize(t.resize_size, antialias=True), v2.CenterCrop(t.crop_size)])
    img = Image.open(io.BytesIO(data)).convert("RGB")
    return np.asarray(pipeline(img), dtype=np.uint8)


@pytest.mark.parametrize("name", [p for p in photos.PHOTOS if not p.endswith(".jpg")])
def test_lossless_photos_match_torchvision_exactly(name: str) -> None:
    data = photos.encode(photos.load(name), "PNG")
    ours = prepare(data, SPEC, 10**9).pixels
    assert ours.shape == (224, 224, 3) and ours.dtype == np.uint8
    # No DCT scaling for PNG: the same Pillow resize, so the same pixels.
    assert np.array_equal(ours, reference(data))


@pytest.mark.parametrize("width", [640, 1500, 3000])
def test_jpeg_reduced_dct_scale_stays_close_to_full_decode(width: int) -> None:
    data = photos.photo_jpeg("motorcycle_left.png", width=width)
    ours = prepare(data, SPEC, 10**9).pixels.astype(np.int16)
    ref = reference(data).astype(np.int16)
    diff = np.abs(ours - ref)
    # Tolerance: decoding at 1/2..1/8 DCT scale then resizing differs from a full decode by
    # interpolation noise only. Measured on these photos: mean <= 1.9 grey levels, 99th
    # percentile <= 12 (of 255). Gate at mean < 2.5 and p99 <= 16: a wrong scale, a shifted
    # crop or swapped channels gives means of 20+.
    assert diff.mean() < 2.5, diff.mean()
    assert np.percentile(diff, 99) <= 16


def test_small_image_is_upscaled_to_the_crop() -> None:
    out = prepare(images.tiny_png(), SPEC, 10**9).pixels
    assert out.shape == (224, 224, 3)
    assert tuple(out[112, 112]) == (200, 30, 30)


@pytest.mark.parametrize(
    "make",
    [images.cmyk_jpeg, images.png16, images.rgba_png, images.palette_gif, images.animated_gif],
    ids=["cmyk", "png16", "rgba", "palette", "animated"],
)
def test_odd_modes_become_rgb(make) -> None:
    out = prepare(make(), SPEC, 10**9).pixels
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert out.std() > 5  # a real picture, not a flat fill
    if make is images.png16:
        assert out.max() > 200 and out.min() < 60  # scaled from 16 bits, not clipped to white


def test_rgba_is_composited_on_white() -> None:
    img = Image.new("RGBA", (300, 300), (0, 0, 0, 0))
    out = prepare(images.encode(img, "PNG"), SPEC, 10**9).pixels
    assert out.min() == 255


def test_exif_orientation_is_applied() -> None:
    upright = prepare(photos.photo_jpeg("chelsea.png", quality=95), SPEC, 10**9).pixels.astype(np.int16)
    rotated = prepare(images.exif_rotated_jpeg(), SPEC, 10**9).pixels.astype(np.int16)
    assert np.abs(upright - rotated).mean() < 4


def test_decompression_bomb_is_refused_before_decoding() -> None:
    with pytest.raises(ImageTooLarge, match="not decoded"):
        prepare(images.bomb_png(8000), SPEC, max_pixels=10_000_000)


@pytest.mark.parametrize(
    "data", [b"", b"not an image at all", images.truncated_jpeg()], ids=["empty", "text", "truncated"]
)
def test_undecodable_input_is_invalid_image(data: bytes) -> None:
    with pytest.raises(InvalidImage):
        prepare(data, SPEC, 10**9)


CRASHERS = sorted((Path(__file__).parent.parent / "data" / "decode_crashers").iterdir())


@pytest.mark.parametrize("path", CRASHERS, ids=[p.name for p in CRASHERS])
def test_files_that_made_pillow_raise_oddly_are_invalid_images(path: Path) -> None:
    """Inputs (scripts/fuzz_decode.py) on which Pillow raises something other than OSError/ValueError: a 400 that
    names the fault, not a 500."""
    with pytest.raises((InvalidImage, ImageTooLarge), match=r"could not be decoded|not an image in a|not decoded"):
        prepare(path.read_bytes(), SPEC, 50_000_000)


def test_a_gif_frame_larger_than_its_screen_is_refused_before_decoding() -> None:
    """A 2.6 KB GIF whose first frame claims 7.8 G pixels: 4 GB of memory (the fuzzer's out-of-memory) while the
    server had switched Pillow's own size checks off."""
    data = (Path(__file__).parent.parent / "data" / "decode_crashers" / "gif-frame-of-7.8-gigapixels.gif").read_bytes()
    with pytest.raises(ImageTooLarge, match=r"holds a picture of 7,839,981,056 pixels.*not decoded"):
        prepare(data, SPEC, 50_000_000)


def fits(side: int) -> bytes:
    cards = ["SIMPLE  =                    T", "BITPIX  =                    8", "NAXIS   =                    2",
             f"NAXIS1  = {side:20d}", f"NAXIS2  = {side:20d}", "END"]  # fmt: skip
    header = "".join(card.ljust(80) for card in cards).ljust(2880).encode()
    return header + bytes(side * side).ljust(2880, b"\0")


@pytest.mark.parametrize("fmt", ["ICO", "ICNS", "FITS", "PPM", "TGA", "JPEG2000"])
def test_formats_outside_the_photo_formats_are_not_opened(fmt: str) -> None:
    """ICO and ICNS decode their picture while opening, before any size check (a 875 KB ICO became 900 MP in
    memory); a gzip FITS is decoded in Python (49 MP: 12 s). Only the formats photos come in are opened."""
    data = fits(4) if fmt == "FITS" else images.encode(Image.new("RGB", (64, 64), (9, 99, 199)), fmt)
    assert Image.open(io.BytesIO(data)).format == fmt  # Pillow reads it
    with pytest.raises(InvalidImage, match=r"not an image in a format this service reads \(JPEG, PNG"):
        prepare(data, SPEC, 50_000_000)


def prepare_in_a_fresh_interpreter(make_data: str) -> dict:
    """``prepare`` of the bytes ``make_data`` (Python, with ``images`` and ``Image`` imported) in a
    new interpreter, so that its peak memory is its own: output shape, peak growth, seconds."""
    import json
    import subprocess
    import sys

    script = f"""
import json, resource, time
from PIL import Image
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.serving.preprocess import prepare
from tests import images
data = {make_data}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = prepare(data, PreprocessSpec(232, 224), 50_000_000).pixels
seconds = time.perf_counter() - t0
grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({{"shape": list(out.shape), "dtype": str(out.dtype), "grew_mb": grew_mb, "seconds": seconds}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["shape"] == [224, 224, 3] and seen["dtype"] == "uint8"
    return seen


@pytest.mark.parametrize("case", list(images.EXTREME_SHAPES))
def test_extreme_shapes_are_classified_at_bounded_cost(case: str) -> None:
    width, height, fmt = images.EXTREME_SHAPES[case]
    seen = prepare_in_a_fresh_interpreter(f"images.extreme_shape({width}, {height}, {fmt!r})")
    # Resizing the whole 1×20000 image took 4.5 GB and 17 s; the crop alone takes about 1 MB, 5 ms.
    # (A bound, not a speed target: 64 MB and 5 s leave room for a slow machine.)
    assert seen["grew_mb"] < 64, f"{case}: peak memory grew by {seen['grew_mb']:.0f} MB"
    assert seen["seconds"] < 5, f"{case}: {seen['seconds']:.1f} s"


SIDE = 3000  # 9 MP: large enough that the full-size copies dominate the peak
MODES = {
    "rgba png": f"images.encode(Image.new('RGBA', ({SIDE}, {SIDE}), (9, 99, 199, 128)), 'PNG')",
    "palette gif with transparency": (f"images.encode(Image.new('P', ({SIDE}, {SIDE}), 3), 'GIF', transparency=3)"),
    "16-bit png": f"images.encode(Image.new('I;16', ({SIDE}, {SIDE}), 40000), 'PNG')",
    "rgb png": f"images.encode(Image.new('RGB', ({SIDE}, {SIDE}), (9, 99, 199)), 'PNG')",
}


@pytest.mark.parametrize("case", list(MODES))
def test_memory_per_pixel_stays_low_for_every_mode(case: str) -> None:
    """What one decode may cost is bytes per pixel × FASTINFER_MAX_PIXELS: at most ~12."""
    seen = prepare_in_a_fresh_interpreter(MODES[case])
    per_pixel = seen["grew_mb"] * 2**20 / SIDE**2
    assert per_pixel < 14, f"{case}: {per_pixel:.1f} bytes per pixel"


@pytest.mark.parametrize("size", [(2, 900), (900, 2), (3, 2000), (1, 5000)])
def test_crop_only_resampling_matches_the_whole_resize(size: tuple[int, int]) -> None:
    """The bounded path gives torchvision's pixels to within one grey level (Pillow's box is float32)."""
    from fastinfer.serving.preprocess import resize_and_crop

    width, height = size
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    ours = resize_and_crop(img, SPEC).astype(np.int16)
    ref = reference(images.encode(img, "PNG")).astype(np.int16)
    assert np.abs(ours - ref).max() <= 1


def test_decodes_in_two_threads_keep_their_own_pixel_limit_and_put_pillows_back() -> None:
    """Pillow's limit is a global: each decode runs under its own limit, and Pillow's own is put back after."""
    import threading

    before = Image.MAX_IMAGE_PIXELS
    over = images.encode(Image.new("RGB", (200, 200)), "PNG")  # 40,000 pixels
    decoded: list[int] = []

    def refuse_many() -> None:
        for _ in range(1500):
            try:
                prepare(over, SPEC, 10_000)
                decoded.append(1)
            except ImageTooLarge:
                pass

    threads = [threading.Thread(target=refuse_many) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert decoded == [] and before == Image.MAX_IMAGE_PIXELS
