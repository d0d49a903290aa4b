"""Which paths the front treats apart (read by fastinfer/front/http.py, access.py and openapi.py)."""

from __future__ import annotations

# Probes and scrapes are never refused, timed out or counted as traffic.
UNLIMITED_PATHS = frozenset({"/livez", "/readyz", "/healthz", "/metrics"})
# Served without an API key: the probes, /metrics, the API page and the static files (the dashboard's and the
# API page's: the only mounts under these prefixes). None takes a body.
OPEN_PATHS = UNLIMITED_PATHS | {"/", "/docs.json", "/schema.json", "/dashboard"}
OPEN_PREFIXES = ("/dashboard/", "/static_content/")


def is_open(path: str) -> bool:
    """Whether ``path`` is served without a key (Starlette routes on this same decoded path)."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)
