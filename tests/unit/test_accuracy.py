"""Accuracy on the user's labelled photos: the eval folder reader, the top-k maths, the build's wiring of its gate
and ``fastinfer evaluate`` in process, on the real PyTorch export of the test store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
import pytest
from PIL import Image

from build_models.accuracy_gate import AccuracyGate, BadAccuracyDrop, max_drop
from fastinfer import cli
from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.common import hardware
from fastinfer.common.home import bentoml_home
from fastinfer.measure import accuracy
from fastinfer.measure.accuracy import EvalDirError
from tests.settings import settings_with
from tests.unit.test_build_gate import Answering

LABELS = ["bird", "cat", "dog", "fish"]
COLOURS = {"cat": (200, 40, 40), "dog": (40, 200, 40), "fish": (40, 40, 200)}


def photo_folder(root: Path, per_class: int = 4, classes: Mapping[str, tuple[int, int, int]] = COLOURS) -> Path:
    """ImageFolder layout: ``per_class`` PNG/JPEG photos of varied sizes in a folder per class."""
    for c, (name, colour) in enumerate(classes.items()):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            img = Image.new("RGB", (240 + 17 * i, 260 + 11 * c), colour)
            img.save(root / name / (f"{i}.png" if i % 2 else f"{i}.jpg"))
    return root


# --- the folder reader -------------------------------------------------------------------------------


def test_folders_match_labels_in_label_order_and_labels_without_a_folder_are_not_evaluated(tmp_path) -> None:
    root = photo_folder(tmp_path / "eval")
    images = accuracy.load(root, LABELS, PreprocessSpec())
    assert images.pixels.shape == (12, 224, 224, 3) and images.pixels.dtype == np.uint8
    # The target is the class's index among the labels (not among the folders): cat=1, dog=2, fish=3.
    assert images.targets.tolist() == [1] * 4 + [2] * 4 + [3] * 4
    assert images.unevaluated == ["bird"] and images.skipped == []
    assert [p.parent.name for p in images.files] == ["cat"] * 4 + ["dog"] * 4 + ["fish"] * 4
    # The family's preprocessing is what the photos go through.
    assert accuracy.load(root, LABELS, PreprocessSpec(resize_size=160, crop_size=128)).pixels.shape == (12, 128, 128, 3)


def test_a_folder_that_is_not_a_label_is_one_line_naming_it(tmp_path) -> None:
    root = photo_folder(tmp_path / "eval", classes={**COLOURS, "Dog": (1, 2, 3), "zebra": (9, 9, 9)})
    with pytest.raises(EvalDirError) as err:
        accuracy.scan(root, LABELS)
    message = str(err.value)
    assert "\n" not in message and "2 class folder(s)" in message and "'Dog'" in message and "'zebra'" in message
    assert "'cat'" in message  # the labels it could have been


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda root: None, "does not exist"),
        (lambda root: root.write_text("x"), "is not a directory"),
        (lambda root: root.mkdir(), "has no class folders"),
        (lambda root: (root / ".hidden").mkdir(parents=True), "has no class folders"),
        (lambda root: (root / "cat").mkdir(parents=True), "hold no files"),
        (
            lambda root: (root / "cat").mkdir(parents=True) or (root / "cat" / "a.jpg").write_bytes(b"garbage"),
            r"none of its 1 file\(s\) could be decoded",
        ),
    ],
)
def test_a_missing_or_empty_folder_is_one_line(tmp_path, make, said) -> None:
    root = tmp_path / "eval"
    make(root)
    with pytest.raises(EvalDirError, match=said) as err:
        accuracy.load(root, LABELS, PreprocessSpec())
    assert "\n" not in str(err.value)


def test_undecodable_files_are_skipped_and_counted_with_their_path_and_why(tmp_path) -> None:
    root = photo_folder(tmp_path / "eval", per_class=2)
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    (root / "dog" / "empty.png").write_bytes(b"")
    (root / "fish" / "notes.txt").write_text("not a photo")
    (root / "README.md").write_text("outside any class folder")
    (root / "fish" / ".DS_Store").write_bytes(b"\0\1")  # hidden: not a photo, not counted
    images = accuracy.load(root, LABELS, PreprocessSpec())
    assert len(images.targets) == 6 and images.targets.tolist() == [1, 1, 2, 2, 3, 3]
    skipped = {Path(s.path).name: s.why for s in images.skipped}
    assert set(skipped) == {"broken.jpg", "empty.png", "notes.txt", "README.md"}
    assert "empty" in skipped["empty.png"] and skipped["README.md"] == "not inside a class folder"


# --- top-k maths -------------------------------------------------------------------------------------


def test_top1_and_top5_on_hand_made_logits() -> None:
    logits = np.zeros((4, 8), dtype=np.float32)
    logits[0, 3] = 9  # target 3: top-1
    logits[1, [0, 1, 2, 4, 5]] = [9, 8, 7, 6, 5]  # target 5: fifth, in the top-5
    logits[2, [0, 1, 2, 4, 5, 6]] = [9, 8, 7, 6, 5, 4]  # target 6: sixth, missed
    logits[3, 7] = 1  # target 2: among the 0 ties after class 7, and ties go to the lower index: 0, 1, 2
    result = accuracy.accuracy(logits, np.array([3, 5, 6, 2]))
    assert (result.images, result.top1, result.top5) == (4, 0.25, 0.75)


def test_top5_with_fewer_than_five_classes_is_top_c() -> None:
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.3]])
    assert accuracy.accuracy(logits, np.array([2, 2])).top5 == 1.0  # every class is among the top-3
    assert accuracy.ranked(logits).tolist() == [[1, 0, 2], [0, 2, 1]]


def test_ranked_answers_give_the_same_figures_as_logits() -> None:
    rng = np.random.default_rng(0)
    logits, targets = rng.normal(size=(50, 10)), rng.integers(0, 10, size=50)
    served = [list(row) for row in accuracy.ranked(logits)]  # what a server's top_k indices say
    assert accuracy.ranked_accuracy(served, targets) == accuracy.accuracy(logits, targets)
    with pytest.raises(ValueError, match="no images"):
        accuracy.accuracy(np.zeros((0, 3)), np.array([], dtype=int))


# --- the build's gate on real photos (its decisions: test_build_gate.py) -----------------------------


def test_the_table_is_printed_and_written_as_json(tmp_path) -> None:
    root = photo_folder(tmp_path / "eval")
    (root / "dog" / "bad.jpg").write_bytes(b"nope")
    images = accuracy.load(root, LABELS, PreprocessSpec())
    reference = accuracy.accuracy(np.eye(len(LABELS))[images.targets], images.targets)
    onnx = Answering([1] * 4 + [2] * 4 + [3] * 4, 4)
    gate = AccuracyGate(images, reference, images.targets, 1.0, tmp_path / "accuracy.json", lambda line: None,
                        open=lambda backend, dirs: onnx)  # fmt: skip
    gate.check("x-onnx", "onnx", None, tmp_path)
    gate.finish()
    written = json.loads((tmp_path / "accuracy.json").read_text())
    assert written["images"] == 12 and written["skipped"] == 1 and written["unevaluated_labels"] == ["bird"]
    assert written["skipped_files"][0]["path"].endswith("bad.jpg")
    assert [r["backend"] for r in written["rows"]] == ["x-onnx"] and written["rows"][0]["top1"] == 1.0
    assert written["max_accuracy_drop_pp"] == 1.0


@pytest.mark.parametrize("text", ["-1", "101", "nan", "lots"])
def test_a_bad_max_accuracy_drop_is_one_line(text) -> None:
    with pytest.raises(BadAccuracyDrop, match="percentage points"):
        max_drop(text)
    assert max_drop(None) == 1.0 and max_drop("2.5") == 2.5


# --- the real build and `fastinfer evaluate` over the test store -------------------------------------

IMAGENET = {"tabby": (150, 120, 90), "Egyptian cat": (120, 110, 100)}  # labels of the `random` build (ImageNet's)


FAMILY = "accuracy-test"  # a family of its own: the test store's resnet50 models stay as other tests built them
# The builds' photos at 64 px (PyTorch runs on each, and is timed): the wiring is tested here, not the image size.
SMALL = PreprocessSpec(resize_size=64, crop_size=64)


@pytest.fixture(scope="module")
def measured_build(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A family's PyTorch model built with --eval-dir into the test store (seconds: no other export is made);
    removed afterwards."""
    from build_models import build

    work = tmp_path_factory.mktemp("accuracy-build")
    root = photo_folder(work / "eval", per_class=3, classes=IMAGENET)
    (root / "tabby" / "broken.jpg").write_bytes(b"\xff\xd8 broken")
    said: list[str] = []
    build("random", only=["pytorch"], progress=said.append, family=FAMILY, eval_dir=root, preprocess=SMALL)
    model = bentoml.models.get(f"{FAMILY}-pytorch:latest")
    table = bentoml_home() / "artifacts" / FAMILY / "accuracy.json"  # beside the family, in the store's home
    yield {"root": root, "said": said, "model": model, "json": json.loads(table.read_text())}
    for stored in bentoml.models.list(f"{FAMILY}-pytorch"):
        bentoml.models.delete(stored.tag)


