"""README's dashboard picture (docs/dashboard.png) kept in step with dashboard/: the committed picture records
the sources it shows, and once they change the browser test retakes it, or fails in CI.

No browser: the screenshot is a small PNG made here (tests/e2e/dashboard_picture.py does the rest).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from tests.e2e import dashboard_picture as dp


def a_dashboard(tmp_path: Path) -> Path:
    directory = tmp_path / "dashboard"
    directory.mkdir(parents=True)
    (directory / "index.html").write_text("<h1>FastInfer</h1>")
    (directory / "app.js").write_text("console.log(1);")
    (directory / "style.css").write_text("body { color: #222; }")
    return directory


def a_screenshot() -> tuple[bytes, Image.Image]:
    image = Image.new("RGBA", (40, 30), (250, 250, 250, 255))
    for x in range(40):
        image.putpixel((x, x % 30), (x * 6, 100, 200, 255))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), image


def test_the_committed_picture_records_the_sources_it_shows() -> None:
    """Whether that is today's dashboard/ is the browser test's business (below: it retakes it, or fails in CI)."""
    assert dp.recorded_hash() is not None, "docs/dashboard.png is missing or records no hash: run the browser test"


CHANGES: dict[str, Callable[[Path], object]] = {
    "a file changed": lambda d: (d / "app.js").write_text("console.log(2);"),
    "a file added": lambda d: (d / "logo.svg").write_text("<svg/>"),
    "a file renamed": lambda d: (d / "logo.svg").rename(d / "mark.svg"),
    "a file removed": lambda d: (d / "style.css").unlink(),
}


def test_a_picture_the_dashboard_moved_past_is_retaken_or_fails_in_ci(tmp_path) -> None:
    directory, picture = a_dashboard(tmp_path), tmp_path / "dashboard.png"
    assert dp.decide(picture, directory, env={"CI": "1"}) == (dp.FAIL, "dashboard.png is missing")
    picture.write_bytes(a_screenshot()[0])  # a picture without the hash
    assert dp.decide(picture, directory, env={}) == (dp.RETAKE_IT, "dashboard.png records no hash of dashboard/")

    data, taken = a_screenshot()
    dp.save(data, picture, digest=dp.sources_hash(directory))
    with Image.open(picture) as saved:  # what README shows: the screenshot's every pixel
        assert saved.tobytes() == taken.convert("RGB").tobytes()
    assert dp.decide(picture, directory, env={"CI": "1"}) == (dp.KEEP, None)
    assert dp.decide(picture, directory, env={"CI": "1", dp.RETAKE: "1"}) == (dp.RETAKE_IT, f"{dp.RETAKE}=1")

    for change, make in CHANGES.items():
        make(directory)
        what, reason = dp.decide(picture, directory, env={"CI": "1"})
        assert what == dp.FAIL and "dashboard/ changed" in reason, change
        assert dp.decide(picture, directory, env={}) == (dp.RETAKE_IT, reason), change
        dp.save(a_screenshot()[0], picture, digest=dp.sources_hash(directory))  # retaken: current again
        assert not dp.is_stale(picture, directory), change
