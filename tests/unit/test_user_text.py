"""Users see FastInfer, not internal words (issue 14).

"The seed" was this project's internal name for the original FastInfer API (its FastAPI release,
whose routes are kept so its clients work unchanged). Text a user reads names it that way, or names
the finding; a seeded random init and its RNG seed 0 are what they say and stay.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# "the seed", "the seed's", "seed routes", "seed keys": the internal word. Not "seeded random init",
# "seed 0", "(seed 0)", "seed %d" or "RANDOM_SEED" (the RNG's seed).
INTERNAL = re.compile(
    r"\bthe\s+seed\b(?!\s*(?:\d|%d|\{|=))|\bseed['’]s\b|\bseed\s+(?:routes?|keys?|project|api|release)\b",
    re.IGNORECASE,
)


def internal_words(text: str) -> list[str]:
    """Each use of the internal word in ``text``, in its context; a phrase wrapped across lines (argparse
    wraps help, Markdown wraps paragraphs) is found too."""
    flat = re.sub(r"\s+", " ", text)
    return [flat[max(m.start() - 60, 0) : m.end() + 60] for m in INTERNAL.finditer(flat)]


@pytest.mark.parametrize(
    "text",
    [
        "the seed's dynamic INT8",
        "as the seed reported for its batching",
        "The Seed",
        "seed routes",
        "every seed route",
        "SEED_KEYS are the seed keys",
        "the seed\nreported",
        "as the\n      seed reported",
    ],
)
def test_the_internal_word_is_found(text: str) -> None:
    assert internal_words(text)


@pytest.mark.parametrize(
    "text",
    [
        "a seeded random init",
        "seeded random init (seed 0)",
        "Falling back to a RANDOM INIT (seed %d)",
        "torch.manual_seed(RANDOM_SEED)",
        "with the seed 0",
        "the original FastInfer API's dynamic INT8",
        "seedless",
    ],
)
def test_the_rng_seed_is_not(text: str) -> None:
    assert internal_words(text) == []


def user_files() -> list[Path]:
    dashboard = sorted(p for p in (ROOT / "dashboard").rglob("*") if p.is_file())
    assert dashboard, "dashboard/ has no files"
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *dashboard]


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


def every_help() -> list[tuple[str, Callable[[list[str]], int], list[str]]]:
    from build_models.__main__ import main as build_models
    from fastinfer.cli import main as fastinfer
    from load_tests.__main__ import main as load_tests
    from load_tests.quick import main as quick

    commands = ["build", "doctor", "fidelity", "bench", "profile"]  # fastinfer's subcommands
    return [
        ("fastinfer", fastinfer, ["--help"]),
        *((f"fastinfer {c}", fastinfer, [c, "--help"]) for c in commands),
        ("python -m build_models", build_models, ["--help"]),
        ("python -m load_tests", load_tests, ["--help"]),
        ("python -m load_tests.quick", quick, ["--help"]),
    ]


def test_the_command_lines_help_does_not_say_seed() -> None:
    for name, main, argv in every_help():
        text = help_text(main, argv)
        assert "usage:" in text, name
        assert internal_words(text) == [], name


def test_fastinfers_subcommands_are_all_checked() -> None:
    """A new subcommand joins the help check above: its name appears in ``fastinfer --help``."""
    from fastinfer.cli import main

    listed = re.search(r"\{([a-z,]+)\}", help_text(main, ["--help"]))
    assert listed, "fastinfer --help lists no subcommands"
    checked = {" ".join(argv[:-1]) for name, _, argv in every_help() if name.startswith("fastinfer ")}
    assert set(listed.group(1).split(",")) == checked


def test_the_benchmarks_study_text_does_not_say_seed() -> None:
    """load_tests/report.py writes BENCHMARKS.md: its source and the study's sentences, rendered."""
    from load_tests import report

    assert internal_words((ROOT / "load_tests" / "report.py").read_text(encoding="utf-8")) == []
    rates = {(1, 1, True): 50.0, (1, 1, False): 40.0, (2, 1, True): 55.0, (2, 1, False): 45.0}
    study = [
        {"backend": "openvino-int8", "front_workers": f, "runner_workers": r, "batching": b}
        | {"req_per_s": rate, "p99_ms": 300.0}
        for (f, r, b), rate in rates.items()
    ]
    text = "\n".join(report._study_findings(study))
    assert "backfire" in text and "original FastInfer API" in text
    assert internal_words(text) == []
