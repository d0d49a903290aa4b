"""What a build records is valid text: a file name's undecodable bytes are shown escaped, never stored as
surrogates (JSON, YAML and HTTP encoders refuse them, so one would break every page that lists the model)."""

from __future__ import annotations

from typing import Any


def as_text(text: str) -> str:
    """``text`` with each lone surrogate escaped: a file name's byte 0xff (os.fsdecode: U+DCFF) as ``\\xff``,
    another as ``\\udXXX``; valid text unchanged."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    return "".join(_escaped(c) if "\ud800" <= c <= "\udfff" else c for c in text)


def _escaped(c: str) -> str:
    code = ord(c)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def texts(value: Any) -> Any:
    """``value`` (nested dicts, lists, tuples) with every string, key or value, made valid text by as_text."""
    if isinstance(value, str):
        return as_text(value)
    if isinstance(value, dict):
        return {texts(k): texts(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(texts(v) for v in value)
    return value
