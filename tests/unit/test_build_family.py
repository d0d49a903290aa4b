"""A model family from the user's own files, build side: weights with any number of classes, labels in every
common layout, the family's name and preprocessing, each refused in one line when it cannot be, before anything
is stored; and a real small build of a 3-class family at crop 64."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from build_models import BadPreprocessing, build, preprocess_spec
from build_models.context import family_hash
from build_models.labels import BadLabels, family_labels, imagenet_categories, read_labels, text_labels
from build_models.weights import NotResNet50Weights, load_weights, state_hash
from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec
from fastinfer.measure import photos
from tests.conftest import CLASSES, three_class_state
from tests.family_data import build_here

pytestmark = pytest.mark.heavy  # model builds

# The small build's preprocessing: none of it ImageNet's, so that each must travel to be right; small photos (the
# builds run PyTorch and ONNX Runtime on them).
MEAN, STD, RESIZE, CROP = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), 72, 64
# Where a build's words are tested, not its image size: photos of 64 px (the build runs PyTorch on 8 of them
# before its first export; ~12x cheaper than at ImageNet's 224).
SMALL = PreprocessSpec(resize_size=64, crop_size=64)


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return three_class_state()


def one_line_refusal(argv: list[str], capsys) -> str:
    """``python -m build_models argv``'s refusal: exit 1, one line on stderr, no traceback."""
    from build_models.__main__ import main

    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("build_models: ") and "\n" not in err and "Traceback" not in err, err
    return err


# --- weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wrap",
    [
        lambda sd: sd,
        lambda sd: {"state_dict": sd, "epoch": 7},
        lambda sd: {"model": sd, "optimizer": {"lr": 0.1}},
        lambda sd: {f"module.{k}": v for k, v in sd.items()},
        lambda sd: {"state_dict": {f"module.{k}": v for k, v in sd.items()}},
    ],
    ids=["plain", "under state_dict", "under model", "DataParallel prefixes", "checkpoint of DataParallel"],
)
def test_weights_with_any_number_of_classes_are_accepted(state, tmp_path, wrap) -> None:
    path = tmp_path / "w.pth"
    torch.save(wrap(state), path)
    w = load_weights(str(path))
    assert (w.kind, w.num_classes) == ("file", 3)
    assert w.source_hash == state_hash(state)
    assert "3 classes" in w.description


def test_imagenet_choices_keep_1000_classes() -> None:
    assert load_weights("random").num_classes == 1000


