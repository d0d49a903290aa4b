"""What the API page (/docs.json) must not be: the framework's placeholder, internal words, an
operation without a description or without an example. Used on the real server, the built bento
and, to show that it fails, on BentoML's own spec."""

from __future__ import annotations

import json
import re
from typing import Any

# BentoML's text, from _bentoml_sdk/service/openapi.py and bentoml/_internal/bento/bento.py's
# default README: none of it says anything about FastInfer.
PLACEHOLDERS = (
    "Machine Learning Service created with BentoML",
    "BentoML Team",
    "contact@bentoml.com",
    "BentoML Slack",
    "join-slack",
    "Twitter",
    "img.shields.io",
    "customize this README",
    "BentoML Service API endpoints",
    "fastinfer:dev",
)
# "the seed": the team's word for the original FastInfer API; users never see it. Found: "the seed",
# "the seed's", "seed routes", "seed keys"; not the RNG's seed: "seeded random init", "seed 0",
# "(seed 0)", "the seed 0", "seed %d", "RANDOM_SEED", "manual_seed". Words may be apart by any
# whitespace, or by JSON's escapes of it (\n, \t, \r as two characters: spec_problems reads json.dumps
# of the spec, where ’ is \u2019). tests/unit/test_user_text.py uses the same regex.
_GAP = r"(?:\s|\\[nrt])+"  # whitespace, or JSON's escape of it
_START = r"(?:(?<=\\[nrt])|\b)"  # a word's start, also right after an escaped line break ("\nthe")
_APOSTROPHE = r"(?:'|’|\\u2019)"
INTERNAL_WORD = re.compile(
    rf"{_START}the{_GAP}seed\b(?!(?:{_GAP})?(?:\d|%d|\{{|=))"
    rf"|{_START}seed{_APOSTROPHE}s\b"
    rf"|{_START}seed{_GAP}(?:routes?|keys?|project|api|release)\b",
    re.IGNORECASE,
)
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def spec_problems(spec: dict[str, Any]) -> list[str]:
    """Everything wrong with the spec as a user's first look; empty when it speaks FastInfer."""
    problems = []
    info = spec.get("info", {})
    if info.get("title") != "FastInfer":
        problems.append(f"title is {info.get('title')!r}")
    if str(info.get("version")) in ("", "None", "dev"):
        problems.append(f"version is {info.get('version')!r}")
    if not info.get("contact"):
        problems.append("no contact")
    text = json.dumps(spec)
    problems += [f"framework placeholder {p!r}" for p in PLACEHOLDERS if p.lower() in text.lower()]
    problems += [f"internal word {m.group()!r}" for m in INTERNAL_WORD.finditer(text)]
    for path, item in spec.get("paths", {}).items():
        for method in METHODS:
            if not isinstance(op := item.get(method), dict):
                continue
            name = f"{method.upper()} {path}"
            description = op.get("description") or ""
            if len(re.split(r"(?:^|\n\n)Example:", description)[0].split()) < 3:  # the part before the example
                problems.append(f"{name}: no description")
            if "Example:" not in description:
                problems.append(f"{name}: no example")
            answer = op.get("responses", {}).get("200", {}).get("content", {}).get("application/json")
            if answer is not None and "example" not in answer:
                problems.append(f"{name}: no example answer")
    return problems
