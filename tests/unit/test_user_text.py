"""Users see FastInfer, not internal words: "the seed" (the team's name for the original FastInfer API) is
never in text a user reads; a seeded random init and its RNG seed 0 are what they say and stay."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spec_checks import INTERNAL_WORD

ROOT = Path(__file__).resolve().parents[2]


def internal_words(text: str) -> list[str]:
    """Each use of the internal word in ``text``, in its context; a phrase wrapped across lines (argparse
    wraps help, Markdown wraps paragraphs) is found too."""
    flat = re.sub(r"\s+", " ", text)
    return [flat[max(m.start() - 60, 0) : m.end() + 60] for m in INTERNAL_WORD.finditer(flat)]


# One regex for the internal word (tests/spec_checks.py's INTERNAL_WORD, also run on json.dumps of the
# API page's spec): these are it, whatever whitespace is between the words, and in JSON too.
INTERNAL = ["the seed", "the seed's", "seed routes", "seed keys", "the seed's key", "The Seed", "seed route"]
# The RNG's seed and other words: never it.
NOT_INTERNAL = ["seeded random init", "seed 0", "(seed 0)", "the seed 0", "seed %d", "RANDOM_SEED", "manual_seed",
                "torch.manual_seed(RANDOM_SEED)", "seedless",
                "the original FastInfer project's dynamic INT8"]  # fmt: skip


def spaced(phrase: str, gap: str) -> str:
    return phrase.replace(" ", gap)


@pytest.mark.parametrize("gap", [" ", "  ", "\n", "\t", " \n      ", "\r\n"], ids=repr)
@pytest.mark.parametrize("phrase", INTERNAL)
def test_the_one_regex_finds_the_internal_word(phrase: str, gap: str) -> None:
    for text in (spaced(phrase, gap), f"as {spaced(phrase, gap)} said", f"line one.{gap}{spaced(phrase, gap)}"):
        assert INTERNAL_WORD.search(text), text
        assert INTERNAL_WORD.search(json.dumps(text)), json.dumps(text)  # JSON writes \n as two characters
        assert INTERNAL_WORD.search(json.dumps({"description": text.replace("'", "’")}))  # ’ is \u2019 there
        assert internal_words(text)  # the check of the files and help texts below


@pytest.mark.parametrize("gap", [" ", "\n", " \n  "], ids=repr)
@pytest.mark.parametrize("phrase", NOT_INTERNAL)
def test_the_one_regex_leaves_the_rng_seed_alone(phrase: str, gap: str) -> None:
    for text in (spaced(phrase, gap), f"a {spaced(phrase, gap)}.", f"text.{gap}{spaced(phrase, gap)}"):
        assert not INTERNAL_WORD.search(text), text
        assert not INTERNAL_WORD.search(json.dumps(text)), json.dumps(text)
        assert internal_words(text) == []


def user_files() -> list[Path]:
    dashboard = sorted(p for p in (ROOT / "dashboard").rglob("*") if p.is_file())
    assert dashboard, "dashboard/ has no files"
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/ has no pages"
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *docs, *dashboard]


@pytest.mark.parametrize("path", user_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_facing_files_do_not_say_seed(path: Path) -> None:
    assert internal_words(path.read_text(encoding="utf-8")) == []


def help_text(main: Callable[[list[str]], int], argv: list[str]) -> str:
    """What ``main(argv)`` prints for --help (argparse exits 0 after printing it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return out.getvalue()


def example_client() -> Callable[[list[str]], int]:
    """examples/client.py's ``main`` (a script, not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("fastinfer_example_client", ROOT / "examples" / "client.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its own __main__ guard keeps it from running
    return module.main


def every_help() -> list[tuple[str, Callable[[list[str]], int], list[str]]]:
    from build_models.__main__ import main as build_models
    from fastinfer.cli import main as fastinfer
    from load_tests.__main__ import main as load_tests

    # Every subcommand `fastinfer --help` lists: a new one joins the check.
    listed = re.search(r"\{([a-z,]+)\}", help_text(fastinfer, ["--help"]))
    assert listed, "fastinfer --help lists no subcommands"
    commands = listed.group(1).split(",")
    assert {"build", "tune", "doctor", "fidelity", "bench", "profile", "evaluate"} <= set(commands)
    return [
        ("fastinfer", fastinfer, ["--help"]),
        *((f"fastinfer {c}", fastinfer, [c, "--help"]) for c in commands),
        ("python -m build_models", build_models, ["--help"]),
        ("python -m load_tests", load_tests, ["--help"]),
        ("python examples/client.py", example_client(), ["--help"]),
    ]


def test_the_command_lines_help_does_not_say_seed() -> None:
    for name, main, argv in every_help():
        text = help_text(main, argv)
        assert "usage:" in text, name
        assert internal_words(text) == [], name


def test_the_benchmarks_study_text_does_not_say_seed() -> None:
    """load_tests/report.py writes BENCHMARKS.md: its source (the report's text is its tables)."""
    assert internal_words((ROOT / "load_tests" / "report.py").read_text(encoding="utf-8")) == []
