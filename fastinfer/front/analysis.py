"""AI analysis of prediction results with Groq: a short explanation of the answer and the latency trade-offs.
Only the results travel, never the image, and the API key never appears in a log or a response.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

from fastinfer.catalog.config import GroqConfig
from fastinfer.common.errors import ApiError
from fastinfer.common.schemas import AnalyzeResponse
from fastinfer.front.access import spend

if TYPE_CHECKING:
    import bentoml

logger = logging.getLogger("fastinfer.analysis")

SYSTEM_PROMPT = (
    "You explain the output of FastInfer, a service that classifies images with ResNet-50 on several "
    "inference backends (PyTorch, ONNX Runtime FP32, INT8, CoreML). Given JSON results, explain in at most "
    "150 words: what the model predicted and how confident it is; whether the backends agree; and the "
    "latency trade-offs between them, naming the stage (decode, preprocess, inference) that dominates. "
    "If weights is 'random-init', say plainly that the predictions are meaningless. Do not invent numbers."
)


class GroqUnavailable(ApiError):
    status, code = 503, "analysis_unavailable"


class GroqFailed(ApiError):
    status, code = 502, "analysis_failed"


class GroqTimeout(ApiError):
    status, code = 504, "analysis_timeout"


# What may be sent: the fields of a classification result, nothing else (no bytes, no paths).
TEXT_MAX = 100  # characters of any text field sent (labels are ~30, model tags ~40)
MAX_NUMBER = 1e12  # beyond any score or timing in ms; NaN compares false, so it is left out too
STAGES = ("read", "cache", "decode", "preprocess", "inference", "total")  # timings_ms keys worth sending


def sanitise(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Only result fields, each of its type and bounded (text to TEXT_MAX, top-k to 5, timings to the known stages):
    each call spends Groq tokens, so a prompt stays a few KB whatever a client sends."""
    return [_result(r) for r in results if isinstance(r, dict)]


def _result(result: dict[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {}
    for key in ("class", "backend", "model", "weights"):
        if isinstance(result.get(key), str):
            item[key] = result[key][:TEXT_MAX]
    if _number(result.get("confidence")):
        item["confidence"] = result["confidence"]
    if isinstance(result.get("cached"), bool):
        item["cached"] = result["cached"]
    if isinstance(result.get("top_k"), list):
        item["top_k"] = [
            {"label": str(p.get("label", ""))[:TEXT_MAX], "score": p["score"] if _number(p.get("score")) else None}
            for p in result["top_k"][:5]
            if isinstance(p, dict)
        ]
    if isinstance(result.get("timings_ms"), dict):
        item["timings_ms"] = {k: v for k, v in result["timings_ms"].items() if k in STAGES and _number(v)}
    return item


def _number(value: Any) -> bool:
    """A number JSON can carry and a prompt can afford: not NaN or ±Infinity (json.loads accepts them, and
    json.dumps would write them into the prompt as they came), nor an integer of thousands of digits."""
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= MAX_NUMBER


def messages(results: list[dict[str, Any]], question: str) -> list[dict[str, str]]:
    user = "Results:\n" + json.dumps(sanitise(results), indent=1)
    if question.strip():
        user += f"\n\nThe user asks: {question.strip()}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


async def analyze(results: list[dict[str, Any]], question: str, config: GroqConfig) -> AnalyzeResponse:
    if not config.api_key:
        raise GroqUnavailable(
            "AI analysis is off: set GROQ_API_KEY or GROQ_API_KEY_FILE (and restart the service) to enable it."
        )
    import groq

    client = groq.AsyncGroq(api_key=config.api_key, base_url=config.base_url, timeout=config.timeout_s, max_retries=0)
    try:
        completion = await client.chat.completions.create(
            model=config.model, messages=messages(results, question), temperature=0.2, max_tokens=400
        )
    except groq.APITimeoutError as exc:
        raise GroqTimeout(f"Groq did not answer within {config.timeout_s:g} s.") from exc
    except groq.APIStatusError as exc:
        logger.warning("groq answered %s", exc.status_code)  # the message may echo request data: not logged
        raise GroqFailed(f"Groq answered HTTP {exc.status_code}; try again later.") from exc
    except groq.APIError as exc:
        logger.warning("groq request failed: %s", type(exc).__name__)
        raise GroqFailed(f"Groq could not be reached ({type(exc).__name__}).") from exc
    finally:
        await client.close()
    text = (completion.choices[0].message.content or "").strip() if completion.choices else ""
    if not text:
        raise GroqFailed("Groq returned an empty answer.")
    return AnalyzeResponse(text=text, model=completion.model or config.model)


async def answer(
    results: list[dict[str, Any]], question: str, config: GroqConfig, ctx: bentoml.Context
) -> AnalyzeResponse | JSONResponse:
    """POST /analyze's answer, its input valid: the call recorded against the route's guard just before Groq is
    called, then :func:`analyze`; a refusal or an ApiError is answered in the error shape."""
    if config.api_key:  # Groq will be called
        with contextlib.suppress(LookupError):  # an in-process call has no request, and no guard
            if (refusal := spend(ctx.request.scope)) is not None:
                ctx.response.status_code = refusal.status
                headers = {k.decode(): v.decode() for k, v in refusal.headers}
                return JSONResponse(refusal.body, status_code=refusal.status, headers=headers)
    try:
        return await analyze(results, question, config)
    except ApiError as exc:
        ctx.response.status_code = exc.status
        return JSONResponse(exc.body(), status_code=exc.status)
