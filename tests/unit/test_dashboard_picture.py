"""README's dashboard picture: the hash of dashboard/ it records, and when the browser test retakes it.

No browser: the screenshot is a small PNG made here (tests/e2e/dashboard_picture.py does the rest).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from PIL import Image

from tests.e2e import dashboard_picture as dp

ROOT = Path(__file__).resolve().parents[2]


def a_dashboard(tmp_path: Path) -> Path:
    directory = tmp_path / "dashboard"
    directory.mkdir(parents=True)
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


def test_outside_git_editor_and_os_litter_does_not_change_the_hash(tmp_path) -> None:
    """Not a git checkout (tmp_path): every file counts but hidden names and __pycache__ (review finding:
    a swap file or .DS_Store made the browser test rewrite docs/dashboard.png)."""
    directory = a_dashboard(tmp_path)
    assert dp.tracked_files(directory) is None  # the fallback is what is tested here
    before = dp.sources_hash(directory)
    (directory / ".app.js.swp").write_bytes(b"b0VIM 9.0\x00\x01")
    (directory / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__" / "x.pyc").write_bytes(b"\x6f\x0d\x0d\x0a")
    (directory / ".cache").mkdir()
    (directory / ".cache" / "state").write_text("{}")
    assert dp.sources_hash(directory) == before
    assert sorted(dp.all_files(directory)) == ["app.js", "index.html", "style.css"]
    (directory / "logo.svg").write_text("<svg/>")  # a new file that is not litter counts
    assert dp.sources_hash(directory) != before


def test_a_crlf_checkout_hashes_as_lf(tmp_path) -> None:
    lf, crlf = a_dashboard(tmp_path / "lf"), a_dashboard(tmp_path / "crlf")
    for directory, end in ((lf, b"\n"), (crlf, b"\r\n")):
        (directory / "app.js").write_bytes(end.join([b"const a = 1;", b"console.log(a);", b""]))
    assert (crlf / "app.js").read_bytes() != (lf / "app.js").read_bytes()
    assert dp.sources_hash(crlf) == dp.sources_hash(lf)


def git(directory: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=directory, check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_in_a_git_checkout_only_tracked_files_count(tmp_path) -> None:
    """dashboard/ in a git checkout: what git tracks there is hashed; an untracked file (a new one not
    added yet, or litter the fallback would not know of) is not, until it is added."""
    repo = tmp_path / "repo"
    directory = a_dashboard(repo)
    git(repo, "init", "-q")
    outside = dp.sources_hash(a_dashboard(tmp_path / "elsewhere"))  # the same files, not in a checkout
    (repo / "README.md").write_text("not the dashboard")
    git(repo, "add", "dashboard", "README.md")
    assert sorted(dp.tracked_files(directory)) == ["app.js", "index.html", "style.css"]
    tracked = dp.sources_hash(directory)
    assert tracked == outside  # git or not, the same sources hash the same

    (directory / "notes.txt").write_text("untracked")
    (directory / "app.js~").write_text("an editor's backup")
    assert dp.sources_hash(directory) == tracked
    git(repo, "add", "dashboard/notes.txt")
    assert dp.sources_hash(directory) != tracked

    (directory / "notes.txt").unlink()  # deleted from the work tree, still in the index: left out
    assert dp.sources_hash(directory) == tracked


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_the_real_dashboard_is_hashed_from_git_when_it_is_a_checkout() -> None:
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True)
    if inside.returncode != 0:
        pytest.skip("not a git checkout")
    assert {"index.html", "app.js", "style.css"} <= set(dp.tracked_files() or [])


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


def test_what_the_browser_test_does_with_the_picture(tmp_path) -> None:
    """KEEP a current picture; a stale one is RETAKEn outside CI and FAILs in CI, unless the retake is
    asked for (FASTINFER_RETAKE_DASHBOARD_PICTURE=1 is an explicit request, in CI too)."""
    directory, picture = a_dashboard(tmp_path), tmp_path / "dashboard.png"
    dp.save(a_screenshot()[0], picture, digest=dp.sources_hash(directory))

    def decide(**env: str) -> tuple[str, str | None]:
        return dp.decide(picture, directory, env=env)

    assert decide() == (dp.KEEP, None)
    assert decide(CI="1") == (dp.KEEP, None)
    assert decide(CI="true") == (dp.KEEP, None)
    assert decide(**{dp.RETAKE: "1"}) == (dp.RETAKE_IT, f"{dp.RETAKE}=1")
    assert decide(CI="1", **{dp.RETAKE: "1"}) == (dp.RETAKE_IT, f"{dp.RETAKE}=1")

    (directory / "style.css").write_text("body { color: #111; }")  # the page changed: stale
    what, reason = decide()
    assert what == dp.RETAKE_IT and "dashboard/ changed" in reason
    assert decide(CI="") == (dp.RETAKE_IT, reason)  # CI set but empty: not CI
    assert decide(CI="false") == decide(CI="0") == (dp.RETAKE_IT, reason)  # said off: not CI
    assert decide(CI="1") == (dp.FAIL, reason)
    assert decide(CI="true", **{dp.RETAKE: "0"}) == (dp.FAIL, reason)
    assert decide(CI="1", **{dp.RETAKE: "1"}) == (dp.RETAKE_IT, f"{dp.RETAKE}=1")

    picture.unlink()
    assert decide(CI="1") == (dp.FAIL, "dashboard.png is missing")
    assert decide()[0] == dp.RETAKE_IT


def test_the_failure_says_why_and_how_to_retake() -> None:
    message = dp.stale_message("dashboard/ changed (recorded abc, now def)")
    assert message == (
        "docs/dashboard.png is stale (dashboard/ changed (recorded abc, now def)) — run "
        "`FASTINFER_RETAKE_DASHBOARD_PICTURE=1 .venv/bin/python -m pytest tests/e2e/test_dashboard.py -k end_to_end`"
        " locally and commit it"
    )


def test_the_committed_picture_records_the_sources_it_shows() -> None:
    """docs/dashboard.png is in the repository with its hash; whether that is today's dashboard/ is the
    browser test's business (it retakes the picture and warns, or fails in CI; not here)."""
    assert dp.recorded_hash() is not None, "docs/dashboard.png is missing or records no hash: run the browser test"


def test_a_picture_claiming_absurd_dimensions_is_unreadable_not_a_crash(tmp_path) -> None:
    """Pillow refuses a PNG whose header claims 100000×100000 pixels (DecompressionBombError, not an
    OSError): the picture then records no hash, and in CI that fails the test with its message."""
    directory, picture = a_dashboard(tmp_path), tmp_path / "dashboard.png"
    dp.save(a_screenshot()[0], picture, digest=dp.sources_hash(directory))
    data = bytearray(picture.read_bytes())
    data[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR's width and height, then its CRC again
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    picture.write_bytes(bytes(data))
    assert dp.recorded_hash(picture) is None
    assert dp.decide(picture, directory, env={"CI": "1"}) == (dp.FAIL, "dashboard.png records no hash of dashboard/")
