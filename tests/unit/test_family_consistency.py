"""A family is one source (its weights, labels and preprocessing) in every backend.

A build of some backends only (``--only``, ``--if-missing``) from another source than the family's stored
models would leave them of two sources under one name, answering one photo with different labels: it is
refused before anything is exported, naming those models. Building every backend replaces them all, as before.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import bentoml
import pytest

from build_models import ARTIFACT_NAMES, ARTIFACTS, MixedSources, build, check_one_source
from build_models.__main__ import main
from fastinfer.catalog import store
from fastinfer.catalog.store import PreprocessSpec

pytestmark = pytest.mark.heavy  # model builds

ROOT = Path(__file__).resolve().parents[2]
FAMILY = "onesource"
OWN = PreprocessSpec(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))  # not the default: a flag left out changes it


def remove_family() -> None:
    for name in store.families().get(FAMILY, []):
        for model in bentoml.models.list(name):
            bentoml.models.delete(model.tag)


@pytest.fixture(scope="module")
def stored_pytorch() -> Iterator[bentoml.Model]:
    """The family's PyTorch model, built from random weights with its own mean and std (seconds)."""
    remove_family()
    build("random", only=["pytorch"], family=FAMILY, preprocess=OWN, progress=lambda line: None)
    yield store.find("pytorch", family_name=FAMILY)
    remove_family()


def refused(argv: list[str], capsys) -> tuple[str, str]:
    """``python -m build_models argv``'s refusal: exit 1, one line, no traceback; (stdout, the line)."""
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err.startswith("build_models: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return out, err.strip()


@pytest.mark.parametrize(
    "partial",
    [["--only", "onnx-int8"], ["--only", "onnx,onnx-int8-dynamic"], ["--if-missing"]],
    ids=["the hint for a missing backend", "two backends", "--if-missing"],
)
def test_a_partial_build_from_another_source_is_refused_before_exporting(stored_pytorch, capsys, partial) -> None:
    """The hint a server gives for a missing backend names the weights and labels but not the preprocessing:
    followed as printed, it would build ImageNet's mean/std into this family's INT8 model."""
    out, line = refused(["--weights", "random", "--name", FAMILY, *partial], capsys)
    assert f"{stored_pytorch.tag} was built from other weights, labels or preprocessing" in line, line
    assert "Build the whole family (drop --only and --if-missing" in line and "--force" in line, line
    assert "exporting" not in out, out
    assert store.families()[FAMILY] == [f"{FAMILY}-pytorch"]  # nothing else stored
    assert [str(m.tag) for m in bentoml.models.list(f"{FAMILY}-pytorch")] == [str(stored_pytorch.tag)]


def test_a_partial_build_of_the_same_source_or_a_whole_one_is_allowed(stored_pytorch) -> None:
    source = stored_pytorch.info.labels["source_hash"]
    check_one_source(FAMILY, source, ["onnx-int8"], if_missing=False)  # the family's own files: fills a gap
    check_one_source(FAMILY, source, [], if_missing=True)
    buildable = [name for name in ARTIFACT_NAMES if ARTIFACTS[name].requires() is None]
    check_one_source(FAMILY, "0" * 16, buildable, if_missing=False)  # every backend: replaces them all
    with pytest.raises(MixedSources):
        check_one_source(FAMILY, "0" * 16, [n for n in buildable if n != "pytorch"], if_missing=False)


def test_a_partial_build_replacing_every_stored_model_is_allowed(stored_pytorch) -> None:
    """The family holds only PyTorch's model: rebuilding it from another source leaves one source still."""
    (result,) = build("random", only=["pytorch"], family=FAMILY, progress=lambda line: None)  # ImageNet's mean/std
    assert result.built and result.tag != str(stored_pytorch.tag)
    (model,) = bentoml.models.list(f"{FAMILY}-pytorch")
    assert model.info.metadata["preprocess"]["mean"] == list(PreprocessSpec().mean)


def test_imagenets_class_count_is_one_constant() -> None:
    """ImageNet's 1000 classes are the default family's value, written once (build_models.labels), never a
    literal that the build or an engine falls back to."""
    found = []
    for folder in ("build_models", "fastinfer/engines"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value == 1000 and type(node.value) is int:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [where.split(":")[0] for where in found] == ["build_models/labels.py"], found