def with_fc(make):
    """The 3-class state with its final layer's weight made by ``make`` from the real one."""
    return lambda: {**(state := three_class_state()), "fc.weight": make(state["fc.weight"])}


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: b"", "not a readable torch file"),
        (lambda: {"a": 1, "b": "x"}, "tensors 320 missing"),
        (lambda: {}, "tensors 320 missing"),
        (
            lambda: {**load_weights("random").state_dict, "conv1.weight": torch.zeros(64, 3, 3, 3)},
            "1 of the wrong shape (e.g. conv1.weight [64, 3, 3, 3], expected [64, 3, 7, 7])",
        ),
        (lambda: __import__("torchvision").models.resnet18(num_classes=3).state_dict(), "is not a ResNet-50"),
        (lambda: {**three_class_state(), "fc.bias": torch.zeros(4)}, "fc.bias [4], expected [3]"),
        (
            lambda: {**three_class_state(), "fc.weight": torch.zeros(1, 2048), "fc.bias": torch.zeros(1)},
            "has 1 class; a classifier needs at least 2",
        ),
        (
            lambda: {**three_class_state(), "fc.weight": torch.zeros(0, 2048), "fc.bias": torch.zeros(0)},
            "has 0 classes; a classifier needs at least 2",
        ),
        (with_fc(lambda fc: fc[..., None]), "fc.weight is [3, 2048, 1]; a ResNet-50's is 2-D, [classes, 2048]"),
        (lambda: __import__("torchvision").models.resnet50(num_classes=3), "holds a pickled torchvision"),
        (with_fc(lambda fc: torch.full_like(fc, float("nan"))), "tensor fc.weight holds"),
        (
            lambda: {**three_class_state(), "layer2.0.bn1.running_var": torch.full((128,), float("inf"))},
            "tensor layer2.0.bn1.running_var holds 128 of 128 values that are NaN or infinite",
        ),
        (with_fc(lambda fc: fc.to_sparse()), "tensor fc.weight is torch.sparse_coo, not a dense tensor"),
        (with_fc(lambda fc: fc.to_sparse_csr()), "tensor fc.weight is torch.sparse_csr, not a dense tensor"),
        (
            with_fc(lambda fc: torch.empty(fc.shape, device="meta")),
            "tensor fc.weight holds no values (a meta-device tensor)",
        ),
        (with_fc(lambda fc: torch.quantize_per_tensor(fc, 0.01, 0, torch.qint8)), "tensor fc.weight is quantized"),
        (with_fc(lambda fc: fc.to(torch.complex64)), "tensor fc.weight holds torch.complex64, not floating-point"),
        (with_fc(lambda fc: fc > 0), "tensor fc.weight holds torch.bool, not floating-point numbers"),
    ],
    ids=[
        "empty file",
        "dict of non-tensors",
        "empty dict",
        "one tensor misshapen",
        "resnet18",
        "fc weight and bias disagree",
        "one class",
        "no class",
        "a 3-D final layer",
        "a whole pickled model",
        "a NaN final layer",
        "an infinite BatchNorm variance",
        "sparse",
        "sparse CSR",
        "meta device",
        "quantized",
        "complex",
        "bool",
    ],
)
@pytest.mark.filterwarnings("ignore")  # torch warns as it saves sparse and quantized tensors
def test_other_weights_are_refused_in_one_line(tmp_path, capsys, labels_file, make, says: str) -> None:
    """They ended the build in tracebacks (EOFError, AttributeError from hashing, a torch key dump)."""
    path = tmp_path / "w.pth"
    if isinstance(content := make(), bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(NotResNet50Weights, match=re.escape(says)):
        load_weights(str(path))
    argv = ["--weights", str(path), "--labels", str(labels_file), "--name", "refused", "--only", "pytorch"]
    assert says in one_line_refusal(argv, capsys)
    assert store.versions("refused-pytorch") == []


# --- labels ----------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "name, text",
    [
        ("labels.txt", "red\n  green \nblue\n\n\n"),
        ("labels", "\ufeffred\r\ngreen\r\nblue"),  # a BOM and Windows line ends, no suffix
        ("labels.json", json.dumps(CLASSES)),
        ("labels.json", json.dumps({"2": "blue", "0": "red", "1": "green"})),
        ("index_to_name.json", json.dumps({"0": ["n1", "red"], "1": ["n2", "green"], "2": ["n3", "blue"]})),
    ],
    ids=["text", "text with BOM and CRLF", "JSON list", "JSON object", "TorchServe index_to_name"],
)
def test_label_files(tmp_path, name: str, text: str) -> None:
    assert family_labels(write(tmp_path, name, text), 3) == CLASSES


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c"])
def test_a_text_file_is_split_at_newlines_only(separator: str) -> None:
    """str.splitlines would make two labels of one holding any of these: the count then lies."""
    assert text_labels(f"red\ngre{separator}en\nblue\n") == ["red", f"gre{separator}en", "blue"]


def test_an_imagefolder_directory_is_read_in_imagefolders_own_order(tmp_path) -> None:
    from torchvision.datasets.folder import find_classes

    for folder in ("zebra", "Apple", "mango", "_other", "10", "9"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notes.txt").write_text("a file, not a class")
    labels = read_labels(tmp_path)
    assert labels == find_classes(str(tmp_path))[0]
    assert labels == ["10", "9", "Apple", "_other", "mango", "zebra"]


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("labels.txt", "red\ngreen\nblue\nyellow\n", "names 4 classes, but the weights' final layer has 3"),
        ("labels.txt", "red\n\nblue\n", "1 empty label(s), at line 2"),
        ("labels.txt", "red\ngreen\nred\n", "line 3: 'red' is line 1's too (each label once)"),
        ("labels.json", json.dumps(["red", "green", "green"]), "class index 2: 'green' is class index 1's too"),
        ("labels.json", json.dumps({"1": "red", "2": "green", "3": "blue"}), "needs the keys 0..2"),
        ("labels.json", json.dumps(["red", 2, "blue"]), "every label must be a string"),
        ("labels.json", "[red, green]", "is not valid JSON"),
        ("labels.json", json.dumps("red"), "a list of names or an object"),
        ("labels.txt", "red\ngr\x00een\nblue\n", "line 2: the label holds the control character '\\x00'"),
        ("labels.txt", "red\ngr\u2028een\nblue\n", "line 2: the label holds the control character '\\u2028'"),
        ("labels.json", json.dumps(["red", "green", "bl\tue"]), "class index 2: the label holds the control character"),
        ("labels.txt", f"red\n{'g' * 201}\nblue\n", "line 2: the label is 201 characters long"),
    ],
    ids=[
        "count",
        "empty",
        "duplicate",
        "JSON duplicate",
        "JSON keys",
        "JSON non-string",
        "bad JSON",
        "JSON str",
        "NUL",
        "line separator",
        "tab",
        "too long",
    ],
)
def test_bad_labels_are_refused_in_one_line_and_nothing_is_stored(
    tmp_path, capsys, weights_file, name: str, text: str, says: str
) -> None:
    labels = write(tmp_path, name, text)
    with pytest.raises(BadLabels, match=re.escape(says)):
        family_labels(labels, 3)
    argv = ["--weights", str(weights_file), "--labels", str(labels), "--name", "refused", "--only", "pytorch"]
    assert says in one_line_refusal(argv, capsys)
    assert store.versions("refused-pytorch") == []


