"""docs/dashboard.png, README's picture of the dashboard, and when the browser test retakes it.

The picture records, in a PNG text chunk, a SHA-256 over the dashboard's sources (every file under
dashboard/, sorted by name; name and bytes both hashed). tests/e2e/test_dashboard.py screenshots the
page anyway; it writes that screenshot to docs/dashboard.png only when the recorded hash is not the
sources' hash (the page changed), when the picture is missing, or when
FASTINFER_RETAKE_DASHBOARD_PICTURE=1 asks for it, and then warns that the new picture must be committed.
No browser here: tests/unit/test_dashboard_picture.py tests this module alone.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from pathlib import Path

from PIL import Image, PngImagePlugin

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboard"
PICTURE = ROOT / "docs" / "dashboard.png"
KEY = "fastinfer-dashboard-sources"  # the PNG text chunk's keyword
RETAKE = "FASTINFER_RETAKE_DASHBOARD_PICTURE"  # =1: retake even when the sources are unchanged


def sources_hash(directory: Path = DASHBOARD) -> str:
    """SHA-256 over every file under ``directory``, sorted by relative name; each name and its bytes are
    hashed with their lengths, so moving bytes from one file to the next changes the hash too."""
    digest = hashlib.sha256()
    files = sorted((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.relative_to(directory).as_posix())
    for path in files:
        for part in (path.relative_to(directory).as_posix().encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


def recorded_hash(picture: Path = PICTURE) -> str | None:
    """The sources' hash the picture was taken at, or None: no picture, not a PNG, or no such chunk."""
    try:
        with Image.open(picture) as image:
            image.load()  # text chunks after the image data are read with it
            text = getattr(image, "text", {})
    except (OSError, SyntaxError, ValueError):  # missing, unreadable or not an image
        return None
    value = text.get(KEY)
    return value if isinstance(value, str) and value else None


def retake_reason(
    picture: Path = PICTURE, directory: Path = DASHBOARD, env: Mapping[str, str] = os.environ
) -> str | None:
    """Why the picture must be retaken now, or None when it shows the current sources."""
    if env.get(RETAKE, "") == "1":
        return f"{RETAKE}=1"
    if not picture.exists():
        return f"{picture.name} is missing"
    recorded = recorded_hash(picture)
    if recorded is None:
        return f"{picture.name} records no hash of {directory.name}/"
    current = sources_hash(directory)
    if recorded != current:
        return f"{directory.name}/ changed (recorded {recorded[:12]}, now {current[:12]})"
    return None


def is_stale(picture: Path = PICTURE, directory: Path = DASHBOARD) -> bool:
    """Whether the picture does not show the current sources (missing, unrecorded or another hash)."""
    return retake_reason(picture, directory, env={}) is not None


def save(screenshot: bytes, picture: Path = PICTURE, digest: str | None = None) -> None:
    """Write ``screenshot`` (PNG bytes) to ``picture`` with ``digest`` (default: the sources' hash now)
    recorded. Lossless: the same pixels, re-encoded with optimize=True; an alpha channel that is opaque
    everywhere is dropped, which changes no pixel. Written beside and renamed, so never half a file."""
    digest = sources_hash() if digest is None else digest
    info = PngImagePlugin.PngInfo()
    info.add_text(KEY, digest)
    with Image.open(io.BytesIO(screenshot)) as taken:
        opaque = taken.mode == "RGBA" and taken.getchannel("A").getextrema() == (255, 255)
        image = taken.convert("RGB") if opaque else taken.copy()
    picture.parent.mkdir(parents=True, exist_ok=True)
    partial = picture.with_name(f".{picture.name}.partial")
    try:
        image.save(partial, format="PNG", optimize=True, pnginfo=info)
        partial.replace(picture)
    finally:
        partial.unlink(missing_ok=True)
