"""What FastInfer uses of BentoML beyond its public API, in one place. Written against bentoml==1.4.40.

Where a public setting does the job it is used instead (service.py's ``@bentoml.service`` settings); what remains
has no public equivalent. Assumptions, one test each (tests/unit/test_compat_bentoml.py):

1. fastinfer/front/openapi.py edits the spec BentoML generates, so it builds with BentoML's own spec classes
   and tags: ``APP_TAG``, ``INFRA_TAG`` (``bentoml._internal.service.openapi``) and ``Contact``,
   ``OpenAPISpecification``, ``PathItem``, ``Tag`` (``…openapi.specification``), and makes the spec object
   from its JSON form as BentoML reads a spec file (``bentoml_cattr.structure``: :func:`openapi_spec`).
2. ``server_context.service_type`` is ``"service"`` in the workers of a dependency (a runner) only: BentoML's
   worker (``_bentoml_impl.worker.service``) sets it so when its ``--service-name`` names a dependency.
3. A failed API call is logged, with its traceback, to the logger :data:`API_ERROR_LOGGER` (``log_exception``).
4. ``bentoml serve`` reads the Prometheus directory from ``BentoMLContainer.prometheus_multiproc_dir``
   (``ensure_prometheus_dir``): no setting or variable names it.
5. ``BentoMLContainer.config`` holds the configuration as a dict: ``tracing`` (``sample_rate``,
   ``exporter_type``) at its top and, where an operator sets them for one service, under
   ``services.<name>.tracing``.
6. A worker's command line is ``python -m _bentoml_impl.worker.service <bento> --service-name <name> --fd <n>``
   (``--fd``: the socket circus hands it).
7. An API's typed input is parsed by the classmethod ``IODescriptor.from_http_request(request, serde)``
   (fastinfer/front/api_inputs.py overrides it).
8. ``Service.dependencies`` maps each attribute set to ``bentoml.depends(...)`` to it; its ``on`` is the service
   (service.py's /readyz asks each runner).
9. ``bentoml.SyncHTTPClient`` reads an answer by ``/schema.json``'s output schema: an ``anyOf`` as its first choice,
   a ``oneOf`` as sent (so fastinfer/common/schemas.py's BatchResponse says oneOf, and its error items arrive).
10. A bento holds its code in ``src/`` beside ``bento.yaml``, whose ``services`` list names each service of the graph
    it was built with; served, BentoML stops (``on_load_bento``: StopIteration) if the graph names one more.
11. ``bentoml.models.get`` reads ``BentoMLContainer.model_store``, a store whose folder is its ``_path``: a served
    bento's own in a container, else ``$BENTOML_HOME/models``. A model's record is ``<folder>/<name>/<version>/
    model.yaml``, and ``<folder>/<name>/latest`` names the latest version.
12. A model's record is parsed by ``yaml.safe_load``, looked up on ``bentoml._internal.models.model``'s global
    ``yaml`` (``ModelInfo.from_yaml_file``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
from bentoml import server_context
from bentoml._internal.service.openapi import APP_TAG, INFRA_TAG
from bentoml._internal.service.openapi.specification import Contact, OpenAPISpecification, PathItem, Tag

__all__ = ["APP_TAG", "INFRA_TAG", "Contact", "OpenAPISpecification", "PathItem", "Tag", "server_context"]

API_ERROR_LOGGER = "bentoml._internal.server.http_app"
WORKER_MODULE = "_bentoml_impl.worker"


def openapi_spec(doc: dict[str, Any]) -> OpenAPISpecification:
    """BentoML's spec object from its JSON form, as ``OpenAPISpecification.from_yaml_file`` makes it, but for its
    components, kept as JSON (BentoML's class has no ``securitySchemes``)."""
    from bentoml._internal.utils.cattr import bentoml_cattr

    spec = bentoml_cattr.structure({**doc, "components": None}, OpenAPISpecification)
    return attrs.evolve(spec, components=doc["components"])


def in_dependency() -> bool:
    """Whether this process is a worker of a dependency service (a runner), not of the entry service."""
    return server_context.service_type == "service"


def set_prometheus_dir(path: str) -> None:
    """The Prometheus directory ``bentoml serve`` prepares and hands its workers; call before it does."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    BentoMLContainer.prometheus_multiproc_dir.set(path)


def configuration() -> Any:
    """BentoML's configuration, as its processes see it."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    return BentoMLContainer.config.get()


def model_store_dir() -> Path:
    """The folder ``bentoml.models.get`` reads models from."""
    from bentoml._internal.configuration.containers import BentoMLContainer

    return Path(BentoMLContainer.model_store.get()._path)


def read_records_with_libyaml() -> None:
    """BentoML's records parsed by libyaml's loader (assumption 12), where PyYAML has it: the same dict, in 2 ms
    instead of the pure-Python loader's 23 ms for a 15 KB model.yaml (its 1,000 class names). Every lookup and
    every ``bentoml.models.list`` pays it: 29 CPU-s of a test run, about 0.2 s of each server process's start."""
    import yaml
    from bentoml._internal.models import model

    if yaml.__with_libyaml__ and model.yaml is yaml:
        model.yaml = SimpleNamespace(**{**vars(yaml), "safe_load": partial(yaml.load, Loader=yaml.CSafeLoader)})


def worker_service(cmdline: Sequence[str]) -> str | None:
    """The service a ``bentoml serve`` worker serves, from its command line: its ``--service-name``, "" when
    it names none (a one-service server), None for a process that is no worker (the supervisor, others)."""
    if not any(WORKER_MODULE in part for part in cmdline):
        return None
    return _option(cmdline, "--service-name") or ""


def socket_fd(argv: Sequence[str]) -> int | None:
    """The descriptor of the socket this worker serves (circus passes it as ``--fd N``), if any."""
    given = _option(argv, "--fd")
    return int(given) if given is not None and given.isdigit() else None


def _option(cmdline: Sequence[str], name: str) -> str | None:
    return cmdline[list(cmdline).index(name) + 1] if name in cmdline[:-1] else None


def bento_services(source: str | None, service: str) -> set[str] | None:
    """The services of the bento whose ``src/`` holds the file ``source`` and whose graph has ``service``
    (assumption 10); None outside a bento. A bento.yaml there that BentoML did not write stops start-up."""
    import yaml

    code = Path(source).resolve().parent if source else None
    if code is None or code.name != "src" or not (built := code.parent / "bento.yaml").is_file():
        return None
    try:
        names = {entry["name"] for entry in yaml.safe_load(built.read_text(encoding="utf-8"))["services"]}
    except (yaml.YAMLError, TypeError, KeyError, AttributeError, OSError, ValueError, RecursionError) as exc:
        raise SystemExit(
            f"fastinfer: {built} is not a bento.yaml BentoML wrote ({type(exc).__name__}: {exc})"[:500]
        ) from None
    return names if service in names else None