def test_without_labels_only_imagenets_class_count_gets_imagenets_labels(tmp_path, capsys, weights_file) -> None:
    assert family_labels(None, 1000) == imagenet_categories() and imagenet_categories()[0] == "tench"
    with pytest.raises(BadLabels, match="the weights have 3 classes, not ImageNet's 1000: name them with --labels"):
        family_labels(None, 3)
    assert "--labels" in one_line_refusal(["--weights", str(weights_file), "--name", "refused"], capsys)
    with pytest.raises(BadLabels, match="no such file"):
        family_labels(tmp_path / "absent.txt", 3)


# --- family name and preprocessing -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["My Model", "UPPER", "-dash", "a" * 41, "a/b", ""])
def test_a_family_name_bentoml_cannot_store_is_refused_in_one_line(capsys, name: str) -> None:
    assert "cannot name a model family" in one_line_refusal(["--weights", "random", f"--name={name}"], capsys)


def test_the_default_preprocessing_is_the_imagenet_weights_own() -> None:
    from torchvision.models import ResNet50_Weights

    t = ResNet50_Weights.IMAGENET1K_V2.transforms()
    spec = preprocess_spec()
    assert spec == PreprocessSpec()
    assert (spec.resize_size, spec.crop_size) == (t.resize_size[0], t.crop_size[0])
    assert (list(spec.mean), list(spec.std)) == (list(t.mean), list(t.std))