def test_the_build_records_accuracy_in_the_stored_model_and_prints_the_table(measured_build) -> None:
    recorded = measured_build["model"].info.metadata["accuracy"]
    assert recorded["images"] == 6 and recorded["skipped"] == 1 and recorded["precision"] == "fp32"
    assert recorded["eval_dir"] == str(measured_build["root"].resolve())
    # The stored export answers as the weights it was made from did.
    assert (recorded["top1"], recorded["top5"]) == (recorded["reference_top1"], recorded["reference_top5"])
    rows = {r["backend"]: r for r in measured_build["json"]["rows"]}
    assert rows[f"{FAMILY}-pytorch"]["top1"] == recorded["top1"] and rows[f"{FAMILY}-pytorch"]["drop_pp"] == 0
    assert any(line.startswith("| backend | precision |") for line in measured_build["said"])


def test_a_bad_eval_folder_stops_the_build_before_anything_is_stored(measured_build, tmp_path) -> None:
    from build_models import build

    root = photo_folder(tmp_path / "eval", per_class=1, classes={"tabby": (1, 2, 3), "not-a-class": (3, 2, 1)})
    before = sorted(str(m.tag) for m in bentoml.models.list(f"{FAMILY}-pytorch"))
    with pytest.raises(EvalDirError, match="'not-a-class'"):
        build("random", only=["pytorch"], force=True, progress=lambda m: None, family=FAMILY, eval_dir=root)
    assert sorted(str(m.tag) for m in bentoml.models.list(f"{FAMILY}-pytorch")) == before


