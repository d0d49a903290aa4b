"""What a client of the server sends besides the request (light: the load generator imports it)."""

from __future__ import annotations

import os


def auth_headers() -> dict[str, str]:
    """For a server with API keys: FASTINFER_API_KEY as a Bearer token (never a command-line argument)."""
    key = os.environ.get("FASTINFER_API_KEY", "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}
