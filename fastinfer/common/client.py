"""What a client of the server sends besides the request (light: the load generator imports it)."""

from __future__ import annotations

import os
import re

API_KEY_SYNTAX = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # a Bearer token's characters (RFC 6750): the server's too


class BadApiKey(ValueError):
    """FASTINFER_API_KEY cannot be sent: commands say so in one line."""


def auth_headers() -> dict[str, str]:
    """For a server with API keys: FASTINFER_API_KEY as a Bearer token (never a command-line argument)."""
    key = os.environ.get("FASTINFER_API_KEY", "").strip()
    if key and not API_KEY_SYNTAX.fullmatch(key):  # the key itself is never echoed
        raise BadApiKey("FASTINFER_API_KEY is not a Bearer token: letters, digits and -._~+/ then any '='")
    return {"Authorization": f"Bearer {key}"} if key else {}