def test_the_build_command_says_a_bad_eval_folder_in_one_line(measured_build, tmp_path, capsys) -> None:
    from build_models.__main__ import main

    args = ["--weights", "random", "--only", "pytorch", "--name", FAMILY, "--eval-dir", str(tmp_path / "nowhere")]
    assert main(args) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the build's own log lines, if any
    assert last.startswith("build_models: eval folder") and last.endswith("does not exist")


@pytest.mark.heavy  # three model builds
def test_a_refused_model_does_not_stop_the_build_of_the_others(tmp_path, capsys, monkeypatch) -> None:
    """Every step runs real exports, verification and engines, but for the refused model's accuracy: a
    stand-in for its engine (any real INT8 export of a random init answers as PyTorch does) answers a
    class no photo is of. The refusal is said at once, the next backend built and stored, the table
    written, and the build's last line names the refused model: exit 1."""
    import torch

    from build_models.__main__ import main
    from build_models.labels import imagenet_categories
    from build_models.weights import load_weights
    from fastinfer.engines.torch_model import resnet50

    family = "carryon"
    photos = photo_folder(tmp_path / "eval" / "staging", per_class=4, classes={"a": (90, 60, 30), "b": (30, 60, 90)})
    images = accuracy.load(photos, ["a", "b"], SMALL)  # as the build below reads them
    with torch.inference_mode():  # the classes PyTorch answers: the reference is then right on every photo
        best = resnet50(load_weights("random").state_dict)(torch.from_numpy(images.pixels)).numpy().argmax(1)
    root = tmp_path / "eval" / "photos"
    for i, (path, answer) in enumerate(zip(images.files, best, strict=True)):
        folder = root / imagenet_categories()[int(answer)]
        folder.mkdir(parents=True, exist_ok=True)
        path.rename(folder / f"{i}{path.suffix}")
    prepare = AccuracyGate.prepare.__func__

    def with_a_losing_int8(cls, *args: Any, **kwargs: Any) -> AccuracyGate:
        gate = prepare(cls, *args, **kwargs)
        served = gate.open
        losing = Answering([(int(t) + 1) % 1000 for t in gate.images.targets], 1000)
        gate.open = lambda backend, dirs: losing if backend == "onnx-int8-dynamic" else served(backend, dirs)
        return gate

    monkeypatch.setattr(AccuracyGate, "prepare", classmethod(with_a_losing_int8))
    table = tmp_path / "out" / "accuracy.json"
    argv = ["--weights", "random", "--name", family, "--only", "onnx-int8-dynamic,openvino", "--resize", "64"]
    argv += ["--crop", "64"]  # SMALL
    try:
        assert main([*argv, "--eval-dir", str(root), "--out", str(table.parent)]) == 1
        out, err = capsys.readouterr()
        last = err.strip().splitlines()[-1]
        assert last.startswith("build_models: 1 model(s) refused") and last.endswith(f": {family}-onnx-int8-dynamic")
        refusal = out.index(f"[1/2] {family}-onnx-int8-dynamic: REFUSED: ")
        assert "top-1 0.00% at int8" in out[refusal:] and refusal < out.index(f"[2/2] {family}-openvino: exporting")
        assert f"[2/2] {family}-openvino: stored" in out, out
        assert f"| {family}-onnx-int8-dynamic | refused | top-1 0.00% at int8" in out  # the table it ends with
        assert store.versions(f"{family}-onnx-int8-dynamic") == []
        rows = {row["backend"]: row for row in json.loads(table.read_text())["rows"]}
        assert rows[f"{family}-onnx-int8-dynamic"]["status"] == "refused"
        assert rows[f"{family}-openvino"]["status"] == "measured"
    finally:
        for tag in store.versions(f"{family}-openvino"):
            bentoml.models.delete(tag)


