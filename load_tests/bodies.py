"""Request bodies the benchmark sends, encoded once and shared by every client: all send the same bytes."""

from __future__ import annotations

import httpx


def multipart(data: bytes | list[bytes], fields: dict[str, str], name: str = "image") -> tuple[bytes, str]:
    """A multipart body and its Content-Type: the form ``fields``, then one file part named ``name`` per image."""
    images = [data] if isinstance(data, bytes) else data
    files = [(name, (f"photo{i}.jpg", image, "image/jpeg")) for i, image in enumerate(images)]
    request = httpx.Request("POST", "http://localhost", data=fields, files=files)
    return request.read(), request.headers["Content-Type"]
