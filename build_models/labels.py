"""A family's class names, in the order of its final layer's rows: from ``--labels PATH`` (a text file, JSON, or
an ImageFolder training directory), or ImageNet's for the default 1000-class weights.
"""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

from fastinfer.catalog.family import MAX_LABEL

IMAGENET_CLASSES = 1000
SHOWN = 3  # names quoted in a refusal: enough to find them, short enough for one line
UNPRINTABLE = {"Cc", "Zl", "Zp"}  # control characters and line separators would break one-line messages
# Bidirectional controls reorder the text shown around them (an override makes "gnp.exe" look like "exe.png"):
# embeddings, overrides and isolates by their bidi class; the three marks have a letter's class, so by name.
BIDI_CLASSES = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}
BIDI_MARKS = {"\u200e", "\u200f", "\u061c"}  # LEFT-TO-RIGHT, RIGHT-TO-LEFT and ARABIC LETTER MARK
# Unicode's Default_Ignorable_Code_Point outside category Cf (unicodedata has no such property): shown as nothing.
IGNORABLE = {
    *"\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0",  # grapheme joiner, fillers, Mongolian FVS
    *map(chr, range(0xFE00, 0xFE10)),  # variation selectors
    *map(chr, range(0xE0100, 0xE01F0)),  # variation selectors supplement
}
BLANK = IGNORABLE | {"\u2800"}  # and BRAILLE PATTERN BLANK, a symbol that shows nothing


class BadLabels(ValueError):
    """Labels that cannot name the model's classes; the message says why, in one line."""


def imagenet_categories() -> list[str]:
    """ImageNet class names from torchvision's weight metadata (no download): the default family's labels."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V2.meta["categories"])


def family_labels(path: Path | None, num_classes: int) -> list[str]:
    """The labels of a model whose final layer has ``num_classes`` rows, from ``path`` or ImageNet's; else BadLabels."""
    if path is None:
        if num_classes == IMAGENET_CLASSES:
            return imagenet_categories()
        raise BadLabels(
            f"the weights have {num_classes} classes, not ImageNet's {IMAGENET_CLASSES}: name them with "
            "--labels PATH (a text file of one label a line, JSON, or your ImageFolder training directory)"
        )
    labels = read_labels(path)
    check_labels(labels, num_classes, path)
    return labels


