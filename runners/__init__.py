"""The serving side of the backend table: one runner service per runner-owning backend.

What a backend *is* (engine, models, platform, batching defaults) is its row in
fastinfer/catalog/backends.py. Here each row that owns a runner becomes a ``@bentoml.service``
(runners/base.py), and :func:`attach` gives the front one ``bentoml.depends`` per runner that
can run on this machine. Several backends may share a runner: ``coreml`` is the
``coreml-batched`` runner called without batching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import bentoml

from fastinfer.catalog.backends import RUNNERS, SPECS, BackendSpec, runs_here
from fastinfer.catalog.backends import unavailable_reason as unavailable_reason
from fastinfer.catalog.config import get_settings
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
    """Class decorator for the front, under ``@bentoml.service``: depend on every runner that runs here.

    A runner that cannot run here (CoreML off macOS, OpenVINO not installed) is not started at all;
    its backends answer 503 with the reason. Nor is one whose engine the front holds (FASTINFER_IN_FRONT).
    """
    in_front = get_settings().in_front
    for runner, service in SERVICES.items():
        if runs_here(runner) and runner not in in_front:
            setattr(front, attribute(runner), bentoml.depends(service))
        elif runner in in_front:
            # The front loads this engine itself, so `bentoml build` must still pack its models: BentoML
            # packs the models of the services in the graph, and this runner is not in it.
            for i, model in enumerate(service.models):
                setattr(front, f"{attribute(runner)}_model_{i}", model)
    return front
