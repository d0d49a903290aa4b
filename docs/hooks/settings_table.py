"""docs/configuration.md's tables of environment variables, generated from the settings' own definitions (the
pydantic fields of fastinfer/catalog/config.py: variables, default, description) and kept in the page between their
markers, so that the page reads whole on a code host too. `make docs` (or `python docs/hooks/settings_table.py`)
rewrites them; tests/unit/test_docs.py fails when the page is not what this generates, or when a variable the code
reads is missing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from fastinfer.catalog.backends import SPECS
from fastinfer.catalog.config import BatchingConfig, GroqConfig, Settings, variables
from fastinfer.catalog.tuned import REMOVED

PAGE = Path(__file__).resolve().parents[1] / "configuration.md"
MARKERS = ("settings-table", "elsewhere-table")  # <!-- name --> … <!-- /name --> in the page

# Read before the settings, by fastinfer/catalog/tuned.py: the file whose values sit below the environment's.
TUNED = (
    "FASTINFER_TUNED",
    "`$BENTOML_HOME/tuned/tuned.json`",
    "the tuned file `fastinfer tune` writes and the server reads at start-up (see [Tuning](tuning.md)); `off`: "
    "ignore it",
)

# Read outside Settings (names, default, meaning): by the backend table, the tools, the clients, or handed by
# a server or the load tests to the processes they start.
ELSEWHERE = (
    (
        "FASTINFER_OPENVINO_PRECISION",
        "`auto`",
        "`openvino`'s precision: `auto` (BF16 on CPUs with BF16 units, else FP32) | `bf16` | `f32`; read where the "
        "engine opens (fastinfer/catalog/backends.py), checked at start-up with the settings",
    ),
    (
        "BENTOML_HOME",
        "`./bentoml_home` (make, `fastinfer`, `python -m build_models`, `python -m load_tests`; "
        "`bentoml serve` alone: `~/bentoml`)",
        "where the model store lives (and `cache/openvino`, OpenVINO's compiled models)",
    ),
    (
        "FASTINFER_API_KEY",
        "(none)",
        "the key the clients send: `examples/client.py`, `python -m load_tests --url …`, locust",
    ),
    (
        "FASTINFER_PINNED_MODELS FASTINFER_UNSERVED_MODELS FASTINFER_PIN_FILE FASTINFER_TUNED_RESOLVED "
        "FASTINFER_IN_FRONT_PLACED",
        "(set by the server)",
        "not settings: how `bentoml serve`'s parent hands its model versions, the tuned file it read and where "
        "it placed the engines to its workers (a malformed value outside a server stops the tools with a message; "
        "a placement not set by a process's own parent is ignored)",
    ),
    (
        "FASTINFER_STARTED_AS FASTINFER_BENCH_BACKEND FASTINFER_BENCH_IMAGES FASTINFER_BENCH_SUMMARY",
        "(set by the load tests)",
        "not settings: how `python -m load_tests` marks the servers it starts and tells locust what to send",
    ),
)


def _shown(value: Any) -> str:
    if value is None or (not value and not isinstance(value, int | float)):  # "", (), {}, frozenset()
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _per_backend(index: int) -> str:
    """A batching field's default from the backend table: the usual value, then the exceptions."""
    values = {name: spec.batching[index] for name, spec in SPECS.items()}
    usual = Counter(values.values()).most_common(1)[0][0]
    others = Counter(v for v in values.values() if v != usual)
    return _shown(usual) + "".join(
        f" ({', '.join(f'`{n}`' for n, v in values.items() if v == other)}: {_shown(other)})" for other in others
    )


def rows() -> list[tuple[list[str], str, str]]:
    """(variable names, default, meaning) of every field a variable sets, in the order of the definitions."""
    found = []
    for cls in (Settings, BatchingConfig, GroqConfig):
        for index, (name, field) in enumerate(cls.model_fields.items()):
            if field.description is None:  # not a variable
                continue
            if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("shown"):
                default = str(field.json_schema_extra["shown"])
            elif cls is BatchingConfig:
                default = _per_backend(index)
            else:
                default = _shown(field.get_default(call_default_factory=True))
            found.append((variables(name, field), default, field.description))
        if cls is Settings:
            found.append(([TUNED[0]], TUNED[1], TUNED[2]))
    return found + [(names.split(), default, doc) for names, default, doc in elsewhere()]


def elsewhere() -> list[tuple[str, str, str]]:
    """ELSEWHERE, then each variable removed (fastinfer/catalog/tuned.py's REMOVED), which start-up says it ignores."""
    removed = [(name, "(removed)", f"not a setting any more: ignored where set, and said once at start-up; {instead}")
               for name, instead in REMOVED.items()]  # fmt: skip
    return [*ELSEWHERE, *removed]


def _table(table_rows: list[tuple[list[str], str, str]]) -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for names, default, doc in table_rows:
        cells = ("<br>".join(f"`{n}`" for n in names), default, doc)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def documented() -> set[str]:
    return {name for names, _, _ in rows() for name in names}


def page(markdown: str) -> str:
    """``markdown`` with the text between each pair of markers replaced by its table, as generated now."""
    outside = len(elsewhere())
    for name, table in zip(MARKERS, (rows()[:-outside], rows()[-outside:]), strict=True):
        begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
        if markdown.count(begin) != 1 or markdown.count(end) != 1 or markdown.index(begin) > markdown.index(end):
            raise ValueError(f"the page needs {begin} once, then {end} once: the table goes between them")
        head, rest = markdown.split(begin, 1)
        markdown = f"{head}{begin}\n{_table(table)}\n{end}{rest.split(end, 1)[1]}"
    return markdown


if __name__ == "__main__":
    PAGE.write_text(page(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
