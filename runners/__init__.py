"""The serving side of the backend table (fastinfer/catalog/backends.py): one ``@bentoml.service`` per row
that owns a runner (runners/base.py); :func:`attach` gives the front a ``bentoml.depends`` per runner that
can run here. Backends may share a runner: ``coreml`` is ``coreml-batched`` called without batching.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TypeVar

import bentoml

from fastinfer.catalog.backends import RUNNERS, SPECS, BackendSpec, runs_here
from fastinfer.catalog.backends import unavailable_reason as unavailable_reason
from fastinfer.catalog.choice import placement
from fastinfer.catalog.config import get_settings
from fastinfer.compat import bentoml as bentoml_compat
from runners.base import make_runner


def attribute(runner: str) -> str:
    """The front service's attribute that holds a runner (``bentoml.depends``)."""
    return runner.replace("-", "_")


@dataclass(frozen=True)
class Backend:
    spec: BackendSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def runner(self) -> str:
        return attribute(self.spec.runner_name)

    def method(self, batched: bool | None = None) -> str:
        """``infer_batched`` when batching is on for this backend (or forced), else ``infer``."""
        on = get_settings().batching_for(self.name).enabled if batched is None else batched
        return "infer_batched" if on else "infer"


REGISTRY: dict[str, Backend] = {name: Backend(spec) for name, spec in SPECS.items()}
F = TypeVar("F", bound=type)
SERVICES = {runner: make_runner(runner) for runner in RUNNERS}


def attach(front: F) -> F:
    """Class decorator for the front, under ``@bentoml.service``: depend on every runner that runs here
    (others are not started: their backends answer 503 with the reason), but those whose engine the front worker
    holds (``front.engines_in_front``, engines_in_front)."""
    placed = placement(get_settings())
    module_file = getattr(sys.modules.get(front.__module__), "__file__", None)
    if (built := bentoml_compat.bento_services(module_file, "fastinfer")) is not None:
        # Served from a bento: a runner its graph was built without cannot start, so its engine is held here.
        lacking = {runner for runner in RUNNERS if runs_here(runner) and f"runner-{runner}" not in built}
        placed = (placed[0] | lacking, placed[1] if lacking <= placed[0] else "bento")
    front.engines_in_front = placed  # type: ignore[attr-defined]  # what the front loads, and its workers are told
    in_front = placed[0]
    for runner, service in SERVICES.items():
        if runs_here(runner) and runner not in in_front:
            setattr(front, attribute(runner), bentoml.depends(service))
        elif runner in in_front:
            # Not in the service graph, so `bentoml build` packs its models only through the front's attributes.
            for i, model in enumerate(service.models):
                setattr(front, f"{attribute(runner)}_model_{i}", model)
    return front
