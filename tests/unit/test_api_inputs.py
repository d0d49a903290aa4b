"""A client's invalid input to a BentoML API (/analyze) is a 4xx and one INFO line, not a server error:
BentoML's ``log_exception`` logs every failed call at ERROR with its traceback
(bentoml/_internal/server/http_app.py), and its multipart parse answered a body without its boundary 500."""

from __future__ import annotations

import asyncio
import logging

import pytest
from _bentoml_impl.serde import JSONSerde, MultipartSerde
from bentoml._internal.server.http_app import log_exception
from bentoml.exceptions import BadInput
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from fastinfer.front.api_inputs import AnalyzeInput, quiet_input_errors


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def bentoml_api_log() -> Records:
    logger = logging.getLogger("bentoml._internal.server.http_app")  # where log_exception writes
    records = Records()
    logger.addHandler(records)
    level, logger.level = logger.level, logging.DEBUG
    quiet_input_errors()
    quiet_input_errors()  # idempotent
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


def request(body: bytes, content_type: str) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/analyze",
        "headers": [(b"content-type", content_type.encode())],
    }
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def logged_from(error: BaseException) -> logging.LogRecord:
    """What BentoML's API wrapper logs when a call fails with ``error``, as it does it."""
    handler = logging.getLogger("bentoml._internal.server.http_app").handlers[-1]
    assert isinstance(handler, Records)
    try:
        raise error
    except BaseException:
        log_exception(request(b"", "application/json"))
    return handler.records[-1]


def parse(body: bytes, content_type: str, serde) -> BaseException:
    with pytest.raises(Exception) as raised:
        asyncio.run(AnalyzeInput.from_http_request(request(body, content_type), serde))
    return raised.value


def test_a_clients_invalid_input_is_one_info_line_without_a_traceback(bentoml_api_log: Records) -> None:
    for body in (b"{not json", b'{"results": "nope"}', b"[1, 2]", b""):
        error = parse(body, "application/json", JSONSerde())
        assert isinstance(error, ValidationError)
        record = logged_from(error)
        assert record.levelno == logging.INFO and record.exc_info is None and record.exc_text is None
        message = record.getMessage()
        assert message.startswith("invalid input to /analyze [POST], answered 4xx: 1 validation error(s): ")
        assert "\n" not in message and "nope" not in message  # what was wrong, never the input itself
    error = parse(b'{"results": "nope"}', "application/json", JSONSerde())
    assert "results: " in logged_from(error).getMessage()


def test_a_multipart_body_without_its_boundary_is_a_400_not_a_500(bentoml_api_log: Records) -> None:
    error = parse(b"x", "multipart/form-data", MultipartSerde())
    assert isinstance(error, BadInput) and error.error_code == 400  # BentoML answers 400 (500 before)
    assert "boundary" in str(error)
    record = logged_from(error)
    assert record.levelno == logging.INFO and record.exc_info is None


def test_the_servers_own_failures_keep_their_traceback(bentoml_api_log: Records) -> None:
    class AnalyzeResponse(BaseModel):  # an output that fails validation is the server's fault
        summary: str

    with pytest.raises(ValidationError) as output:
        AnalyzeResponse.model_validate({})
    for error in (output.value, RuntimeError("boom")):
        record = logged_from(error)
        assert record.levelno == logging.ERROR and record.exc_info is not None, error