def test_preprocessing_flags_are_parsed() -> None:
    from build_models.__main__ import family_preprocess, main  # noqa: F401 (main: the parser's home)

    args = type("Args", (), {"mean": "0.5, 0.4,0.3", "std": "0.2,0.25,0.3", "resize": "72", "crop": "64"})()
    assert family_preprocess(args) == PreprocessSpec(RESIZE, CROP, MEAN, STD)
    none = type("Args", (), {"mean": None, "std": None, "resize": None, "crop": "200"})()
    assert family_preprocess(none) == PreprocessSpec(crop_size=200)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--std", "0.2,0,0.2"], "--std 0.2,0,0.2: each must be at least 0.001"),
        (["--std", "1e-30,1,1"], "--std 1e-30,1,1: each must be at least 0.001"),
        (["--std=-1,0.2,0.2"], "--std -1,0.2,0.2: each must be at least 0.001"),
        (["--mean", "0.5,0.5"], "--mean '0.5,0.5': three numbers R,G,B"),
        (["--mean", "a,b,c"], "--mean 'a,b,c': three numbers"),
        (["--mean", "0.5,nan,0.5"], "three finite numbers"),
        (["--mean", "124,117,104"], "so 0 to 1"),
        (["--crop", "16"], "--crop 16: the model's image side must be 32 to 1024"),
        (["--crop", "256"], "--resize 232: the shorter side is resized to it, then cropped to --crop 256"),
        (["--resize", "5000"], "must be 224 to 1024"),
        (["--resize", "big"], "--resize 'big': a whole number of pixels"),
        (["--crop", "\u0661\u0662\u0668"], "a whole number of pixels, in the digits 0-9"),  # Arabic-Indic 128
        (["--resize", "2_56"], "--resize '2_56': a whole number of pixels"),
        (["--max-accuracy-drop", "2"], "--max-accuracy-drop: only with --eval-dir DIR"),
        (["--accuracy-json", "a.json"], "--accuracy-json: only with --eval-dir DIR"),
        (["--max-accuracy-drop", "lots", "--eval-dir", "photos"], "--max-accuracy-drop 'lots': percentage points"),
    ],
)
def test_bad_preprocessing_is_refused_in_one_line(capsys, argv: list[str], says: str) -> None:
    """Said before anything else: not even the store's line is printed first."""
    from build_models.__main__ import main

    assert main(["--weights", "random", "--name", "refused", *argv]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("build_models: ") and err.count("\n") == 1 and says in err, (out, err)


def test_the_build_command_is_named_as_it_was_invoked(capsys) -> None:
    from fastinfer import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["build", "--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert help_text.startswith("usage: fastinfer build ") and "python -m build_models" not in help_text
    assert "--std=R,G,B" in help_text  # a value beginning with '-' is written so (argparse takes it for a flag)


def test_build_refuses_before_exporting(weights_file, labels_file) -> None:
    said: list[str] = []
    with pytest.raises(store.BadFamilyName):
        build(str(weights_file), family="Not OK", labels_path=labels_file, progress=said.append)
    with pytest.raises(BadPreprocessing):
        spec = PreprocessSpec(std=(0.2, -1, 0.2))
        build(str(weights_file), labels_path=labels_file, preprocess=spec, progress=said.append)
    assert not [line for line in said if "exporting" in line]


def test_every_source_of_the_models_is_in_their_hash() -> None:
    """Labels and preprocessing travel inside the stored models (their metadata, the graph's mean/std, the
    input shape): a change to any one must make the stored models out of date, not only new weights."""
    spec = PreprocessSpec(RESIZE, CROP, MEAN, STD)
    base = family_hash("w", CLASSES, spec)
    others = [
        family_hash("v", CLASSES, spec),
        family_hash("w", ["red", "blue", "green"], spec),
        family_hash("w", CLASSES, PreprocessSpec(RESIZE + 1, CROP, MEAN, STD)),
        family_hash("w", CLASSES, PreprocessSpec(RESIZE, CROP + 1, MEAN, STD)),
        family_hash("w", CLASSES, PreprocessSpec(RESIZE, CROP, (0.5, 0.4, 0.31), STD)),
        family_hash("w", CLASSES, PreprocessSpec(RESIZE, CROP, MEAN, (0.2, 0.25, 0.31))),
    ]
    assert len({base, *others}) == 1 + len(others) and base == family_hash("w", list(CLASSES), spec)


def said_until_the_first_step(weights: Path | str, **options) -> list[str]:
    """What a build says before its first step (stopped there: the tests need the words, not the models), of a
    family at the SMALL preprocessing unless ``options`` give one."""
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        if line.startswith("[1/"):
            raise InterruptedError

    with pytest.raises(InterruptedError):
        build(str(weights), progress=progress, **{"preprocess": SMALL, **options})
    return said


def test_int8_on_the_generic_photos_is_warned_about_for_a_family_of_ones_own(
    weights_file, labels_file, tmp_path, caplog, capsys
) -> None:
    options = {"only": ["onnx-int8"], "family": "warned", "labels_path": labels_file}
    warned = "calibrated on the bundled generic photos"
    said = said_until_the_first_step(weights_file, **options)
    warning = [line for line in said if warned in line]
    assert len(warning) == 1 and "--calibration-dir" in warning[0], said
    assert warned not in caplog.text + capsys.readouterr().err  # said once, as progress: not logged again
    own = tmp_path / "own"  # a folder of the user's photos, read before the first step
    own.mkdir()
    (own / "photo.jpg").write_bytes(photos.photo_jpeg("chelsea.png", width=320))
    assert not [line for line in said_until_the_first_step(weights_file, calibration_dir=own, **options)
                if warned in line]  # fmt: skip
    assert store.versions("warned-onnx-int8") == []


def test_a_model_of_ones_own_without_a_name_is_warned_to_replace_the_default_family(weights_file, labels_file) -> None:
    said = said_until_the_first_step(weights_file, labels_path=labels_file)  # every backend: no --only, no mixing
    warning = [line for line in said if "default family" in line]
    assert len(warning) == 1 and "replaces" in warning[0] and "--name NAME" in warning[0], said
    assert not [line for line in said_until_the_first_step(weights_file, labels_path=labels_file, family="own")
                if "default family" in line]  # fmt: skip


# --- a real small build ----------------------------------------------------------------------------


def build_family(home: Path, weights: Path, labels: Path, *extra: str, status: int = 0) -> str:
    """The build command for the 3-class family (pytorch and onnx) into ``home``'s store: what it said."""
    argv = ["--weights", str(weights), "--labels", str(labels), "--name", "tri", "--only", "pytorch,onnx"]
    argv += ["--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD))]
    return build_here(home, [*argv, "--resize", str(RESIZE), "--crop", str(CROP), *extra], status)


def stored(home: Path, name: str) -> tuple[Path, dict]:
    """A store name's only version in ``home``: its folder and model.yaml."""
    (version,) = [p for p in (home / "models" / name).iterdir() if p.is_dir()]
    return version, yaml.safe_load((version / "model.yaml").read_text())


@pytest.fixture(scope="module")
def family_home(weights_file, labels_file, tmp_path_factory) -> tuple[Path, Path, str]:
    home = tmp_path_factory.mktemp("family-home")
    return home, labels_file, build_family(home, weights_file, labels_file)


def test_a_three_class_family_is_stored_with_its_labels_and_preprocessing(family_home) -> None:
    home, _, said = family_home
    for backend in ("pytorch", "onnx"):
        _, info = stored(home, f"tri-{backend}")
        labels, meta = info["labels"], info["metadata"]
        assert labels["family"] == "tri" and labels["backend"] == backend and labels["weights"] == "file", labels
        assert labels["build_format"] == store.BUILD_FORMAT
        assert meta["categories"] == CLASSES and meta["num_classes"] == 3
        assert meta["input"]["shape"] == ["N", CROP, CROP, 3] and meta["output"]["shape"] == ["N", 3]
        pre = meta["preprocess"]
        assert (pre["resize_size"], pre["crop_size"], pre["mean"], pre["std"]) == (RESIZE, CROP, list(MEAN), list(STD))
    assert "verified vs PyTorch" in said and "family tri: 3 classes" in said


def test_its_onnx_model_takes_its_crop_size_and_normalises_with_its_mean_and_std(family_home, state) -> None:
    from torchvision.models import resnet50

    from fastinfer.engines import check_batch, warm_up
    from fastinfer.engines.onnx import OnnxEngine
    from fastinfer.engines.pytorch import TorchEngine

    home, _, _ = family_home
    onnx = OnnxEngine(stored(home, "tri-onnx")[0], cpu_only=True)
    eager = TorchEngine(stored(home, "tri-pytorch")[0], device="cpu")
    assert onnx.input_size == eager.input_size == CROP
    warm_up(onnx, (1, 2))
    images = np.random.default_rng(0).integers(0, 256, (4, CROP, CROP, 3), dtype=np.uint8)
    check_batch(images, onnx.input_size)
    logits = onnx.run(images[:1])
    assert logits.shape == (1, 3) and logits.dtype == np.float32
    # torchvision's own pipeline on the user's weights: to 0..1, the family's mean/std, NCHW.
    net = resnet50(weights=None, num_classes=3)
    net.load_state_dict(state)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.inference_mode():
        expected = net.eval()(x).numpy()
    assert np.abs(onnx.run(images) - expected).max() < 1e-3
    assert np.abs(eager.run(images) - expected).max() < 1e-3
    with pytest.raises(ValueError, match=r"\[N,64,64,3\]"):
        check_batch(np.zeros((1, 224, 224, 3), np.uint8), onnx.input_size)


def test_a_rebuild_is_up_to_date_until_the_labels_change(family_home, weights_file) -> None:
    home, labels, _ = family_home
    again = build_family(home, weights_file, labels)
    assert again.count(": up to date (") == 2, again
    before = {backend: stored(home, f"tri-{backend}")[0].name for backend in ("pytorch", "onnx")}
    renamed = labels.parent / "tri-labels-renamed.txt"
    renamed.write_text("rouge\nvert\nbleu\n")
    # Relabelling PyTorch's model alone would leave the family answering in two sets of labels: refused.
    refused = build_family(home, weights_file, renamed, "--only", "pytorch", status=1)
    assert "tri-onnx:" in refused and "two sources" in refused, refused
    assert stored(home, "tri-pytorch")[0].name == before["pytorch"]
    rebuilt = build_family(home, weights_file, renamed)  # every model the family holds: one source still
    assert "up to date" not in rebuilt and "stored tri-pytorch:" in rebuilt and "stored tri-onnx:" in rebuilt, rebuilt
    for backend in ("pytorch", "onnx"):
        version, info = stored(home, f"tri-{backend}")  # the one version left: the superseded one is pruned
        assert version.name != before[backend] and info["metadata"]["categories"] == ["rouge", "vert", "bleu"]
