"""docs/dashboard.png, README's picture of the dashboard, and when the browser test retakes it (:func:`decide`):
keep it while it records the current hash of dashboard/'s sources, retake it when stale (or asked to), fail when
stale in CI. docs/architecture.md ("The dashboard picture") says which files count and why. No browser here:
tests/unit/test_dashboard_picture.py tests this module alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from PIL import Image, PngImagePlugin

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboard"
PICTURE = ROOT / "docs" / "dashboard.png"
KEY = "fastinfer-dashboard-sources"  # the PNG text chunk's keyword
RETAKE = "FASTINFER_RETAKE_DASHBOARD_PICTURE"  # =1: retake even when the sources are unchanged
CI = "CI"  # set, not empty: a stale picture fails the browser test instead of being retaken
KEEP, RETAKE_IT, FAIL = "keep", "retake", "fail"  # decide()'s answers
RETAKE_COMMAND = f"{RETAKE}=1 .venv/bin/python -m pytest tests/e2e/test_dashboard.py -k end_to_end"


def tracked_files(directory: Path = DASHBOARD) -> list[str] | None:
    """The files git tracks under ``directory``, relative to it (``git ls-files -z``), or None: git is
    missing, ``directory`` is not in a git checkout, or git tracks nothing there."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "."],
            cwd=directory,
            capture_output=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or no such directory
        return None
    if listed.returncode != 0:  # not a checkout (or one git refuses to read)
        return None
    names = [name for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if name]
    return names or None


def all_files(directory: Path = DASHBOARD) -> list[str]:
    """Every file under ``directory``, relative to it, except hidden names (an editor's ``.app.js.swp``,
    ``.DS_Store``) and what is under ``__pycache__``: the sources when git cannot say which they are."""
    names = []
    for path in directory.rglob("*"):
        parts = path.relative_to(directory).parts
        if path.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in parts):
            names.append(path.relative_to(directory).as_posix())
    return names


def sources_hash(directory: Path = DASHBOARD) -> str:
    """SHA-256 over the sources under ``directory`` (``tracked_files``, else ``all_files``), sorted by
    relative name; each name and its bytes (CRLF read as LF) are hashed with their lengths, so moving
    bytes from one file to the next changes the hash too. A tracked file deleted from the work tree is
    left out, which changes the hash as removing it would."""
    digest = hashlib.sha256()
    names = tracked_files(directory) or all_files(directory)
    for name in sorted(names):
        path = directory / name
        if not path.is_file():
            continue
        for part in (name.encode("utf-8", "surrogateescape"), path.read_bytes().replace(b"\r\n", b"\n")):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


def recorded_hash(picture: Path = PICTURE) -> str | None:
    """The sources' hash the picture was taken at, or None: no picture, not a PNG, or no such chunk."""
    try:
        with Image.open(picture) as image:
            image.load()  # text chunks after the image data are read with it
            text = getattr(image, "text", {})
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):  # missing, unreadable, not an image
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


def decide(
    picture: Path = PICTURE, directory: Path = DASHBOARD, env: Mapping[str, str] = os.environ
) -> tuple[str, str | None]:
    """What the browser test does with README's picture, and why: ``(KEEP, None)`` when it is current;
    ``(RETAKE_IT, reason)`` when it is stale outside CI or FASTINFER_RETAKE_DASHBOARD_PICTURE=1 asks for
    it (also in CI); ``(FAIL, reason)`` when it is stale in CI (CI set, and not empty, 0 or false)."""
    reason = retake_reason(picture, directory, env)
    if reason is None:
        return KEEP, None
    if env.get(CI, "").strip().lower() not in ("", "0", "false") and env.get(RETAKE, "") != "1":
        return FAIL, reason
    return RETAKE_IT, reason


def stale_message(reason: str, picture: Path = PICTURE) -> str:
    """The failure CI shows for a stale picture: why, and the command that retakes it."""
    return f"{picture.parent.name}/{picture.name} is stale ({reason}) — run `{RETAKE_COMMAND}` locally and commit it"


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
