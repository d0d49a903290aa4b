"""Who may call the API (API keys: 401) and how often ``/analyze`` may spend the operator's Groq quota (429), as
docs/access.md says; both checked in FrontMiddleware before a byte of the body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Scope

from fastinfer.catalog.config import Settings
from fastinfer.common.errors import error_body
from fastinfer.front.paths import is_open


@dataclass(frozen=True)
class Refusal:
    """An answer given instead of the request: status, error body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class ApiKeys:
    """The accepted keys, held as digests only."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def client(self, scope: Scope) -> str | Refusal:
        """The caller's identity (which key: ``key-<n>``), or the 401 to answer."""
        values = [value for name, value in scope.get("headers", []) if name.lower() == b"authorization"]
        if not values:
            return unauthorized(NO_KEY)
        scheme, _, token = values[0].strip().partition(b" ")
        token = token.strip()
        if len(values) > 1 or scheme.lower() != b"bearer" or not token or b" " in token:
            return unauthorized("The Authorization header must be exactly one 'Bearer <key>'.")
        digest = hashlib.sha256(token).digest()
        match = -1
        for number, known in enumerate(self._digests):  # no early exit: every key is compared every time
            if hmac.compare_digest(digest, known):
                match = number
        if match < 0:
            return unauthorized("The API key was not accepted.", invalid=True)
        return f"key-{match + 1}"


NO_KEY = "This server needs an API key: send it as 'Authorization: Bearer <key>'."


def unauthorized(message: str, invalid: bool = False) -> Refusal:
    challenge = b'Bearer realm="fastinfer"' + (b', error="invalid_token"' if invalid else b"")
    return Refusal(401, error_body("unauthorized", message), [(b"www-authenticate", challenge)])


WINDOW_S = 60.0


@dataclass(eq=False)
class RateGuard:
    """At most ``per_client`` calls per client and ``total`` in all within any WINDOW_S (``settings``: what set
    them, for the refusal's message)."""

    per_client: int
    total: int
    settings: str = ""
    clock: Callable[[], float] = time.monotonic
    # Recorded calls in the window, oldest first (at most total); each client's, least recently recorded first.
    calls: deque[float] = field(default_factory=deque, init=False)
    clients: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict, init=False)

    def wait(self, client: str) -> float | None:
        """Seconds until ``client`` may call, or None if it may now (nothing is recorded)."""
        now = self.clock()
        mine = self._forget_before(now - WINDOW_S, client)
        waits = []
        if len(mine) >= self.per_client:
            waits.append(mine[0] + WINDOW_S - now)
        if len(self.calls) >= self.total:
            waits.append(self.calls[0] + WINDOW_S - now)
        return max(waits) if waits else None

    def admit(self, client: str) -> float | None:
        """Record a call now and return None, or return the seconds until one would be admitted."""
        wait = self.wait(client)
        if wait is not None:
            return wait
        now = self.clock()
        self.calls.append(now)
        self.clients.setdefault(client, deque()).append(now)
        self.clients.move_to_end(client)
        return None

    def _forget_before(self, since: float, client: str) -> deque[float]:
        """Drop the calls that left the window; ``client``'s calls still in it."""
        while self.calls and self.calls[0] <= since:
            self.calls.popleft()
        # Ordered by last recorded call: a client whose last call left the window is forgotten.
        while self.clients and next(iter(self.clients.values()))[-1] <= since:
            self.clients.popitem(last=False)
        mine = self.clients.get(client, deque())
        while mine and mine[0] <= since:
            mine.popleft()
        if not mine:  # an emptied entry must not stay: the loop above reads each entry's last call
            self.clients.pop(client, None)
        return mine


ANALYZE_ROUTE = "/analyze"


def analyze_guard(settings: Settings) -> RateGuard:
    """The /analyze guard of one front worker: each call spends the operator's Groq quota."""
    return RateGuard(
        settings.analyze_per_minute,
        share(settings.analyze_total_per_minute, settings.front_workers),
        "FASTINFER_ANALYZE_PER_MINUTE, FASTINFER_ANALYZE_TOTAL_PER_MINUTE",
    )


def share(total: int, workers: int) -> int:
    """One front worker's part of a total limit: each worker counts alone (no shared state), so the
    total is divided among them — at least 1 each, so that more workers than the total still admit."""
    return max(1, total // max(1, workers))


@dataclass(eq=False)
class Access:
    """The front's access check: keys first, then the per-route rate guards (POST only)."""

    keys: ApiKeys
    guards: Mapping[str, RateGuard] = field(default_factory=dict)  # route → its guard

    def check(self, scope: Scope) -> Refusal | None:
        """None to go on, or the answer instead: 401, or 429 from a guard whose window is full. A guarded
        request's client is noted in the scope's state, for :func:`spend`."""
        path = scope["path"]
        if is_open(path):
            return None
        client = self.keys.client(scope) if self.keys.enabled else None
        if isinstance(client, Refusal):
            return client
        guard = self.guards.get(path) if scope.get("method") == "POST" else None
        if guard is None:
            return None
        client = client or _peer(scope)
        wait = guard.wait(client)
        if wait is not None:
            return rate_limited(guard, path, wait)
        scope.setdefault("state", {})[GUARDED] = (guard, client, path)
        return None


GUARDED = "fastinfer_guarded"


def spend(scope: Scope) -> Refusal | None:
    """Record a guarded call just before it spends (calls Groq); the refusal if calls meanwhile filled the window."""
    guarded = scope.get("state", {}).pop(GUARDED, None)
    if guarded is None:  # not through the front (an in-process call): no guard
        return None
    guard, client, path = guarded
    wait = guard.admit(client)
    return None if wait is None else rate_limited(guard, path, wait)


def rate_limited(guard: RateGuard, path: str, wait: float) -> Refusal:
    retry = max(1, math.ceil(wait))
    message = (
        f"{path} is limited to {guard.per_client} calls per client and {guard.total} in all per minute "
        f"({guard.settings}); retry in {retry} s."
    )
    return Refusal(429, error_body("rate_limited", message), [(b"retry-after", str(retry).encode())])


def _peer(scope: Scope) -> str:
    """The client's address as the server reports it. uvicorn rewrites it from X-Forwarded-For when
    the connection comes from a proxy it trusts (127.0.0.1 and ::1 by default; FORWARDED_ALLOW_IPS)."""
    client = scope.get("client")
    return f"address-{client[0]}" if client else "address-unknown"
