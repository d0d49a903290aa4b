"""Response models of the GET routes mounted beside the typed BentoML APIs, for the OpenAPI spec: BentoML knows
nothing of what plain Starlette routes answer.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class CacheStatsResponse(BaseModel):
    """The response cache as this front worker sees it (counts are per worker)."""

    mode: str = Field(
        description="redis (its URL, never the password) | memory | off, or the fallback taken at start-up"
    )
    healthy: bool = Field(
        description="false while the cache is failing or refusing writes (requests are served without what fails)"
    )
    degraded: str | None = Field(
        default=None,
        description="while unhealthy, why: '<mode> GET|SET failed: ...' (an outage: the cache is skipped for a "
        "moment) and/or 'writes refused: ...' (Redis answers but will not store, e.g. OOM, READONLY: "
        "reads go on)",
    )
    hits: int = Field(ge=0)
    misses: int = Field(ge=0)
    errors: int = Field(ge=0, description="lookups that failed or skipped a failing cache")
    invalid: int = Field(ge=0, description="entries found but ignored because they did not validate")
    bypasses: int = Field(ge=0, description="requests sent with Cache-Control: no-cache (or Pragma: no-cache)")
    writes_refused: int = Field(
        ge=0, description="answers not stored because the cache refuses writes (full, read-only), or backing off"
    )
    write_errors: int = Field(ge=0, description="answers not stored because the cache failed")
    too_large: int = Field(
        ge=0, description="answers not stored: larger than a read accepts (a model stored outside the build's bounds)"
    )
    signed: bool = Field(description="entries carry an HMAC and are served only when it is valid")
    hit_rate: float = Field(ge=0.0, le=1.0, description="hits / (hits + misses + errors): every lookup tried")
    keys: int | None = Field(default=None, description="entries in the cache (null when it cannot be counted)")
    since: str = Field(description="UTC time the counts start from, ISO 8601")


class LiveStatsResponse(BaseModel):
    """Recent traffic of this front worker, as the dashboard's live panel shows it."""

    served: int = Field(ge=0, description="classification requests answered (a /classify/batch request counts once)")
    images: int = Field(ge=0, description="images those requests held")
    cached: int = Field(ge=0, description="of those images, answered by the response cache")
    since: str = Field(description="UTC time the counts start from, ISO 8601")
    p50_ms: dict[str, float] = Field(
        description="backend → median total latency of its recent requests that were not cache hits"
    )
    window: int = Field(description="how many recent requests per backend the medians cover")
    cache: CacheStatsResponse
