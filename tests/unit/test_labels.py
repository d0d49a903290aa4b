"""Labels a reader cannot tell apart, or cannot see, are refused by the build in one line naming where they are:
case, width and invisible characters do not make two labels, a label of only invisible characters is empty, and
bidirectional controls reorder what is shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from build_models.labels import BadLabels, family_labels

ALIKE = "(labels must differ in more than case, width or invisible characters)"


def labels_file(tmp_path: Path, name: str, labels: list[str]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(labels) if name.endswith(".json") else "\n".join(labels) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        (["Alpha", "beta", "alpha"], "line 3: 'alpha' is line 1's 'Alpha' " + ALIKE),
        (["Alpha", "beta", "gamma", "ALPHA"], "line 4: 'ALPHA' is line 1's 'Alpha'"),
        (["alpha", "alpha\u200b", "beta"], "line 2: 'alpha\\u200b' is line 1's 'alpha'"),  # a zero-width space
        (["beta", "al\u00adpha", "alpha"], "line 3: 'alpha' is line 2's 'al\\xadpha'"),  # a soft hyphen
        (["alpha", "beta", "ａｌｐｈａ"], "line 3: 'ａｌｐｈａ' is line 1's 'alpha'"),  # fullwidth
        (["ﬁsh", "beta", "FISH"], "line 3: 'FISH' is line 1's 'ﬁsh'"),  # a ligature
        (["Straße", "beta", "STRASSE"], "line 3: 'STRASSE' is line 1's 'Straße'"),  # case folding, not lower()
        (["red fox", "beta", "red\u00a0 fox"], "line 3: 'red\\xa0 fox' is line 1's 'red fox'"),  # spaces
        (["heart", "\u2764", "\u2764\ufe0f"], "line 3: '❤️' is line 2's '❤'"),  # a variation selector
    ],
    ids=["lower", "upper", "zero-width", "soft hyphen", "width", "ligature", "sharp s", "spaces", "emoji VS"],
)
def test_labels_that_look_alike_are_refused_naming_both_lines(tmp_path, labels: list[str], says: str) -> None:
    path = labels_file(tmp_path, "labels.txt", labels)
    with pytest.raises(BadLabels, match=re.escape(f"--labels {path} {says}")) as refused:
        family_labels(path, len(labels))
    assert "\n" not in str(refused.value)


def test_json_and_folder_labels_are_named_by_class_index(tmp_path) -> None:
    path = labels_file(tmp_path, "labels.json", ["cat", "dog", "Cat"])
    with pytest.raises(BadLabels, match=re.escape("class index 2: 'Cat' is class index 0's 'cat' " + ALIKE)):
        family_labels(path, 3)
    for name in ("Dog", "cat", "dog"):
        (tmp_path / "train" / name).mkdir(parents=True)
    with pytest.raises(BadLabels, match=re.escape("class index 2: 'dog' is class index 0's 'Dog'")):
        family_labels(tmp_path / "train", 3)


@pytest.mark.parametrize(
    "blank",
    ["\u200b", "\u200b\u200c\u200d", "\u2060", "\ufeff\u200b", "\u2800", "\u3164", "\ufe0f", "\u200b\u3000\u200b"],
    ids=ascii,
)
def test_a_label_with_nothing_visible_is_refused(tmp_path, blank: str) -> None:
    """Empty labels are refused: one that renders empty is too."""
    path = labels_file(tmp_path, "labels.txt", ["red", blank, "blue"])
    with pytest.raises(BadLabels, match=re.escape(f"line 2: {blank!r} has no visible character")):
        family_labels(path, 3)


BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f"]


@pytest.mark.parametrize("control", [*BIDI, "\u061c"], ids=lambda c: f"U+{ord(c):04X}")
def test_bidirectional_controls_are_refused(tmp_path, control: str) -> None:
    label = f"cat{control}gnp.exe"  # shown as "catexe.png" after a right-to-left override
    path = labels_file(tmp_path, "labels.txt", ["red", "green", label])
    with pytest.raises(
        BadLabels, match=re.escape(f"line 3: {label!r} holds the bidirectional control U+{ord(control):04X}")
    ):
        family_labels(path, 3)


def test_a_lone_surrogate_is_refused(tmp_path) -> None:
    """A JSON escape (or a folder name that is not UTF-8) can hold one: it is not text the server can send."""
    path = tmp_path / "labels.json"
    path.write_text('["red", "gr\\udcffeen", "blue"]')
    with pytest.raises(BadLabels, match=re.escape("class index 1: 'gr\\udcffeen' holds a lone surrogate")):
        family_labels(path, 3)


def test_labels_that_differ_as_shown_are_accepted(tmp_path) -> None:
    """Accents, scripts, digits, a right-to-left script's own letters, emoji, spaces between words."""
    labels = ["cafe", "café", "résumé", "resume", "猫", "貓", "كلب", "כלב", "l", "1", "I", "ab", "a b", "🐱"]
    labels += ["e\u0301x", "x\u200dy"]  # a combining accent; a joiner between letters (a lookalike of none)
    assert family_labels(labels_file(tmp_path, "labels.txt", labels), len(labels)) == labels
    imagenet_style = ["tench", "goldfish", "great white shark", "crane (bird)", "crane (machine)"]
    assert family_labels(labels_file(tmp_path, "labels.json", imagenet_style), 5) == imagenet_style