def test_evaluate_measures_what_is_stored_and_agrees_with_the_build(measured_build, tmp_path, capsys) -> None:
    out, plot = tmp_path / "evaluate.json", tmp_path / "evaluate.png"
    args = ["evaluate", str(measured_build["root"]), "--model", FAMILY, "--backends", "pytorch,coreml-batched"]
    assert cli.main([*args, "--json", str(out), "--plot", str(plot), "--seconds", "0"]) == 0  # accuracy alone
    report = json.loads(out.read_text())
    rows = {r["backend"]: r for r in report["rows"]}
    recorded = measured_build["model"].info.metadata["accuracy"]
    assert rows["pytorch"]["status"] == "measured" and rows["pytorch"]["images"] == 6
    assert (rows["pytorch"]["top1"], rows["pytorch"]["top5"]) == (recorded["top1"], recorded["top5"])
    if not hardware.is_macos():
        assert rows["coreml-batched"]["status"] == "not measured" and "macOS" in rows["coreml-batched"]["note"]
    assert report["skipped"] == 1 and report["family"] == FAMILY and plot.stat().st_size > 0
    captured = capsys.readouterr()
    assert "| pytorch | fp32 | 6 |" in captured.out and "pytorch: 6/6 images" in captured.err


@pytest.mark.parametrize(
    ("extra", "said", "other_labels"),
    [
        (["--model", FAMILY, "--backends", "pytorch,tensorflow"], "unknown 'tensorflow'", False),
        (["--model", "nosuch"], "holds no model of family 'nosuch'", False),
        (["--model", "Bad Name"], "cannot name a model family", False),
        (["--model", FAMILY], "not among the family's 1000 labels: 'cat'", True),  # a folder of other labels
    ],
)
def test_evaluate_says_what_is_wrong_in_one_line(
    measured_build, tmp_path, capsys, monkeypatch, extra, said, other_labels
) -> None:
    monkeypatch.delenv("FASTINFER_MODEL", raising=False)
    out = ["--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "e.png")]
    root = photo_folder(tmp_path / "eval", per_class=1) if other_labels else measured_build["root"]
    assert cli.main(["evaluate", str(root), *extra, *out]) == 1
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err and err.startswith("fastinfer evaluate: ")
    assert not (tmp_path / "e.json").exists() and "FASTINFER_MODEL" not in os.environ  # --model: for the call only


def test_evaluate_names_the_family_as_the_user_named_it(measured_build, tmp_path, capsys, monkeypatch) -> None:
    """--model nosuch is said as --model, FASTINFER_MODEL=nosuch as the variable; "evaluate", not "serve"."""
    out = ["--json", str(tmp_path / "e.json"), "--plot", str(tmp_path / "e.png")]
    monkeypatch.delenv("FASTINFER_MODEL", raising=False)
    assert cli.main(["evaluate", str(measured_build["root"]), "--model", "nosuch", *out]) == 1
    err = capsys.readouterr().err.strip()
    assert "(--model nosuch)" in err and "FASTINFER_MODEL" not in err and "or evaluate one it holds (--model " in err
    monkeypatch.setenv("FASTINFER_MODEL", "nosuch")
    assert cli.main(["evaluate", str(measured_build["root"]), *out]) == 1
    err = capsys.readouterr().err.strip()
    assert "(FASTINFER_MODEL=nosuch)" in err and "--model" not in err and "serve one" not in err


def test_evaluate_passes_the_family_on_and_leaves_the_environment_alone(measured_build, monkeypatch) -> None:
    from fastinfer.measure import evaluate as ev

    monkeypatch.delenv("FASTINFER_MODEL", raising=False)
    seen: list[str | None] = []

    def progress(*_: object) -> None:
        seen.append(os.getenv("FASTINFER_MODEL"))

    report = ev.evaluate(measured_build["root"], "pytorch", progress=progress, family_name=FAMILY,
                         timing=ev.Timing(seconds=0))  # fmt: skip
    assert report.rows[0].status == "measured" and report.report.extra["family"] == FAMILY
    assert seen and set(seen) == {None}  # never set while it ran, not only restored afterwards


def test_a_photo_over_the_server_s_pixel_limit_is_skipped_as_the_server_skips_it(tmp_path, monkeypatch) -> None:
    from fastinfer.catalog.config import get_settings

    root = photo_folder(tmp_path / "eval", per_class=1)  # at most 291×282 pixels
    Image.new("RGB", (400, 300), (9, 9, 9)).save(root / "cat" / "large.png")
    settings_with(monkeypatch, FASTINFER_MAX_PIXELS="100000")  # and get_settings() reads it afresh
    images = accuracy.load(root, LABELS, PreprocessSpec())
    assert len(images.targets) == 3
    (large,) = images.skipped
    assert large.path.endswith("large.png") and "FASTINFER_MAX_PIXELS" in large.why
    get_settings.cache_clear()
    monkeypatch.setenv("FASTINFER_MAX_PIXELS", "lots")
    with pytest.raises(EvalDirError, match="FASTINFER_MAX_PIXELS"):
        accuracy.load(root, LABELS, PreprocessSpec())


def test_dangling_symlinks_and_symlinked_sub_folders_are_counted_as_skipped(tmp_path) -> None:
    root = photo_folder(tmp_path / "eval", per_class=1)
    elsewhere = photo_folder(tmp_path / "elsewhere", per_class=1)
    (root / "cat" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "dog" / "more").symlink_to(elsewhere / "dog", target_is_directory=True)
    (root / "loose.png").symlink_to(tmp_path / "nowhere.png")
    (root / "fish" / "linked.png").symlink_to(elsewhere / "fish" / "0.jpg")  # a link to a photo: read
    os.mkfifo(root / "fish" / "pipe")
    images = accuracy.load(root, LABELS, PreprocessSpec())
    assert len(images.targets) == 4
    skipped = {str(Path(s.path).relative_to(root)): s.why for s in images.skipped}
    assert skipped == {
        "cat/gone.jpg": "a dangling symlink: its target is gone",
        "dog/more": "a symlink to a folder: not followed",
        "loose.png": "a dangling symlink: its target is gone",
        "fish/pipe": "not a regular file",
    }


def test_a_fifo_or_a_device_named_as_a_photo_is_skipped_never_read(tmp_path) -> None:
    """A FIFO named x.png blocked the eval folder's and calibration's reader for ever."""
    import os

    from fastinfer.measure.photos import UnusablePhoto, photo_pixels

    os.mkfifo(tmp_path / "x.png")
    (tmp_path / "z.png").symlink_to("/dev/zero")
    for name in ("x.png", "z.png"):
        with pytest.raises(UnusablePhoto, match="not a regular file"):
            photo_pixels(tmp_path / name, PreprocessSpec(), 50_000_000)
