"""The API page: what ``/`` shows about FastInfer, and the text of the spec's ``info``.

BentoML's own are placeholders, and its page loads Google Tag Manager from the internet. :func:`info` is the
spec's title, version, contact and description (``api_page.md``); :class:`ApiPage` answers ``GET /`` with
Swagger UI from BentoML's static files, under a Content-Security-Policy that keeps the page to this server.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bentoml
from starlette.types import ASGIApp, Receive, Scope, Send

from fastinfer import __version__
from fastinfer.catalog import family
from fastinfer.catalog.backends import BACKENDS, served_models, unavailable_reason
from fastinfer.catalog.choice import configuration, default_choice
from fastinfer.catalog.config import Settings
from fastinfer.common.schemas import TOP_K_MAX
from fastinfer.compat.bentoml import server_context
from fastinfer.front.access import analyze_guard

TITLE = "FastInfer"
PAGE = Path(__file__).with_name("api_page.md")  # also the bento's README (bentofile.yaml)
PAGE_TEXT = PAGE.read_text(encoding="utf-8").rstrip()  # read once, at import


def info(settings: Settings, svc: bentoml.Service[Any]) -> dict[str, Any]:
    """The spec's ``info``: FastInfer's name, version, contact, and the API page's text; in a running
    server also what it is set to (not in ``bentoml build``'s copy: that would describe the builder)."""
    page = PAGE_TEXT
    if serving():
        page += "\n\n" + this_server(settings, svc)
    return {
        "title": TITLE,
        "version": version(svc),
        "contact": dict(settings.contact) or {"name": TITLE},
        "description": page + "\n",
    }


def serving() -> bool:
    """Whether this process is a worker of ``bentoml serve`` (BentoML sets its worker index)."""
    return server_context.worker_index is not None


def version(svc: bentoml.Service[Any]) -> str:
    """FastInfer's version, and the bento's when the service runs from a built bento."""
    bento = getattr(svc, "bento", None)
    return f"{__version__} (bento {bento.tag})" if bento is not None else __version__


def this_server(settings: Settings, svc: bentoml.Service[Any]) -> str:
    """What this server is set to, in the terms the page uses (from the settings it runs with)."""
    guard = analyze_guard(settings)
    keys = (
        "required. Send yours as `Authorization: Bearer <key>`: the examples under each API do, from "
        '`export FASTINFER_API_KEY=<your key>`; add `-H "Authorization: Bearer $FASTINFER_API_KEY"` to the '
        "commands above, or press Authorize here"
        if settings.api_keys
        else "not required: anyone who reaches this port may call every API"
    )
    analysis = "configured" if settings.groq.api_key else "not configured (503 `analysis_unavailable`)"
    chosen = default_choice()
    default = f"default backend {chosen.describe()}"
    if (why := unavailable_reason(chosen.backend)) is not None:  # requests without `backend` get 503
        default += f", which cannot run here: {why}"
    workers = settings.front_workers
    in_all = f"{guard.total} in all per minute" + (
        f" per front worker ({workers} workers: up to {guard.total * workers} in all)" if workers > 1 else ""
    )
    tuned = settings.tuned or {}
    tuning = {
        "in force": f"the tuned configuration is in force ({literal(str(tuned.get('path')))}, "
        f"{literal(str(tuned.get('created')))}, goal {literal(str(tuned.get('goal')))}); `GET /backends` says "
        "where each value came from",
        # its reason quotes the file's own keys and values: shown as written, never as Markdown
        "ignored": f"the tuned configuration {literal(str(tuned.get('path')))} is ignored: "
        f"{literal(str(tuned.get('why')))}",
    }.get(tuned.get("status", ""), "no tuned configuration (`fastinfer tune` measures one): defaults and rules")
    values = ", ".join(
        f"`{name}` {literal(entry['value'])} ({entry['source']})"
        for name, entry in configuration(settings, chosen).items()
    )
    off = [name for name in BACKENDS if name not in settings.backends]
    served = (
        f"serves {', '.join(f'`{n}`' for n in settings.backends)}; switched off by `FASTINFER_BACKENDS` (503): "
        + ", ".join(f"`{n}`" for n in off)
        if off
        else "every backend switched on (`FASTINFER_BACKENDS` unset); `GET /backends` says which can run here"
    )
    lines = [
        f"- FastInfer {version(svc)}; {default}.",
        f"- Backends: {served}.",
        f"- {family_line(family.summary(settings.model, served_models()))}.",
        f"- Configuration: {tuning}.",
        f"- Its values and where each came from: {values}.",
        f"- API keys: {keys}.",
        f"- Uploads up to {settings.max_bytes:,} bytes (`FASTINFER_MAX_BYTES`) and {settings.max_pixels:,} pixels "
        f"(`FASTINFER_MAX_PIXELS`); up to {settings.max_batch_images} images per batch "
        "(`FASTINFER_MAX_BATCH_IMAGES`).",
        f"- `/analyze`: {analysis}; {guard.per_client} calls per client and {in_all}.",
        f"- Contact: {contact_line(settings.contact)}.",
    ]
    return "## This server\n\n" + "\n".join(lines)


def family_line(served: family.FamilyInfo) -> str:
    """The family this server serves, as a line of the page: name, classes, weights, measured accuracy.
    Its description and the reason it is missing are shown as written (a user's text, a path)."""
    name = f"`{literal(served.name)}`"
    if not served.stored:
        return f"Model family {name}: not served: {literal(served.missing or '')}"
    line = (
        f"Model family {name} (`FASTINFER_MODEL`): {served.num_classes} classes, `top_k` up to "
        f"{min(served.num_classes or TOP_K_MAX, TOP_K_MAX)}; weights: {literal(served.weights_line())}"
    )
    measured = served.accuracy_line()
    return line + (f"; accuracy measured when built: {literal(measured)}" if measured else "; accuracy not measured")


def literal(text: str) -> str:
    """``text`` shown as written on one line, not as Markdown or HTML."""
    return re.sub(r"([\\`*_\[\]<>|#&])", r"\\\1", " ".join(text.split()))  # &: "&lt;" is an entity


def contact_line(contact: dict[str, str]) -> str:
    """FASTINFER_CONTACT as a line of the page (Swagger UI shows ``info.contact`` only with a link)."""
    name = literal(contact.get("name", ""))
    if "url" in contact:
        return f"[{name}](<{contact['url']}>)"
    if "email" in contact:
        return f"{name}, [{contact['email']}](<mailto:{contact['email']}>)"
    if name:
        return name
    return "none set (`FASTINFER_CONTACT` names who answers for this server)"


# Swagger UI over ./docs.json, from BentoML's static files: BentoML's page but for its title, its index.css (which
# hides the title) and validatorUrl (left unset, Swagger UI sends the spec's address to validator.swagger.io
# whenever the page is not on localhost/127.0.0.1).
INDEX_HTML = Path(__file__).with_name("api_page.html").read_bytes()
INITIALIZER = INDEX_HTML.decode().split("<script>")[1].split("</script>")[0]  # its one inline script


def script_hash(script: str) -> str:
    """The base64 sha256 of an inline script's text, as a Content-Security-Policy names it."""
    return base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


def content_security_policy(
    inline_scripts: Sequence[str] = (), *, inline_styles: bool = False, images: Sequence[str] = ()
) -> str:
    """A Content-Security-Policy that keeps a page to this server; inline scripts only those in
    ``inline_scripts`` (by their sha256, so an injected one never runs); ``images``: more image sources."""
    scripts = "".join(f" 'sha256-{script_hash(script)}'" for script in inline_scripts)
    styles = " 'unsafe-inline'" if inline_styles else ""
    more_images = "".join(f" {source}" for source in images)
    return (
        f"default-src 'self'; script-src 'self'{scripts}; style-src 'self'{styles}; img-src 'self'{more_images}; "
        "connect-src 'self'; frame-ancestors 'self'; base-uri 'self'; form-action 'self'"
    )


# Inline styles and data: images: Swagger UI sets them (its icons).
CONTENT_SECURITY_POLICY = content_security_policy([INITIALIZER], inline_styles=True, images=["data:"])


class ApiPage:
    """ASGI middleware: ``GET /`` is FastInfer's API page (Swagger UI over ``/docs.json``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(INDEX_HTML)).encode()),
            (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": INDEX_HTML if scope["method"] == "GET" else b""})
