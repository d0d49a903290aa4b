"""Typed inputs of the APIs as BentoML declares them (the spec, Swagger's forms, ``bentoml.SyncHTTPClient``);
over HTTP the image APIs are parsed by fastinfer/front/image_api.py, with the same limits.

BentoML logs a client's invalid input as a server error and answers a multipart body it cannot parse 500:
:func:`quiet_input_errors` makes the first an INFO line, :class:`AnalyzeInput` the second a 400.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from bentoml import IODescriptor  # BentoML's base for typed API inputs
from bentoml.exceptions import BadInput, BentoMLException
from pydantic import Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request

from fastinfer.catalog.choice import default_choice
from fastinfer.catalog.config import BACKENDS, get_settings
from fastinfer.common.schemas import TOP_K_MAX
from fastinfer.compat.bentoml import API_ERROR_LOGGER

BackendName = Literal[BACKENDS]  # type: ignore[valid-type]  # rendered as an enum in Swagger
TopK = Annotated[
    int,
    Field(
        ge=1,
        le=TOP_K_MAX,
        description=f"how many classes to return (1..{TOP_K_MAX}, and at most the served family's class count; "
        "unsent over HTTP: 5, or every class of a family with fewer)",
    ),
]
ImageFile = Annotated[
    Path,
    Field(description="the image file (JPEG, PNG, GIF, WebP, BMP, TIFF ...); the field may also be named `file`"),
]


def _default_backend() -> str:
    return default_choice().backend


class ImageInput(IODescriptor):
    image: ImageFile
    top_k: TopK = 5


class ClassifyInput(ImageInput):
    backend: BackendName = Field(default_factory=_default_backend)


class CompareInput(ImageInput):
    pass


class BatchInput(IODescriptor):
    images: list[Path] = Field(
        min_length=1,
        max_length=get_settings().max_batch_images,
        description="the images, one `images` part each (1..FASTINFER_MAX_BATCH_IMAGES, default 32)",
    )
    backend: BackendName = Field(default_factory=_default_backend)
    top_k: TopK = 5


class AnalyzeInput(IODescriptor):
    """Prediction results to explain: /classify responses or /compare's ``results`` (no images)."""

    results: list[dict[str, Any]] = Field(min_length=1, max_length=20)
    question: str = Field(default="", max_length=500, description="optional focus for the explanation")

    @classmethod
    async def from_http_request(cls, request: Request, serde: Any) -> IODescriptor:
        try:
            return await super().from_http_request(request, serde)
        except (HTTPException, MultiPartException) as exc:  # Starlette's form parser: e.g. no boundary
            if isinstance(exc, HTTPException) and exc.status_code >= 500:
                raise
            said = exc.detail if isinstance(exc, HTTPException) else exc.message
            raise BadInput(f"The request body cannot be read: {said}") from exc  # BentoML answers 400
        except UnicodeDecodeError as exc:  # a multipart part that is not text (BentoML json.loads it)
            raise BadInput("A field of the request is not UTF-8 text.") from exc


_INPUT_MODELS = frozenset(c.__name__ for c in (ImageInput, ClassifyInput, CompareInput, BatchInput, AnalyzeInput))


def _client_mistake(exc: BaseException | None) -> str | None:
    """What was wrong with a client's input, in one line, if ``exc`` says so (never the input itself)."""
    if isinstance(exc, ValidationError) and exc.title in _INPUT_MODELS:  # not an output's: that is ours
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        said = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in errors[:3])
        return f"{exc.error_count()} validation error(s): {said}"[:300]
    if isinstance(exc, BentoMLException) and exc.error_code < 500:
        return str(exc)[:300]
    return None


class _InputErrorsQuiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        said = _client_mistake(record.exc_info[1] if record.exc_info else None)
        if said is not None:  # "Exception on /analyze [POST]" + a traceback → one INFO line, answered 4xx
            where = record.getMessage().removeprefix("Exception on ")
            record.msg, record.args = "invalid input to %s, answered 4xx: %s", (where, said)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_input_errors() -> None:
    """Log a client's invalid input to a BentoML API as one INFO line (what was wrong), not as a server
    error with a traceback. Idempotent."""
    logger = logging.getLogger(API_ERROR_LOGGER)
    if not any(isinstance(f, _InputErrorsQuiet) for f in logger.filters):
        logger.addFilter(_InputErrorsQuiet())
