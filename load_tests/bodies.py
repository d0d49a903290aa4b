"""Request bodies the benchmark sends, encoded once and shared by every client: all send the same bytes."""

from __future__ import annotations

import uuid


def multipart(data: bytes | list[bytes], fields: dict[str, str], name: str = "image") -> tuple[bytes, str]:
    """A multipart body and its Content-Type: the form ``fields``, then one file part named ``name`` per image."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    ]
    for i, image in enumerate([data] if isinstance(data, bytes) else data):
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="photo{i}.jpg"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n".encode()
            + image
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"
