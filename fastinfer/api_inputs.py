"""Typed inputs of the image APIs, with multipart parsing that cannot fail with a 5xx.

BentoML's multipart parser raises plain exceptions (→ 500) on some client mistakes — a
binary value in an unknown text field, for instance — and treats a *text* value in a file
field as a URL to download. Here every such mistake becomes a pydantic validation error on
the field concerned (→ 400 in our error shape), and nothing is ever fetched from a URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from _bentoml_sdk.io_models import IODescriptor  # BentoML's base for typed API inputs
from pydantic import Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError
from starlette.datastructures import UploadFile
from starlette.requests import Request

from fastinfer.config import BACKENDS, get_settings

BackendName = Literal[BACKENDS]  # type: ignore[valid-type]  # rendered as an enum in Swagger
TopK = Annotated[int, Field(ge=1, le=20, description="how many classes to return (1..20)")]
ImageFile = Annotated[Path, Field(description="the image file (JPEG, PNG, GIF, WebP, BMP, TIFF ...)")]


def field_error(field: str, kind: str, message: str, value: Any = None) -> ValidationError:
    detail = InitErrorDetails(type=PydanticCustomError(kind, message), loc=(field,), input=value)
    return ValidationError.from_exception_data("Input", [detail])


class GuardedInput(IODescriptor):
    """Checks the multipart form before BentoML's parser sees it."""

    @classmethod
    async def from_http_request(cls, request: Request, serde: Any) -> IODescriptor:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            try:
                form = await request.form()  # cached on the request: parsed once
            except OSError:  # e.g. no space left to spool a part: the server's trouble, not the client's
                raise
            except Exception as exc:
                raise field_error("body", "invalid_multipart", f"The multipart body is malformed: {exc}") from exc
            unknown = sorted(set(form) - set(cls.model_fields))
            if unknown:
                raise field_error(
                    "body",
                    "unknown_field",
                    f"Unknown form field(s) {', '.join(map(repr, unknown))}; "
                    f"this API takes {', '.join(cls.model_fields)}",
                )
            for name in cls.multipart_fields:
                for value in form.getlist(name):
                    if not isinstance(value, UploadFile):
                        raise field_error(name, "not_a_file", f"'{name}' must be a file upload, not a text field")
        try:
            return await super().from_http_request(request, serde)
        except (ValidationError, OSError):
            raise
        except Exception as exc:  # any other parser failure is about the request, not the server
            raise field_error("body", "unparsable", f"The request could not be parsed: {exc}") from exc


class ImageInput(GuardedInput):
    image: ImageFile
    top_k: TopK = 5


class ClassifyInput(ImageInput):
    backend: BackendName = Field(default_factory=lambda: get_settings().default_backend)


class CompareInput(ImageInput):
    pass


class AnalyzeInput(IODescriptor):
    """Prediction results to explain: /classify responses or /compare's ``results`` (no images)."""

    results: list[dict[str, Any]] = Field(min_length=1, max_length=20)
    question: str = Field(default="", max_length=500, description="optional focus for the explanation")