def read_labels(path: Path) -> list[str]:
    """Labels as the file or directory at ``path`` lists them (a ``.json`` suffix: JSON; else text)."""
    if path.is_dir():
        return folder_labels(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM, as some editors write, is not part of a label
    except FileNotFoundError:
        raise BadLabels(f"--labels {path}: no such file or directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadLabels(f"--labels {path} cannot be read as UTF-8 text: {exc}") from None
    return json_labels(text, path) if path.suffix.lower() == ".json" else text_labels(text)


def text_labels(text: str) -> list[str]:
    """One label a line, stripped, trailing blank lines dropped; only "\n" ends a line (not str.splitlines' other
    separators: those stay inside the label, for check_labels to refuse)."""
    lines = [line.strip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def json_labels(text: str, path: Path) -> list[str]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadLabels(f"--labels {path} is not valid JSON: {exc}") from None
    if isinstance(data, list):
        return [_name(value, path) for value in data]
    if isinstance(data, dict):
        indexes = [str(i) for i in range(len(data))]
        missing = [k for k in indexes if k not in data]
        if missing:
            odd = [k for k in data if k not in indexes]
            raise BadLabels(
                f"--labels {path}: an index → name object needs the keys 0..{len(data) - 1}, one each; "
                f"missing {', '.join(missing[:SHOWN])}; not an index there: {', '.join(map(repr, odd[:SHOWN]))}"
            )
        return [_name(data[k], path) for k in indexes]
    raise BadLabels(
        f"--labels {path}: JSON labels are a list of names or an object index → name, not a {type(data).__name__}"
    )


def _name(value: object, path: Path) -> str:
    # TorchServe's index_to_name.json maps an index to [wordnet id, name]: the name is the label.
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = value[-1]
    if not isinstance(value, str):
        raise BadLabels(f"--labels {path}: every label must be a string, not {json.dumps(value)[:60]}")
    return value.strip()


def folder_labels(directory: Path) -> list[str]:
    """The class folders' names, ordered as torchvision's ImageFolder's find_classes orders them."""
    with os.scandir(directory) as entries:
        classes = sorted(entry.name for entry in entries if entry.is_dir())
    if not classes:
        raise BadLabels(f"--labels {directory}: a directory of labels holds one folder per class; it has none")
    return classes


def check_labels(labels: list[str], num_classes: int, source: Path) -> None:
    """One label per class, none empty or blank, none twice or alike, each printable text on one line, without
    bidirectional controls and at most MAX_LABEL characters."""
    if len(labels) != num_classes:
        raise BadLabels(
            f"--labels {source} names {len(labels)} classes, but the weights' final layer has {num_classes}"
        )
    lines = source.suffix.lower() != ".json" and not source.is_dir()  # a text file: one label a line

    def place(i: int) -> str:
        return f"line {i + 1}" if lines else f"class index {i}"

    empty = [i for i, label in enumerate(labels) if not label]
    if empty:
        at = ", ".join(place(i) for i in empty[:SHOWN])
        raise BadLabels(f"--labels {source}: {len(empty)} empty label(s), at {at}")
    for i, label in enumerate(labels):
        if bad := next((c for c in label if unicodedata.category(c) in UNPRINTABLE), None):
            raise BadLabels(
                f"--labels {source} {place(i)}: the label holds the control character {bad!r} "
                f"({label[:60]!r}); a label is printable text on one line"
            )
        if len(label) > MAX_LABEL:
            raise BadLabels(
                f"--labels {source} {place(i)}: the label is {len(label)} characters long "
                f"({label[:40]!r}...); at most {MAX_LABEL}"
            )
        _check_shown(label, f"--labels {source} {place(i)}")
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        first = seen.setdefault(lookalike_key(label), i)
        if first == i:
            continue
        if label == labels[first]:
            raise BadLabels(f"--labels {source} {place(i)}: {label[:60]!r} is {place(first)}'s too (each label once)")
        raise BadLabels(
            f"--labels {source} {place(i)}: {label[:60]!r} is {place(first)}'s "
            f"{labels[first][:60]!r} (labels must differ in more than case, width or invisible characters)"
        )


def _check_shown(label: str, where: str) -> None:
    """A label shown as what it holds: valid text, no bidirectional control, at least one visible character."""
    if any(unicodedata.category(c) == "Cs" for c in label):  # from a JSON escape or a non-UTF-8 folder name
        raise BadLabels(f"{where}: {label[:60]!r} holds a lone surrogate: not text that can be shown or stored")
    if bidi := next((c for c in label if c in BIDI_MARKS or unicodedata.bidirectional(c) in BIDI_CLASSES), None):
        raise BadLabels(
            f"{where}: {label[:60]!r} holds the bidirectional control U+{ord(bidi):04X} "
            f"({unicodedata.name(bidi)}), which reorders how the text around it is shown"
        )
    if all(unicodedata.category(c) in ("Cf", "Zs") or c in BLANK for c in label):
        raise BadLabels(f"{where}: {label[:60]!r} has no visible character (only spaces or invisible characters)")


def lookalike_key(label: str) -> str:
    """What ``label`` looks like: without format and ignorable characters, NFKC-normalised (width, ligatures),
    case-folded, runs of spaces as one: labels of one key differ only in case, width or invisible characters."""
    kept = "".join(c for c in label if unicodedata.category(c) != "Cf" and c not in IGNORABLE)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", kept).casefold())
    return " ".join(folded.split())
