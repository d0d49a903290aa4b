"""README's dashboard picture: the hash of dashboard/ it records, and when the browser test retakes it.

No browser: the screenshot is a small PNG made here (tests/e2e/dashboard_picture.py does the rest).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from PIL import Image

from tests.e2e import dashboard_picture as dp

ROOT = Path(__file__).resolve().parents[2]


def a_dashboard(tmp_path: Path) -> Path:
    directory = tmp_path / "dashboard"
    directory.mkdir()
    (directory / "index.html").write_text("<h1>FastInfer</h1>")
    (directory / "app.js").write_text("console.log(1);")
    (directory / "style.css").write_text("body { color: #222; }")
    return directory


def a_screenshot(mode: str = "RGBA") -> tuple[bytes, Image.Image]:
    image = Image.new(mode, (40, 30), (250, 250, 250, 255)[: len(mode)])
    for x in range(40):
        image.putpixel((x, x % 30), (x * 6, 100, 200, 255)[: len(mode)])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), image


def test_the_hash_is_a_sha256_and_stable(tmp_path) -> None:
    directory = a_dashboard(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{64}", dp.sources_hash(directory))
    assert dp.sources_hash(directory) == dp.sources_hash(directory)
    assert re.fullmatch(r"[0-9a-f]{64}", dp.sources_hash())  # the real dashboard/
    assert dp.DASHBOARD == ROOT / "dashboard" and dp.PICTURE == ROOT / "docs" / "dashboard.png"


def test_the_hash_changes_when_a_file_changes_is_added_renamed_or_removed(tmp_path) -> None:
    directory = a_dashboard(tmp_path)
    seen = {dp.sources_hash(directory)}
    (directory / "app.js").write_text("console.log(2);")  # one byte changed
    seen.add(dp.sources_hash(directory))
    (directory / "logo.svg").write_text("<svg/>")  # a file added
    seen.add(dp.sources_hash(directory))
    (directory / "logo.svg").rename(directory / "mark.svg")  # same bytes, another name
    seen.add(dp.sources_hash(directory))
    (directory / "mark.svg").unlink()
    (directory / "style.css").unlink()  # a file removed
    seen.add(dp.sources_hash(directory))
    assert len(seen) == 5


def test_bytes_moved_across_a_file_boundary_change_the_hash(tmp_path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for directory, a, b in ((one, "ab", "c"), (two, "a", "bc")):
        directory.mkdir()
        (directory / "a.js").write_text(a)
        (directory / "b.js").write_text(b)
    assert dp.sources_hash(one) != dp.sources_hash(two)


def test_saving_records_the_hash_and_keeps_every_pixel(tmp_path) -> None:
    picture = tmp_path / "docs" / "dashboard.png"
    data, taken = a_screenshot("RGBA")
    dp.save(data, picture, digest="ab" * 32)
    assert dp.recorded_hash(picture) == "ab" * 32
    with Image.open(picture) as saved:
        assert saved.mode == "RGB"  # the opaque alpha dropped; nothing else
        assert saved.tobytes() == taken.convert("RGB").tobytes()
    assert [p.name for p in picture.parent.iterdir()] == ["dashboard.png"]  # no partial file left


def test_a_translucent_screenshot_keeps_its_alpha(tmp_path) -> None:
    picture = tmp_path / "dashboard.png"
    image = Image.new("RGBA", (8, 8), (10, 20, 30, 128))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    dp.save(buffer.getvalue(), picture, digest="cd" * 32)
    with Image.open(picture) as saved:
        assert saved.mode == "RGBA" and saved.tobytes() == image.tobytes()


def test_no_hash_is_recorded_without_a_picture_or_its_chunk(tmp_path) -> None:
    assert dp.recorded_hash(tmp_path / "missing.png") is None
    plain = tmp_path / "plain.png"
    plain.write_bytes(a_screenshot()[0])
    assert dp.recorded_hash(plain) is None
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    assert dp.recorded_hash(junk) is None


def test_stale_when_missing_unrecorded_or_taken_at_other_sources(tmp_path) -> None:
    directory, picture = a_dashboard(tmp_path), tmp_path / "dashboard.png"
    assert dp.is_stale(picture, directory)
    assert "missing" in dp.retake_reason(picture, directory, env={})

    picture.write_bytes(a_screenshot()[0])  # a picture without the chunk
    assert dp.is_stale(picture, directory)
    assert "records no hash" in dp.retake_reason(picture, directory, env={})

    dp.save(a_screenshot()[0], picture, digest=dp.sources_hash(directory))
    assert not dp.is_stale(picture, directory)
    assert dp.retake_reason(picture, directory, env={}) is None
    assert dp.retake_reason(picture, directory, env={dp.RETAKE: "0"}) is None
    assert dp.retake_reason(picture, directory, env={dp.RETAKE: "1"}) == f"{dp.RETAKE}=1"  # asked for

    (directory / "style.css").write_text("body { color: #111; }")
    assert dp.is_stale(picture, directory)
    assert "dashboard/ changed" in dp.retake_reason(picture, directory, env={})
    dp.save(a_screenshot()[0], picture, digest=dp.sources_hash(directory))
    assert not dp.is_stale(picture, directory)


def test_the_committed_picture_records_the_sources_it_shows() -> None:
    """docs/dashboard.png is in the repository with its hash; whether that is today's dashboard/ is the
    browser test's business (it retakes the picture and warns, rather than failing here)."""
    assert dp.recorded_hash() is not None, "docs/dashboard.png is missing or records no hash: run the browser test"
